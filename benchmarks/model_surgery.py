"""A copy of a pretrained XLNet-Lite folder with one part changed, to finetune from: where in the model does a short
pretraining hold finetuning back? Not part of the recipes: arms of the 20 Newsgroups benchmark.

    python -m benchmarks.model_surgery --model outputs/pretrain --all_but_the_top 2 --out runs/pt600_abtt2
    python -m benchmarks.model_surgery --model outputs/pretrain --redraw_layers 0 1 --out runs/pt600_redraw01

--all_but_the_top K: the word embeddings minus their common mean and their top K principal components (Mu &
Viswanath 2018): a short pretraining leaves every token's embedding sharing one direction, the frequency signal of a
model near the unigram plateau (`benchmarks.probe_embeddings`). --redraw_layers: those layers drawn afresh as a random
initialisation of the same config draws them (seed 0), everything else kept (`finetune/run_glue.py --reinit_layers`
redraws the top layers only). Writes what it did to surgery.json in the new folder and prints it.
"""

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

import xlnet_lite
from benchmarks.probe_embeddings import embedding_stats
from xlnet_lite.model_utils import model_from_config

KEY = "transformer.word_embedding.weight"


def all_but_the_top(weight, components):
    """weight (V, H) minus its mean row, then minus its projection on the top `components` principal directions."""
    centered = weight - weight.mean(0, keepdim=True)
    if components:
        _, _, v = torch.linalg.svd(centered.double(), full_matrices=False)
        top = v[:components].to(weight.dtype)  # (k, H)
        centered = centered - (centered @ top.t()) @ top
    return centered


def redrawn(src, layers):
    """The given layers' tensors from a random initialisation of the model's config (seed 0)."""
    torch.manual_seed(0)
    fresh = model_from_config(src, xlnet_lite.XLNetLiteLMHeadModel).state_dict()
    prefixes = tuple(f"transformer.layer.{i}." for i in layers)
    return {k: v for k, v in fresh.items() if k.startswith(prefixes)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model", required=True, help="a pretraining output folder (model.safetensors, config, tokenizer)"
    )
    parser.add_argument(
        "--all_but_the_top", type=int, metavar="K", help="remove the embeddings' mean and top K principal components"
    )
    parser.add_argument("--redraw_layers", type=int, nargs="+", metavar="I", help="layers (from 0) drawn afresh")
    parser.add_argument("--out", required=True, help="the new folder (must not exist)")
    args = parser.parse_args(argv)
    src, out = Path(args.model), Path(args.out)
    if (args.all_but_the_top is None) == (args.redraw_layers is None):
        parser.error("give one of --all_but_the_top or --redraw_layers")
    if not (src / "model.safetensors").is_file():
        parser.error(f"--model {src}: no model.safetensors there")
    if out.exists():
        parser.error(f"--out {out} exists: choose a new folder")
    state = load_file(src / "model.safetensors")
    if KEY not in state:
        parser.error(f"--model {src}: no {KEY} in model.safetensors")
    report = {"model": str(src)}
    if args.all_but_the_top is not None:
        before = embedding_stats(state[KEY])
        state[KEY] = all_but_the_top(state[KEY].float(), args.all_but_the_top).to(state[KEY].dtype).contiguous()
        report.update(all_but_the_top=args.all_but_the_top, before=before, after=embedding_stats(state[KEY]))
    else:
        fresh = redrawn(src, args.redraw_layers)
        missing = [i for i in args.redraw_layers if not any(k.startswith(f"transformer.layer.{i}.") for k in fresh)]
        if missing:
            parser.error(f"--redraw_layers {missing}: no such layer in {src}")
        state.update({k: v.to(state[k].dtype).contiguous() for k, v in fresh.items() if k in state})
        report.update(redraw_layers=args.redraw_layers, tensors=sorted(k for k in fresh if k in state))
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("checkpoints", "model.safetensors"))
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    (out / "surgery.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
