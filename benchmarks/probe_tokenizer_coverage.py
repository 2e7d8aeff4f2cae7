"""How evenly a tokenizer covers the 20 Newsgroups groups: pieces per word of each group's training messages.

The file stores the training messages group after group, so a tokenizer trained on its first N messages has seen a
few groups only; this probe shows what that costs the others (and what the groups among the first N are).

    python -m benchmarks.probe_tokenizer_coverage --tokenizers first2000=DIR alldocs=DIR [--first_documents 2000]
        [--out benchmarks/results/F.json]
"""

import argparse
import collections
import json
import statistics
from pathlib import Path

from benchmarks.environment import environment
from xlnet_lite.embedded_datasets import embedded_newsgroups_messages
from xlnet_lite.tokenization_xlnet_lite import load_tokenizer


def pieces_per_word(tokenizer, messages):
    """{group: pieces per whitespace-separated word over the group's messages}."""
    pieces, words = collections.Counter(), collections.Counter()
    for label, text in messages:
        pieces[label] += len(tokenizer(text, add_special_tokens=False)["input_ids"])
        words[label] += len(text.split())
    return {group: pieces[group] / words[group] for group in sorted(words)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--tokenizers",
        nargs="+",
        required=True,
        metavar="NAME=DIR",
        help="tokenizer folders (a pretrained model's folder or its tokenizer/), each named",
    )
    parser.add_argument(
        "--first_documents",
        type=int,
        default=2000,
        help="the groups among the file's first N training messages are reported apart",
    )
    parser.add_argument("--out", help="write the result as JSON here")
    args = parser.parse_args(argv)
    tokenizers = {}
    for item in args.tokenizers:
        name, sep, path = item.partition("=")
        if not sep or not Path(path, "tokenizer.json").is_file():
            parser.error(f"--tokenizers {item}: expected NAME=DIR with DIR/tokenizer.json")
        tokenizers[name] = load_tokenizer(path)
    messages = embedded_newsgroups_messages("train")
    first = collections.Counter(label for label, _ in messages[: args.first_documents])
    result = {
        "first_documents": args.first_documents,
        "groups_in_first_documents": dict(first.most_common()),
        "tokenizers": {},
        "environment": environment(),
    }
    for name, tokenizer in tokenizers.items():
        by_group = pieces_per_word(tokenizer, messages)
        seen = [v for g, v in by_group.items() if g in first]
        unseen = [v for g, v in by_group.items() if g not in first]
        result["tokenizers"][name] = {
            "vocab_size": len(tokenizer),
            "pieces_per_word_groups_in_first_documents": statistics.mean(seen),
            "pieces_per_word_other_groups": statistics.mean(unseen) if unseen else None,
            "pieces_per_word_by_group": by_group,
        }
        print(
            f"{name}: {len(tokenizer)} pieces; pieces per word {statistics.mean(seen):.3f} in the "
            f"{len(seen)} groups of the first {args.first_documents} messages"
            + (f", {statistics.mean(unseen):.3f} in the other {len(unseen)}" if unseen else "")
        )
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
