"""A CPU run keeps the memory it frees for its next step, instead of handing it back to the kernel each time.

A training step allocates and frees the same activations and gradients every step. glibc's malloc serves a block
above its mmap threshold from a fresh mapping (128 KiB at first, raised to the size of each mapped block freed, up to
32 MiB) and hands the free memory at the top of its heap back to the kernel past its trim threshold (twice the mmap
threshold). A CPU step then faults much of its memory in again, page by page, zero-filled by the kernel. Fixing the
mmap threshold at its largest and turning trimming off keeps those blocks for reuse (benchmarks/RESULTS.md, "Model
speed and memory"); blocks over 32 MiB are still mapped and unmapped each time. The process keeps its peak heap until
it exits. Left as they are: malloc settings of the user's (any MALLOC_* variable, GLIBC_TUNABLES' glibc.malloc.*),
an allocator other than glibc's (preloaded, or another C library), and XLNET_LITE_REUSE_FREED_MEMORY=0.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD = -1  # mallopt's parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 << 20  # glibc's largest mmap threshold on 64-bit machines (HEAP_MAX_SIZE / 2)
NO_TRIMMING = -1
OPT_OUT = "XLNET_LITE_REUSE_FREED_MEMORY"


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def user_malloc_settings(environ=os.environ) -> str | None:
    """The name of the malloc setting the user made for this process (or of the opt-out), or None."""
    if environ.get(OPT_OUT, "1") == "0":
        return f"{OPT_OUT}=0"
    for name in sorted(environ):
        if name.startswith("MALLOC_"):
            return name
    if "glibc.malloc." in environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES"
    return None


def library_of(libc, symbol: str) -> str | None:
    """The file of the shared library that `symbol`, as this process resolves it, comes from (dladdr)."""
    info = _DlInfo()
    address = ctypes.cast(getattr(libc, symbol), ctypes.c_void_p)
    if not libc.dladdr(address, ctypes.byref(info)) or not info.dli_fname:
        return None
    return info.dli_fname.decode(errors="replace")


def glibc():
    """This process's C library when it is glibc (it has mallopt and says its version), else None (macOS, musl)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        libc.gnu_get_libc_version()
        libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
        libc.dladdr.argtypes = (ctypes.c_void_p, ctypes.POINTER(_DlInfo))
    except (OSError, AttributeError):
        return None
    return libc


def reuse_freed_memory(environ=os.environ, libc=None) -> str:
    """Fix glibc's mmap threshold at its largest and turn trimming off, for this process from now on, where malloc is
    glibc's and its settings are not the user's. Returns what was done, as a line for the run's log."""
    setting = user_malloc_settings(environ)
    if setting is not None:
        return f"CPU memory: malloc as {setting} sets it"
    libc = libc if libc is not None else glibc()
    if libc is None:
        return "CPU memory: the C library's own malloc settings (not glibc)"
    malloc_from = library_of(libc, "malloc")
    if malloc_from != library_of(libc, "gnu_get_libc_version"):
        return f"CPU memory: malloc from {malloc_from}, as it sets itself"
    if not (libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX) and libc.mallopt(M_TRIM_THRESHOLD, NO_TRIMMING)):
        return "CPU memory: glibc's own malloc settings (it refused a 32 MiB mmap threshold)"
    return (
        "CPU memory: freed blocks kept for reuse (glibc's mmap threshold 32 MiB, no trimming; "
        f"{OPT_OUT}=0 or a MALLOC_* setting of yours leaves glibc's own)"
    )
