"""output_dir/metrics.jsonl, one record per logged step, and the plots drawn from it."""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..atomic_io import atomic_write_text
from ..faults import crash_point


class MetricsLog:
    """output_dir/metrics.jsonl, one JSON record per line, main process only; mirrored to the trackers."""

    def __init__(self, accelerator, output_dir, *, with_tracking):
        self.accelerator, self.path, self.with_tracking = accelerator, Path(output_dir, "metrics.jsonl"), with_tracking
        self.count = 0  # records in the log: saved with each checkpoint

    def start(self, records: int):
        """A fresh run (0) starts an empty log; a resumed one keeps the first `records` records, the ones written
        before its checkpoint (`self.count` when it was saved), and drops what the interrupted run wrote after it.
        The rewrite is atomic, so a kill during it loses nothing."""
        kept = self.records()[:records]
        self.count = len(kept)
        if self.accelerator.is_main_process:
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))

    def log(self, record: dict):
        self.count += 1
        if self.with_tracking:
            self.accelerator.log({k: v for k, v in record.items() if k != "step"}, step=record["step"])
        if self.accelerator.is_main_process:
            with open(self.path, "a") as f:
                f.write(json.dumps(record))
                f.flush()
                crash_point("metrics_append")  # a kill here leaves a line without its end: records() skips it
                f.write("\n")

    def records(self) -> list[dict]:
        """Every complete record (a line cut short by a kill is skipped)."""
        if not self.path.exists():
            return []
        records = []
        for line in self.path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
        return [r for r in records if isinstance(r, dict) and "step" in r]


def plot_metrics(records, path, *, title, left: dict, right: dict | None = None, hline=None, xlabel="optimizer step"):
    """Curves of metrics.jsonl against the step: `left` / `right` map record keys to labels (right: a second
    axis); `hline` = (value, label). Written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    styles = iter(["-", "o-", "s--", "^-."])
    for key, label in left.items():
        points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        if points:
            ax.plot(*zip(*points), next(styles), label=label, lw=1, ms=4)
    if hline is not None:
        ax.axhline(hline[0], color="gray", ls=":", label=hline[1])
    ax.set_xlabel(xlabel)
    ax.set_ylabel("loss")
    ax.legend(loc="upper right", fontsize=8)
    for key, label in (right or {}).items():
        points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        if points:
            other = ax.twinx()
            other.plot(*zip(*points), "s-", color="tab:red", label=label)
            other.set_ylabel(label, color="tab:red")
    ax.set_title(title)
    fig.tight_layout()
    tmp = Path(path).with_name(f".{Path(path).name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    os.replace(tmp, path)
