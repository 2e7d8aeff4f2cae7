"""A CPU run keeps the memory it frees: glibc's thresholds fixed, unless the user set malloc up or another allocator
serves malloc."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from xlnet_lite.training import cpu_allocator
from xlnet_lite.training.cpu_allocator import (
    M_MMAP_THRESHOLD,
    M_TRIM_THRESHOLD,
    MMAP_THRESHOLD_MAX,
    glibc,
    library_of,
    reuse_freed_memory,
)

MODULE = Path(cpu_allocator.__file__)  # loaded alone in subprocesses: no torch, no package import first


class FakeLibc:
    def __init__(self, accepts=True):
        self.calls, self.accepts = [], accepts

    def mallopt(self, parameter, value):
        self.calls.append((parameter, value))
        return int(self.accepts)


@pytest.fixture
def glibc_malloc(monkeypatch):
    """malloc resolves to the C library itself (what dladdr says for glibc's own)."""
    monkeypatch.setattr(cpu_allocator, "library_of", lambda libc, symbol: "/lib/x86_64-linux-gnu/libc.so.6")


def test_the_mmap_threshold_is_fixed_at_its_largest_and_trimming_turned_off(glibc_malloc):
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
        ({"MALLOC_ARENA_MAX": "2"}, "MALLOC_ARENA_MAX"),
        ({"MALLOC_PERTURB_": "165"}, "MALLOC_PERTURB_"),
        ({"GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=512:glibc.malloc.trim_threshold=0"}, "GLIBC_TUNABLES"),
        ({"XLNET_LITE_REUSE_FREED_MEMORY": "0"}, "XLNET_LITE_REUSE_FREED_MEMORY=0"),
    ],
)
def test_the_users_own_malloc_settings_are_left_alone(glibc_malloc, environ, named):
    libc = FakeLibc()
    assert reuse_freed_memory(environ, libc) == f"CPU memory: malloc as {named} sets it"
    assert libc.calls == []


def test_other_tunables_and_variables_do_not_count_as_malloc_settings(glibc_malloc):
    libc = FakeLibc()
    environ = {"GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=512", "XLNET_LITE_REUSE_FREED_MEMORY": "1"}
    assert reuse_freed_memory(environ, libc).startswith("CPU memory: freed blocks kept")
    assert len(libc.calls) == 2


def test_a_c_library_without_glibcs_malloc_is_said_and_left_alone(monkeypatch, glibc_malloc):
    monkeypatch.setattr(cpu_allocator, "glibc", lambda: None)
    assert reuse_freed_memory({}) == "CPU memory: the C library's own malloc settings (not glibc)"
    assert "it refused" in reuse_freed_memory({}, FakeLibc(accepts=False))


@pytest.mark.skipif(glibc() is None, reason="glibc only")
def test_this_process_takes_malloc_from_glibc_itself():
    libc = glibc()
    assert library_of(libc, "malloc") == library_of(libc, "gnu_get_libc_version") is not None


def run_alone(code, *args, preload=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    for name in ("GLIBC_TUNABLES", "LD_PRELOAD", "XLNET_LITE_REUSE_FREED_MEMORY"):
        env.pop(name, None)
    if preload:
        env["LD_PRELOAD"] = str(preload)
    load = (
        "import importlib.util\n"
        f"spec = importlib.util.spec_from_file_location('cpu_allocator', {str(MODULE)!r})\n"
        "cpu_allocator = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(cpu_allocator)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", load + code, *args], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


SHIM = """
#include <stddef.h>
void *__libc_malloc(size_t);
void __libc_free(void *);
void *__libc_calloc(size_t, size_t);
void *__libc_realloc(void *, size_t);
void *malloc(size_t n) { return __libc_malloc(n); }
void free(void *p) { __libc_free(p); }
void *calloc(size_t n, size_t size) { return __libc_calloc(n, size); }
void *realloc(void *p, size_t n) { return __libc_realloc(p, n); }
"""


@pytest.mark.skipif(glibc() is None or shutil.which("cc") is None, reason="glibc and a C compiler")
def test_an_allocator_preloaded_in_place_of_glibcs_is_left_alone(tmp_path):
    """An allocator preloaded over glibc's malloc (jemalloc, tcmalloc, mimalloc, ...; here a shim of our own) is told
    by where malloc resolves, whatever its file is called, and gets no mallopt."""
    (tmp_path / "shim.c").write_text(SHIM)
    shim = tmp_path / "libmyalloc.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(shim), str(tmp_path / "shim.c")], check=True, timeout=60)
    line = run_alone("print(cpu_allocator.reuse_freed_memory({}))", preload=shim).strip()
    assert line == f"CPU memory: malloc from {shim}, as it sets itself"
    line = run_alone("print(cpu_allocator.reuse_freed_memory({}))").strip()
    assert line.startswith("CPU memory: freed blocks kept for reuse")


BLOCK = """
import ctypes, json, sys


class MallInfo2(ctypes.Structure):
    names = "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost"
    _fields_ = [(name, ctypes.c_size_t) for name in names.split()]


libc = ctypes.CDLL(None)
libc.mallinfo2.restype = MallInfo2
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
if sys.argv[1] == "reuse":
    print(cpu_allocator.reuse_freed_memory({}), file=sys.stderr)
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


@pytest.mark.skipif(glibc() is None or not hasattr(glibc(), "mallinfo2"), reason="glibc's malloc (2.33 or later)")
def test_a_freed_block_stays_in_the_heap_for_the_next_step():
    """By default glibc maps a 24 MiB block afresh and unmaps it when freed, so the next step faults its pages in again;
    kept, it comes from the heap (the mmap threshold) and stays there once freed (no trimming)."""
    default, kept = json.loads(run_alone(BLOCK, "default")), json.loads(run_alone(BLOCK, "reuse"))
    size = default["size"]
    assert default["mapped"] == 1 and default["heap_grew"] < size // 2, default
    assert kept["mapped"] == 0 and kept["heap_grew"] > size // 2 and kept["heap_kept"] == kept["heap_grew"], kept
