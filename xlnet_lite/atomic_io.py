"""Files and folders written whole or not at all, with the mode a plain open() gives."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from .faults import crash_point


def default_file_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def fsync_path(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path, text: str):
    """Write under a temporary name, fsync, rename: readers see the old file or the new one, never a part."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    crash_point(f"write:{path.name}")
    os.replace(tmp, path)
    fsync_path(path.parent)


def write_json(path, obj):
    atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


def replace_folder(tmp: Path, final: Path):
    """Make the folder `tmp` appear as `final` in one rename, after fsyncing its files: a kill leaves either no
    `final` or a complete one."""
    mode = default_file_mode()
    for file in tmp.rglob("*"):
        if file.is_file():
            os.chmod(file, mode)
            fsync_path(file)
    fsync_path(tmp)
    crash_point(f"replace:{final.name}")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_path(final.parent)


def publish_folder(tmp: Path, directory: Path):
    """Move every file of `tmp` into `directory`, each fsynced, given the default mode and renamed into place
    (transformers writes model.safetensors through a 0600 temporary file); then remove `tmp`."""
    mode = default_file_mode()
    for file in sorted(tmp.rglob("*")):
        if not file.is_file():
            continue
        target = directory / file.relative_to(tmp)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(file, mode)
        fsync_path(file)
        os.replace(file, target)
        crash_point("publish")
    fsync_path(directory)
    shutil.rmtree(tmp, ignore_errors=True)
