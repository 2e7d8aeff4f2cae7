"""How much of the attention a flex_attention BlockMask could skip: the fraction of (query, key) tiles that XLNet's
perm_mask blocks whole, for the content stream (queries: the T positions; keys: the memory, never blocked, then the
T positions), on the pretraining collator's batches and on the random factorization masks `benchmarks.bench_gpu`
times. A BlockMask skips only tiles blocked whole; in every other tile its mask_mod is read score by score. Runs on
the CPU (no GPU needed). Defaults: the `base` preset's pretraining shapes (T 512, a 384-token memory, reuse 256,
P 85).

    python -m benchmarks.perm_mask_tiles [--batch 8] [--tiles 128 64] [--out F]
"""

import argparse
import json
import sys

import torch
import torch.nn.functional as F

from benchmarks import bench_model
from benchmarks.bench_gpu import CONFIGS
from xlnet_lite.collator import DataCollatorForXLNetPretraining
from xlnet_lite.modeling_xlnet_lite import content_stream_mask


def content_stream_blocked(perm_mask: torch.Tensor, mem_len: int) -> torch.Tensor:
    """(B, T, mem_len + T) bool: the keys each content-stream query may not see, as the model builds them from
    perm_mask (B, T, T; 1 = may not attend): the memory always visible, each position's own key re-opened."""
    T = perm_mask.shape[1]
    return content_stream_mask(F.pad(perm_mask.bool(), (mem_len, 0), value=False), qlen=T, mlen=mem_len)


def blocked_tile_fraction(perm_mask: torch.Tensor, mem_len: int, tile: int) -> float:
    """Fraction of tile x tile blocks of the content stream's (B, T, mem_len + T) mask (content_stream_blocked) that
    are blocked whole. T and mem_len + T must be multiples of tile."""
    T = perm_mask.shape[1]
    if T % tile or (mem_len + T) % tile:
        raise ValueError(f"T={T} and mem_len+T={mem_len + T} must be multiples of the tile {tile}")
    blocked = content_stream_blocked(perm_mask, mem_len)
    tiles = blocked.unfold(1, tile, tile).unfold(2, tile, tile)  # (B, T/tile, K/tile, tile, tile)
    return tiles.flatten(-2).all(-1).float().mean().item()


def collator_perm_mask(cfg: dict, seed: int = 0) -> torch.Tensor:
    """perm_mask of one pretraining-collator batch at cfg's shapes (B, T, P, reuse), on synthetic token ids."""
    batch = bench_model.make_batch(cfg, seed=seed)
    collator = DataCollatorForXLNetPretraining(
        tokenizer=bench_model._Tok(cfg["vocab_size"]),
        plm_probability=cfg["num_predict"] / cfg["seq_len"],
        reuse_len=cfg["reuse_len"],
        seed=seed,
    )
    examples = [
        dict(
            input_ids=batch["input_ids"][b].numpy(),
            token_type_ids=batch["token_type_ids"][b].numpy(),
            is_reversed=False,
        )
        for b in range(cfg["batch"])
    ]
    return collator(examples)["perm_mask"]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.perm_mask_tiles", description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tiles", type=int, nargs="+", default=[128, 64])
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    cfg = dict(CONFIGS["base"], batch=args.batch)
    masks = {
        "pretraining collator": collator_perm_mask(cfg),
        "bench_gpu's random factorization masks": bench_model.make_batch(cfg)["perm_mask"],
    }
    rows = []
    for name, perm_mask in masks.items():
        blocked_scores = content_stream_blocked(perm_mask, cfg["mem_len"]).float().mean().item()
        for tile in args.tiles:
            rows.append(
                dict(
                    masks=name,
                    tile=tile,
                    blocked_scores=blocked_scores,
                    blocked_tiles=blocked_tile_fraction(perm_mask, cfg["mem_len"], tile),
                )
            )
            print(
                f"{name}, {tile}x{tile} tiles: {rows[-1]['blocked_tiles']:.1%} blocked whole "
                f"({rows[-1]['blocked_scores']:.1%} of the scores blocked)"
            )
    if args.out:
        command = " ".join(["python -m benchmarks.perm_mask_tiles", *(sys.argv[1:] if argv is None else argv)])
        shapes = {k: cfg[k] for k in ("batch", "seq_len", "mem_len", "reuse_len", "num_predict")}
        with open(args.out, "w") as f:
            json.dump(dict(command=command, shapes=shapes, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
