"""A CPU run keeps the memory it frees for its next step, instead of handing it back to the kernel each time.

A training step allocates and frees the same activations and gradients every step. glibc's malloc serves a block
above its mmap threshold from a fresh mapping, and hands the free memory at the top of its heap back to the kernel
past its trim threshold; both thresholds move as blocks come and go. A CPU step then faults much of its memory in
again, page by page, zero-filled by the kernel. Fixing the mmap threshold at glibc's largest (32 MiB) and turning
trimming off keeps those blocks for reuse (benchmarks/RESULTS.md, "Model speed and memory"); blocks over 32 MiB are
still mapped and unmapped each time. A process's malloc settings the user chose (MALLOC_*_ or GLIBC_TUNABLES'
glibc.malloc, or another allocator preloaded) are left as they are.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD = -1  # mallopt's parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's largest mmap threshold on 64-bit machines (HEAP_MAX_SIZE / 2)
NO_TRIMMING = -1
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")


def user_malloc_settings(environ=os.environ) -> str | None:
    """The name of the malloc setting the user made for this process, or None."""
    for name in USER_SETTINGS:
        if name in environ:
            return name
    if "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES"
    if "malloc" in environ.get("LD_PRELOAD", ""):  # jemalloc, tcmalloc, mimalloc
        return "LD_PRELOAD"
    return None


def glibc():
    """This process's C library when it is glibc (it has mallopt and says its version), else None (macOS, musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        libc.gnu_get_libc_version()
        libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    except (OSError, AttributeError):
        return None
    return libc


def reuse_freed_memory(environ=os.environ, libc=None) -> str:
    """Fix glibc's mmap threshold at its largest and turn trimming off, for this process from now on. Returns what was
    done, as a line for the run's log."""
    setting = user_malloc_settings(environ)
    if setting is not None:
        return f"CPU memory: malloc as {setting} sets it"
    libc = libc if libc is not None else glibc()
    if libc is None:
        return "CPU memory: the C library's own malloc settings (not glibc)"
    if not (libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) and libc.mallopt(M_TRIM_THRESHOLD, NO_TRIMMING)):
        return "CPU memory: the C library's own malloc settings (glibc refused mallopt)"
    return (
        "CPU memory: freed blocks kept for reuse (glibc mmap threshold 32 MiB, no trimming; malloc settings of your "
        "own in MALLOC_*_ or GLIBC_TUNABLES win)"
    )
