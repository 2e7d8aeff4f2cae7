"""Recipe commands run as `python script args` would run them, forked from a warm process.

Each pytest process keeps a server (this file run with --serve) that has imported torch, transformers, accelerate and
datasets and run nothing else; a command is a child forked from it that takes the command's environment, working
directory, argv and output files and runs the script as __main__, then exits as the interpreter would (non-daemon
threads joined, atexit functions run, the exit status of SystemExit or 1 after a traceback). A launch then costs the
script's own work instead of the ~8-10 s that those imports take on a 2-core machine, which is most of what the kill
and resume tests spend. Nothing of xlnet_lite or the recipes is imported before the fork, so the code under test
starts fresh in every command, reading its own environment (XLNET_LITE_CRASH_AT and the like).

What a fresh interpreter decides stays with one: the libraries imported ahead read some environment variables as they
are imported (OMP_NUM_THREADS, HF_HOME, HF_HUB_OFFLINE, ...), so a server serves only commands whose environment is
the one it started with, apart from XLNET_LITE_* and PYTEST_* variables; an environment seen for the first time runs
in a plain subprocess and a server for it starts when it comes again. Tests of what a fresh environment loads call
subprocess themselves.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNTIME_PREFIXES = ("XLNET_LITE_", "PYTEST_")  # read when the code under test runs, not as the libraries import
MAX_SERVERS = 3  # per pytest process; a further environment runs its commands in plain subprocesses
STARTUP_S = 300  # the server's imports, on a loaded 2-core machine


def run(argv, *, env=None, cwd=None, timeout=600) -> subprocess.CompletedProcess:
    """`subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)` for argv =
    [python, script, *args], the script run in a child of a warm server where one serves `env`."""
    argv = [str(a) for a in argv]
    env = dict(os.environ if env is None else env)
    server = _server_for(env) if len(argv) >= 2 and argv[0] == sys.executable and argv[1].endswith(".py") else None
    if server is None:
        return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    return server.run(argv, env, cwd, timeout)


def _key(env):
    return tuple(sorted((k, v) for k, v in env.items() if not k.startswith(RUNTIME_PREFIXES)))


_servers: dict[tuple, _Server] = {}
_seen: set[tuple] = set()


def _server_for(env):
    key = _key(env)
    if key not in _servers:
        if key not in _seen or len(_servers) >= MAX_SERVERS:
            _seen.add(key)
            return None
        _servers[key] = _Server(env)
    server = _servers[key]
    if server.process.poll() is not None:  # it died: the next command starts another
        del _servers[key]
        return None
    return server


class _Server:
    def __init__(self, env):
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )
        self.pending = b""
        atexit.register(self.close)

    def close(self):
        if self.process.poll() is None:
            self.process.stdin.close()  # the server ends at the end of its input
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def reply(self, deadline):
        """The server's next reply line (a dict), or None at the deadline."""
        fd = self.process.stdout.fileno()
        while b"\n" not in self.pending:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"the command server ended (exit {self.process.wait()})")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)

    def run(self, argv, env, cwd, timeout):
        with tempfile.TemporaryDirectory(prefix="prewarmed_") as folder:
            out, err = Path(folder, "stdout"), Path(folder, "stderr")
            request = dict(argv=argv, env=env, cwd=str(cwd or os.getcwd()), stdout=str(out), stderr=str(err))
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            self.process.stdin.flush()
            started = self.reply(time.monotonic() + STARTUP_S)
            if started is None:
                raise RuntimeError(f"the command server did not start a command in {STARTUP_S} s")
            ended = self.reply(time.monotonic() + timeout)
            if ended is None:
                os.kill(started["pid"], 9)
                self.reply(time.monotonic() + 60)
                raise subprocess.TimeoutExpired(argv, timeout, out.read_text(), err.read_text())
            return subprocess.CompletedProcess(argv, ended["returncode"], out.read_text(), err.read_text())


# ----------------------------------------------------------------------------------------------------------------
# The server


def serve():
    import accelerate  # noqa: F401
    import datasets  # noqa: F401
    import numpy  # noqa: F401
    import safetensors.torch  # noqa: F401
    import tokenizers  # noqa: F401
    import torch  # noqa: F401
    import tqdm.auto  # noqa: F401
    import transformers.modeling_utils  # noqa: F401

    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # what a library prints goes to stderr, not into the replies
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            replies.close()  # the command's outputs go to its files
            _child(request)
        replies.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")


def _child(request):
    """Runs the command in this forked process and exits with its status; never returns."""
    code = 1
    try:
        import runpy
        import threading
        import traceback

        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
        sys.stdin = open(os.devnull)
        script = request["argv"][1]
        sys.argv = request["argv"][1:]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as stop:
            code = 0 if stop.code is None else stop.code if isinstance(stop.code, int) else 1
            if not isinstance(stop.code, (int, type(None))):
                print(stop.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            code = 1
        threading._shutdown()  # as the interpreter ends: non-daemon threads, then atexit
        import atexit as exits

        exits._run_exitfuncs()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    sys.path.pop(0)  # tests/ is not where the commands' imports come from
    serve()
