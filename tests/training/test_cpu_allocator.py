"""A CPU run keeps the memory it frees: glibc's thresholds fixed, the user's own malloc settings left alone."""

import json
import os
import subprocess
import sys

import pytest

from xlnet_lite.training import cpu_allocator
from xlnet_lite.training.cpu_allocator import (
    M_MMAP_THRESHOLD,
    M_TRIM_THRESHOLD,
    MMAP_THRESHOLD_MAX,
    glibc,
    reuse_freed_memory,
)


class FakeLibc:
    def __init__(self, accepts=True):
        self.calls, self.accepts = [], accepts

    def mallopt(self, parameter, value):
        self.calls.append((parameter, value))
        return int(self.accepts)


def test_the_mmap_threshold_is_fixed_at_its_largest_and_trimming_turned_off():
    libc = FakeLibc()
    line = reuse_freed_memory({}, libc)
    assert libc.calls == [(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX), (M_TRIM_THRESHOLD, -1)]
    assert (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, MMAP_THRESHOLD_MAX) == (-3, -1, 32 * 1024 * 1024)  # malloc.h, glibc
    assert line.startswith("CPU memory: freed blocks kept for reuse")


@pytest.mark.parametrize(
    "environ, named",
    [
        ({"MALLOC_TRIM_THRESHOLD_": "131072"}, "MALLOC_TRIM_THRESHOLD_"),
        ({"MALLOC_MMAP_THRESHOLD_": "65536"}, "MALLOC_MMAP_THRESHOLD_"),
        ({"MALLOC_TOP_PAD_": "0"}, "MALLOC_TOP_PAD_"),
        ({"MALLOC_MMAP_MAX_": "0"}, "MALLOC_MMAP_MAX_"),
        ({"GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=512:glibc.malloc.trim_threshold=0"}, "GLIBC_TUNABLES"),
        ({"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"}, "LD_PRELOAD"),
    ],
)
def test_the_users_own_malloc_settings_are_left_alone(environ, named):
    libc = FakeLibc()
    assert reuse_freed_memory(environ, libc) == f"CPU memory: malloc as {named} sets it"
    assert libc.calls == []


def test_other_tunables_and_preloads_do_not_count_as_malloc_settings():
    libc = FakeLibc()
    environ = {"GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=512", "LD_PRELOAD": "/opt/libfaketime.so"}
    assert reuse_freed_memory(environ, libc).startswith("CPU memory: freed blocks kept")
    assert len(libc.calls) == 2


def test_a_c_library_without_glibcs_malloc_is_said_and_left_alone(monkeypatch):
    monkeypatch.setattr(cpu_allocator, "glibc", lambda: None)
    assert reuse_freed_memory({}) == "CPU memory: the C library's own malloc settings (not glibc)"
    assert "glibc refused" in reuse_freed_memory({}, FakeLibc(accepts=False))


BLOCK = """
import ctypes, json, sys
from xlnet_lite.training.cpu_allocator import reuse_freed_memory


class MallInfo2(ctypes.Structure):
    names = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
    _fields_ = [(name, ctypes.c_size_t) for name in names.split()]


libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
if sys.argv[1] == "reuse":
    reuse_freed_memory({})
size = 24 << 20  # an activation of the main job's step: under the largest mmap threshold, over glibc's first
before = libc.mallinfo2()
block = libc.malloc(size)
ctypes.memset(block, 1, size)
held = libc.mallinfo2()
libc.free(block)
freed = libc.mallinfo2()
print(json.dumps({"mapped": held.hblks - before.hblks, "heap_grew": held.arena - before.arena,
                  "heap_kept": freed.arena - before.arena, "size": size}))
"""


def a_block_freed(arm):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    done = subprocess.run([sys.executable, "-c", BLOCK, arm], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.mark.skipif(glibc() is None or not hasattr(glibc(), "mallinfo2"), reason="glibc's malloc (2.33 or later)")
def test_a_freed_block_stays_in_the_heap_for_the_next_step():
    """By default glibc maps a 24 MiB block afresh and unmaps it when freed, so the next step faults its pages in again;
    kept, it comes from the heap (the mmap threshold) and stays there once freed (no trimming)."""
    default, kept = a_block_freed("default"), a_block_freed("reuse")
    size = default["size"]
    assert default["mapped"] == 1 and default["heap_grew"] < size // 2, default
    assert kept["mapped"] == 0 and kept["heap_grew"] > size // 2 and kept["heap_kept"] == kept["heap_grew"], kept
