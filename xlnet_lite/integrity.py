"""What keeps a run's folder trustworthy: checkpoints that prove they are whole, one run per output folder, and a
failed write that costs nothing.

- A checkpoint's `manifest.json`, written last, records the size and xxh3-128 hash of every file in it;
  `verify_checkpoint` names the first file that is missing, shorter, longer or changed. A checkpoint from before
  manifests is checked by loading each of its files.
- `chunk_digests` / `first_changed_chunk`: a large file (a token store's stream) hashed in fixed-size chunks, so that
  damage is named by where it lies in the file (xlnet_lite.token_store records and checks them).
- `OutputLock`: `output_dir/.lock`, an advisory `flock` held for the whole run, with the holder's host, PID and start
  time in it. The kernel drops the lock when its process dies, however it dies, so a lock left by a killed run is
  free and is taken over (with a warning naming the run that left it).
- `SaveError`: a checkpoint or output that could not be written (a full disk, a read-only folder), one line naming
  the folder and the free space it needs.
"""

from __future__ import annotations

import datetime
import fcntl
import hashlib
import json
import mmap
import os
import shutil
import socket
from pathlib import Path

import xxhash

from .errors import RecipeError

MANIFEST = "manifest.json"


class SaveError(RuntimeError):
    """A checkpoint or output could not be written; what was saved before is intact. Recipes print it as one line."""


# xxh3_128 by default: several times faster than sha256, so a manifest costs little of a checkpoint's write
# (benchmarks/RESULTS.md). Both detect truncation and flipped bits; xxh3 is not made to resist a forger, which is not
# what a manifest guards against.
HASHES = {"xxh3_128": xxhash.xxh3_128, "sha256": hashlib.sha256}
ALGORITHM = "xxh3_128"


def file_digest(path: Path, algorithm: str = ALGORITHM) -> str:
    digest = HASHES[algorithm]()
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
                digest.update(view)
    return digest.hexdigest()


CHUNK_BYTES = 64 * 2**20  # xxh3 reads 1 MiB to 64 MiB pieces of a mapped file equally fast (benchmarks/RESULTS.md)


def _chunks(path: Path, chunk_bytes: int, algorithm: str):
    """(offset, hex digest) of each `chunk_bytes` piece of the file in order; an empty file is one empty chunk. The
    file is memory-mapped and read once, front to back (the kernel is told so: its read-ahead then doubles the speed
    of a file not yet in the page cache), each chunk's pages dropped from the process once hashed, so verifying a
    large store does not raise the run's peak RSS by the store's size."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if not size:
            yield 0, HASHES[algorithm]().hexdigest()
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as view:
            if hasattr(view, "madvise"):
                view.madvise(mmap.MADV_SEQUENTIAL)
            whole = memoryview(view)
            try:
                for offset in range(0, size, chunk_bytes):
                    digest = HASHES[algorithm]()
                    digest.update(whole[offset : offset + chunk_bytes])
                    if hasattr(view, "madvise"):  # the pages read leave this process's resident set, not the page cache
                        start = offset - offset % mmap.PAGESIZE  # madvise takes a page-aligned start
                        view.madvise(mmap.MADV_DONTNEED, start, min(offset + chunk_bytes, size) - start)
                    yield offset, digest.hexdigest()
            finally:
                whole.release()  # the map cannot close while a view of it is alive


def chunk_digests(path: Path, chunk_bytes: int = CHUNK_BYTES, algorithm: str = ALGORITHM) -> list[str]:
    """The hash of each `chunk_bytes` piece of the file, in order (one for an empty file)."""
    return [digest for _, digest in _chunks(Path(path), chunk_bytes, algorithm)]


def first_changed_chunk(
    path: Path, expected: list[str], chunk_bytes: int = CHUNK_BYTES, algorithm: str = ALGORITHM
) -> int | None:
    """The index of the first chunk of the file whose hash is not `expected`'s (a file with more or fewer chunks
    differs at the first one past the shorter list), or None when every chunk matches. Reads no further than the
    first difference."""
    count = 0
    for count, (_, digest) in enumerate(_chunks(Path(path), chunk_bytes, algorithm), start=1):
        if count > len(expected) or digest != expected[count - 1]:
            return count - 1
    return None if count == len(expected) else count


def write_manifest(folder: Path):
    """Record the size and hash of every file under `folder` in `folder/manifest.json` (written last)."""
    folder = Path(folder)
    files = {
        str(p.relative_to(folder)): {"size": p.stat().st_size, "hash": file_digest(p)}
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }
    (folder / MANIFEST).write_text(json.dumps({"format": 1, "algorithm": ALGORITHM, "files": files}, indent=1) + "\n")


def verify_checkpoint(folder: Path) -> tuple[str | None, bool]:
    """(what is wrong with the checkpoint or None, whether it had a manifest). Without a manifest (a checkpoint
    written before manifests existed) every file is loaded instead: JSON parsed, safetensors read, pickles unpickled."""
    folder = Path(folder)
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        files, algorithm = manifest["files"], manifest["algorithm"]
        HASHES[algorithm]
    except FileNotFoundError:
        return _load_every_file(folder), False
    except (OSError, ValueError, KeyError, TypeError) as error:
        return f"{MANIFEST} is unreadable ({type(error).__name__}: {error})", True
    for name, expected in files.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing", True
        size = path.stat().st_size
        if size != expected["size"]:
            return f"{name} has {size:,} bytes, the manifest says {expected['size']:,}", True
        if file_digest(path, algorithm) != expected["hash"]:
            return f"{name} does not match its {algorithm} hash in the manifest", True
    return None, True


def _load_every_file(folder: Path) -> str | None:
    from accelerate.utils import load  # torch.load with weights_only=True and accelerate's own safe globals
    from safetensors.torch import load_file

    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = str(path.relative_to(folder))
        try:
            if path.suffix == ".json":
                json.loads(path.read_text())
            elif path.suffix == ".safetensors":
                load_file(str(path))
            elif path.suffix in (".bin", ".pt", ".pkl"):
                load(path, map_location="cpu")
        except Exception as error:  # noqa: BLE001 (any failure to load means the file is damaged)
            return f"{name} does not load ({type(error).__name__}: {str(error)[:120]})"
    return None


def folder_size(folder: Path) -> int:
    """Bytes of the files under `folder` (0 if it is no folder). A file or folder that goes while it is read counts
    0: another process of a run may be removing a partial checkpoint the size of which this one measures."""
    total = 0
    for root, _, files in os.walk(folder):  # a folder it can no longer list is skipped
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_size
            except FileNotFoundError:  # gone, or a link to nothing
                pass
    return total


def save_error(folder: Path, error: Exception, *, needed_bytes: int, what: str) -> SaveError:
    """The one-line SaveError for a failed write into `folder`, with the free space there and the space needed. A
    full disk reaches Python as OSError (open/write), RuntimeError (torch.save) or SafetensorError (save_file)."""
    existing = Path(folder)
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    reason = error.strerror if isinstance(error, OSError) and error.strerror else f"{type(error).__name__}: {error}"
    reason = " ".join(reason.split())[:300]
    return SaveError(
        f"could not write {what} in {folder}: {reason}; it needs about "
        f"{_megabytes(needed_bytes)} free and {existing} has {_megabytes(free)}. What was saved "
        "before is intact; free some space and resume with --resume_from_checkpoint latest"
    )


def _megabytes(n: int) -> str:
    return f"{n / 2**20:,.1f} MB"


class OutputLock:
    """`output_dir/.lock`: one run per output folder. `acquire` takes it or raises RecipeError naming the holder;
    `release` removes it. Returns from `acquire` a warning when it took over a lock left by a run that is gone."""

    NAME = ".lock"

    def __init__(self, folder):
        self.folder, self.path, self._fd = Path(folder), Path(folder, self.NAME), None

    def acquire(self) -> str | None:
        self.folder.mkdir(parents=True, exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _describe(_read_holder(fd))
                os.close(fd)
                raise RecipeError(
                    f"--output_dir {self.folder} is in use by another run ({holder}); wait for it to end "
                    "or choose another --output_dir"
                ) from None
            if _same_file(fd, self.path):
                break
            os.close(fd)  # the holder removed the file between our open and our lock: lock the new one
        previous = _read_holder(fd)
        warning = None
        if previous:  # the lock was free, so its holder is gone: killed, or a crash before it could remove the file
            if previous.get("host") != socket.gethostname():
                os.close(fd)
                raise RecipeError(
                    f"--output_dir {self.folder} is locked by a run on another host ({_describe(previous)});"
                    f" if that run is over, remove {self.path}"
                )
            warning = f"--output_dir {self.folder}: taking over the lock of a run that is gone ({_describe(previous)})"
        holder = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        os.fsync(fd)
        self._fd = fd
        return warning

    def release(self):
        if self._fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)  # while still held: a run waiting for it never sees our file
        finally:
            os.close(self._fd)
            self._fd = None


def _same_file(fd, path) -> bool:
    try:
        return os.path.samestat(os.fstat(fd), os.stat(path))
    except FileNotFoundError:
        return False


def _read_holder(fd) -> dict | None:
    try:
        text = os.pread(fd, 4096, 0).decode()
        return json.loads(text) if text.strip() else None
    except (OSError, ValueError):
        return {"host": "?", "pid": "?", "started": "? (the lock file is unreadable)"}


def _describe(holder: dict | None) -> str:
    if not holder:
        return "host and PID unknown"
    return f"host {holder.get('host')}, PID {holder.get('pid')}, started {holder.get('started')}"
