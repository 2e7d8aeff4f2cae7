"""A copy of a pretrained XLNet-Lite folder whose word embeddings have their common mean and their top principal
components removed ("all-but-the-top", Mu & Viswanath 2018), to finetune from.

    python -m benchmarks.postprocess_embeddings --model outputs/pretrain --components 2 --out runs/pt600_abtt2

A short pretraining leaves every token's embedding sharing one direction (the frequency signal of a model near the
unigram plateau: `benchmarks.probe_embeddings`); this removes it before finetuning, the rest of the model unchanged.
Prints the embeddings' statistics before and after. Not part of the recipes: an arm of the 20 Newsgroups benchmark.
"""

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

KEY = "transformer.word_embedding.weight"


def all_but_the_top(weight, components):
    """weight (V, H) minus its mean row, then minus its projection on the top `components` principal directions."""
    centered = weight - weight.mean(0, keepdim=True)
    if components:
        _, _, v = torch.linalg.svd(centered.double(), full_matrices=False)
        top = v[:components].to(weight.dtype)  # (k, H)
        centered = centered - (centered @ top.t()) @ top
    return centered


def stats(weight):
    mean = weight.mean(0)
    centered = weight - mean
    s = torch.linalg.svdvals(centered.double())
    share = (s**2 / (s**2).sum())
    return {"mean_norm": round(mean.norm().item(), 4), "token_norm": round(weight.norm(dim=1).mean().item(), 4),
            "top_component_share": round(share[0].item(), 4), "top10_share": round(share[:10].sum().item(), 4)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a pretraining output folder (model.safetensors, config, tokenizer)")
    parser.add_argument("--components", type=int, default=2, help="principal components removed after the mean")
    parser.add_argument("--out", required=True, help="the new folder (must not exist)")
    args = parser.parse_args(argv)
    src, out = Path(args.model), Path(args.out)
    if not (src / "model.safetensors").is_file():
        parser.error(f"--model {src}: no model.safetensors there")
    if out.exists():
        parser.error(f"--out {out} exists: choose a new folder")
    state = load_file(src / "model.safetensors")
    if KEY not in state:
        parser.error(f"--model {src}: no {KEY} in model.safetensors")
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("checkpoints", "model.safetensors"))
    before = stats(state[KEY].float())
    state[KEY] = all_but_the_top(state[KEY].float(), args.components).to(state[KEY].dtype).contiguous()
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    report = {"model": str(src), "components": args.components, "before": before, "after": stats(state[KEY].float())}
    (out / "postprocess_embeddings.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
