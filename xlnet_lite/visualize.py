"""Draw what XLNet may look at for one real pretraining sample.

    python -m xlnet_lite.visualize --output mask.png [--tokenizer DIR] [--seq-len 48 --reuse-len 16]

Builds one sample from the embedded news corpus with `PretrainingStream`, samples targets and a
factorization order with `DataCollatorForXLNetPretraining`, and draws: the tokens (targets
highlighted), the factorization order, the content-stream mask (a token sees itself) and the
query-stream mask (a target never sees itself), in a PNG.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from .collator import DataCollatorForXLNetPretraining
from .data import PretrainingStream, split_sentences
from .embedded_datasets import embedded_news_texts
from .tokenization_xlnet_lite import load_tokenizer, train_tokenizer


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default="mask.png", help="PNG file to write")
    parser.add_argument("--tokenizer", default=None, help="tokenizer folder (default: train a small one)")
    parser.add_argument("--num-articles", type=int, default=200, help="news articles to use")
    parser.add_argument("--vocab-size", type=int, default=2000)
    parser.add_argument("--seq-len", type=int, default=48)
    parser.add_argument("--reuse-len", type=int, default=16)
    parser.add_argument("--perm-size", type=int, default=None, help="default: reuse_len")
    parser.add_argument("--plm-probability", type=float, default=1 / 6)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def build_sample(args: argparse.Namespace):
    """(tokens, batch) for one example: the token strings and the collator output (batch of 1)."""
    texts = embedded_news_texts()[: args.num_articles]
    if args.tokenizer:
        tokenizer = load_tokenizer(args.tokenizer)
    else:
        sentences = [s for text in texts for s in split_sentences(text)]
        tokenizer = train_tokenizer(sentences, vocab_size=args.vocab_size)
    stream = PretrainingStream(
        texts, tokenizer, batch_size=1, seq_len=args.seq_len, reuse_len=args.reuse_len, seed=args.seed
    )
    collator = DataCollatorForXLNetPretraining(
        tokenizer,
        plm_probability=args.plm_probability,
        reuse_len=args.reuse_len,
        perm_size=args.perm_size,
        seed=args.seed,
    )
    batch = collator(stream.next_batch())
    tokens = tokenizer.convert_ids_to_tokens(batch["input_ids"][0].tolist())
    return tokens, batch


def factorization_order(perm_mask: np.ndarray, is_target: np.ndarray) -> np.ndarray:
    """Rank of each position in the order implied by perm_mask (non-targets share rank 0).

    A target's rank is 1 + the number of targets it may see, so the order can be read off the
    mask the model actually gets.
    """
    sees = perm_mask == 0
    order = np.zeros(len(is_target), dtype=int)
    order[is_target] = 1 + (sees[np.ix_(is_target, is_target)]).sum(1)
    return order


def draw(tokens: list[str], batch, output: str | Path, *, reuse_len: int | None = None) -> Path:
    """Write the picture of one sample (row 0 of a collator batch) to `output`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    perm_mask = batch["perm_mask"][0].numpy()  # (T, T), 1 = may not attend
    is_target = batch["target_mapping"][0].sum(0).numpy() > 0  # (T,)
    T = len(tokens)
    query = 1 - perm_mask
    content = query.copy()
    np.fill_diagonal(content, 1)
    order = factorization_order(perm_mask, is_target)
    labels = [f"{t}*" if m else t for t, m in zip(tokens, is_target)]

    fig = plt.figure(figsize=(22, 12))
    grid = fig.add_gridspec(2, 2, height_ratios=[1, 6])
    ax = fig.add_subplot(grid[0, :])
    colors = np.where(is_target, 1.0, 0.0)[None, :]
    ax.imshow(colors, cmap="Oranges", vmin=0, vmax=1.5, aspect="auto")
    for i in range(T):
        ax.text(
            i, 0, f"{labels[i]}\n{order[i] if is_target[i] else '-'}", ha="center", va="center", fontsize=6, rotation=90
        )
    ax.set_yticks([])
    ax.set_xticks(range(T))
    ax.set_title("tokens (targets starred, with their place in the factorization order; '-' = context, seen by all)")
    for col, (mask, title) in enumerate(
        [
            (content, "content stream: row may attend to column (sees itself)"),
            (query, "query stream: row may attend to column (a target never sees itself)"),
        ]
    ):
        ax = fig.add_subplot(grid[1, col])
        ax.imshow(mask, cmap="Blues", vmin=0, vmax=1, interpolation="nearest")
        ax.set_xticks(range(T))
        ax.set_yticks(range(T))
        ax.set_xticklabels(labels, rotation=90, fontsize=5)
        ax.set_yticklabels(labels, fontsize=5)
        ax.set_title(title)
        if reuse_len:
            ax.axhline(reuse_len - 0.5, color="red", lw=0.8)
            ax.axvline(reuse_len - 0.5, color="red", lw=0.8)
    fig.tight_layout()
    output = Path(output)
    fig.savefig(output, dpi=150)
    plt.close(fig)
    return output


def main(argv=None) -> Path:
    args = parse_args(argv)
    tokens, batch = build_sample(args)
    path = draw(tokens, batch, args.output, reuse_len=args.reuse_len)
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
