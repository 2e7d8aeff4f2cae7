"""The repository stays in order: ruff's lint and format pass, and the README stays a manual (short, with a
user's own-data command near the top)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def ruff(*args):
    command = [sys.executable, "-m", "ruff"] if shutil.which("ruff") is None else ["ruff"]
    return subprocess.run([*command, *args, "."], cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args", [("check",), ("format", "--check")], ids=["lint", "format"])
def test_ruff_passes(args):
    result = ruff(*args)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]


def test_readme_is_a_manual():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; it is a manual of at most 250 (figures: RESULTS.md)"
    first = "\n".join(lines[:80])
    assert "python pretrain/run_pretraining.py --train_file" in first, "the own-data command leaves the first 80 lines"
    assert "python finetune/run_glue.py" in first
