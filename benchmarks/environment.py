"""Where and on what a benchmark ran, for its results JSON: git commit (and whether the tree had changes), date, CPU
model and its bf16 units, cores, GPU, torch / transformers versions, load average."""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _git(*args) -> str | None:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment() -> dict:
    import torch
    import transformers

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "commit": _git("rev-parse", "--short", "HEAD"),
        "uncommitted_changes": None
        if (status := _git("status", "--porcelain", "--untracked-files=no")) is None
        else bool(status),  # None: no git (a copy of the tree without its history)
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_bf16_units": {
            "amx": torch.cpu._is_amx_tile_supported(),
            "avx512_bf16": torch.cpu._is_avx512_bf16_supported(),
        },
        "cores": os.cpu_count(),
        "gpu": gpu,
        "cuda": torch.version.cuda if gpu else None,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "load_average": os.getloadavg(),
    }
