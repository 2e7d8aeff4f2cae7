"""What pretraining did to the word embeddings: their norms, how much they share one direction (the mean vector, the
mean cosine of random pairs, the variance share of the top principal components), against the same architecture at
random initialisation (from the first model's config, seed 0).

    python -m benchmarks.probe_embeddings --model runs/pt600 --model runs/pt5940 \
        --out benchmarks/results/embeddings.json

Isotropic random embeddings have a mean cosine near 0 and a top component of about 1/d_model of the variance; a
shared direction (e.g. word frequency) shows as a large top component and a positive mean cosine, and adds the same
vector to every token a finetuned layer reads.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

import xlnet_lite
from benchmarks.environment import environment
from xlnet_lite.model_utils import load_model, model_from_config


def embedding_stats(weight: torch.Tensor, pairs: int = 20000) -> dict:
    weight = weight.detach().float()
    norms = weight.norm(dim=1)
    unit = weight / norms.clamp_min(1e-12)[:, None]
    generator = torch.Generator().manual_seed(0)
    i, j = torch.randint(0, len(weight), (2, pairs), generator=generator)
    keep = i != j
    shares = torch.linalg.svdvals(weight - weight.mean(0)) ** 2
    shares = shares / shares.sum()
    return {
        "tokens": len(weight),
        "norm_mean": norms.mean().item(),
        "norm_std": norms.std().item(),
        "mean_vector_norm": weight.mean(0).norm().item(),
        "mean_pair_cosine": (unit[i[keep]] * unit[j[keep]]).sum(1).mean().item(),
        "top1_variance_share": shares[0].item(),
        "top10_variance_share": shares[:10].sum().item(),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", required=True, help="A pretraining output folder (repeat).")
    parser.add_argument("--out", help="Write the results as JSON here.")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    models = {"random initialisation": model_from_config(args.model[0], xlnet_lite.XLNetLiteLMHeadModel)}
    models.update({path: load_model(path, xlnet_lite.XLNetLiteLMHeadModel) for path in args.model})
    rows = {name: embedding_stats(model.get_input_embeddings().weight) for name, model in models.items()}
    print("| model | norm (mean ± std) | mean vector norm | mean pair cosine | top-1 PC share | top-10 PC share |")
    print("|---|---|---|---|---|---|")
    for name, r in rows.items():
        print(
            f"| {name} | {r['norm_mean']:.3f} ± {r['norm_std']:.3f} | {r['mean_vector_norm']:.3f} | "
            f"{r['mean_pair_cosine']:.3f} | {r['top1_variance_share']:.3f} | {r['top10_variance_share']:.3f} |"
        )
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "command": "python -m benchmarks.probe_embeddings "
                    + " ".join(argv if argv is not None else sys.argv[1:]),
                    "environment": environment(),
                    "models": rows,
                },
                indent=2,
            )
            + "\n"
        )
    return rows


if __name__ == "__main__":
    main()
