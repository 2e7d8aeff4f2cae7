"""Compare the outputs of two runs of the main job (e.g. this checkout and a fresh clone, or a timed run and
`--pretraining_steps N` with the steps it reached):

    python -m main_job.compare_runs outputs /tmp/run2/outputs

For every model folder under either outputs folder (pretrain/, newsgroups/pretrained/, newsgroups/random_init/ for
the main job; any folder holding a model.safetensors) prints whether its metrics (every record but timings), results
(but timings), tokenizer, weights and predictions are identical, then the same for the other JSON files (the
TF-IDF baseline, comparison.json). Timings differ between any two runs; the pretraining budget
(`max_train_minutes`) is how a run was stopped, not what it computed, so both are left out. Exit status 0 when
everything else is identical, 1 when something differs, 2 (one error line) when a folder holds no run or a JSON file
does not parse."""

import json
import sys
from pathlib import Path

LEFT_OUT = (
    "train_seconds",
    "tokens_per_second",
    "elapsed",
    "eval_seconds",
    "train_runtime_s",
    "test_runtime_s",
    "wall_time_s",
    "max_train_minutes",
)
MODEL_FILES = (
    "metrics.jsonl",
    "results.json",
    "all_results.json",
    "tokenizer.json",
    "model.safetensors",
    "predict_results.tsv",
)


def without_left_out(value):
    """A JSON value with the LEFT_OUT keys removed at every depth."""
    if isinstance(value, dict):
        return {k: without_left_out(v) for k, v in value.items() if k not in LEFT_OUT}
    if isinstance(value, list):
        return [without_left_out(v) for v in value]
    return value


def content(path: Path):
    """What of a file is compared: JSON without timings, JSON lines record by record, other files byte for byte."""
    if path.suffix == ".json":
        return without_left_out(json.loads(path.read_text()))
    if path.suffix == ".jsonl":
        return [without_left_out(json.loads(line)) for line in path.read_text().splitlines()]
    return path.read_bytes()


def outside_checkpoints(root: Path, pattern: str) -> list[Path]:
    """The files under root matching pattern, those in a checkpoints folder left out."""
    return [p for p in root.rglob(pattern) if "checkpoints" not in p.relative_to(root).parts]


def compared_files(root: Path, folders: list[Path]) -> set[str]:
    """Paths, relative to root, of the files compared: each model folder's MODEL_FILES, and every JSON file outside
    the model folders and checkpoints."""
    files = {str((d / name).relative_to(root)) for d in folders for name in MODEL_FILES if (d / name).is_file()}
    files |= {
        str(p.relative_to(root))
        for p in outside_checkpoints(root, "*.json")
        if not any(d in p.parents for d in folders)
    }
    return files


def main(a, b) -> int:
    a, b = Path(a), Path(b)
    folders = {root: [p.parent for p in outside_checkpoints(root, "model.safetensors")] for root in (a, b)}
    for root in (a, b):
        problem = (
            "does not exist"
            if not root.is_dir()
            else "holds no model.safetensors outside checkpoints"
            if not folders[root]
            else None
        )
        if problem:
            print(f"compare_runs: error: {root} {problem}: give the outputs folders of two runs", file=sys.stderr)
            return 2
    names = sorted(compared_files(a, folders[a]) | compared_files(b, folders[b]))
    same = True
    for name in names:
        if not (a / name).is_file() or not (b / name).is_file():
            verdict = f"only in {a if (a / name).is_file() else b}"
        else:
            try:
                verdict = "identical" if content(a / name) == content(b / name) else "DIFFERENT"
            except json.JSONDecodeError as err:
                print(f"compare_runs: error: {name} is not valid JSON in one of the runs: {err}", file=sys.stderr)
                return 2
        same &= verdict == "identical"
        print(f"{name:45s} {verdict}")
    return 0 if same else 1


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print("usage: python -m main_job.compare_runs OUTPUTS_A OUTPUTS_B", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(*sys.argv[1:3]))
