"""Python commands (`python script.py args`, `python -c code args`, `python -m module args`) run as the interpreter
would run them, forked from a warm process.

Each pytest process keeps a server (this file run with --serve) that has imported torch, transformers, accelerate and
datasets and run nothing else; a command is a child forked from it that takes the command's environment, working
directory, argv and output files, runs the script, code or module as __main__ and exits as the interpreter would
(non-daemon threads joined, atexit functions run, the status of SystemExit, or 1 after a traceback). A launch then
costs the command's own work instead of the ~8-10 s that those imports take on a 2-core machine, which is most of what
the kill and resume tests spend. Nothing of xlnet_lite or the recipes is imported before the fork, so the code under
test starts fresh in every command, reading its own environment (XLNET_LITE_CRASH_AT and the like).

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
import runpy
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import types
from pathlib import Path

RUNTIME_PREFIXES = ("XLNET_LITE_", "PYTEST_")  # read when the code under test runs, not as the libraries import
MAX_SERVERS = 3  # per pytest process; a further environment runs its commands in plain subprocesses
STARTUP_S = 300  # the server's imports, on a loaded 2-core machine


def run(argv, *, env=None, cwd=None, timeout=600) -> subprocess.CompletedProcess:
    """`subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)` for a Python
    command, argv = [sys.executable, script.py | -c code | -m module, *args], run in a child of a warm server where
    one serves `env`."""
    process = start(argv, env=env, cwd=cwd)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        raise subprocess.TimeoutExpired(process.args, timeout, out, err) from None
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def start(argv, *, env=None, cwd=None):
    """`subprocess.Popen(argv, env=env, cwd=cwd, stdout=PIPE, stderr=PIPE, text=True)` for a Python command, as
    much of it as the tests use (pid, poll, wait, communicate, send_signal, kill, returncode): in a child of a warm
    server where one serves `env`, else in a plain subprocess. Its outputs go to files, so a command that writes
    much while the test waits on it cannot fill a pipe."""
    argv = [str(a) for a in argv]
    env = dict(os.environ if env is None else env)
    return Command(argv, env, cwd, _server_for(env) if _servable(argv) else None)


def _servable(argv):
    """python script.py args, python -c code args or python -m module args."""
    if len(argv) < 2 or argv[0] != sys.executable:
        return False
    return argv[1].endswith(".py") or (argv[1] in ("-c", "-m") and len(argv) >= 3)


class Command:
    """A running command: a server's child, or a plain subprocess where no server is free (one command at a time
    each: a command started while another runs beside it gets a subprocess)."""

    def __init__(self, argv, env, cwd, server):
        self.args, self.server, self.returncode, self.popen = argv, server, None, None
        self.folder = tempfile.TemporaryDirectory(prefix="prewarmed_")
        self.out, self.err = Path(self.folder.name, "stdout"), Path(self.folder.name, "stderr")
        self.out.touch()
        self.err.touch()
        if server is None:
            with open(self.out, "w") as out, open(self.err, "w") as err:
                self.popen = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=err)
            self.pid = self.popen.pid
            return
        request = dict(argv=argv, env=env, cwd=str(cwd or os.getcwd()), stdout=str(self.out), stderr=str(self.err))
        server.process.stdin.write(json.dumps(request).encode() + b"\n")
        server.process.stdin.flush()
        started = server.reply(time.monotonic() + STARTUP_S)
        if started is None:
            raise RuntimeError(f"the command server did not start a command in {STARTUP_S} s")
        self.pid = started["pid"]
        server.running = self

    def poll(self):
        """The exit status, or None while it runs."""
        try:
            return self.wait(timeout=0)
        except subprocess.TimeoutExpired:
            return None

    def wait(self, timeout=None):
        """The exit status (negative: the signal); subprocess.TimeoutExpired if it runs past `timeout` seconds."""
        if self.returncode is None and self.popen is not None:
            self.returncode = self.popen.wait(timeout)
        elif self.returncode is None:
            ended = self.server.reply(time.monotonic() + (1e9 if timeout is None else timeout))
            if ended is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self.returncode, self.server.running = ended["returncode"], None
        return self.returncode

    def communicate(self, timeout=None):
        """(stdout, stderr) once it has ended."""
        self.wait(timeout)
        return self.out.read_text(), self.err.read_text()

    def send_signal(self, sig):
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self):
        self.send_signal(signal.SIGKILL)


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
    if server.running is not None and server.running.poll() is None:  # busy: this one runs beside it
        return None
    return server


class _Server:
    def __init__(self, env):
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )
        self.pending, self.running = b"", None
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
            if not select.select([fd], [], [], max(left, 0))[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                raise RuntimeError(f"the command server ended (exit {self.process.wait()})")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return json.loads(line)


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
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
        sys.stdin = open(os.devnull)
        option, *rest = request["argv"][1:]
        try:
            if option == "-c":  # sys.argv and sys.path as `python -c code args` has them; a fresh __main__
                sys.argv, main = ["-c", *rest[1:]], types.ModuleType("__main__")
                sys.path.insert(0, "")
                sys.modules["__main__"] = main
                exec(compile(rest[0], "<string>", "exec"), main.__dict__)
            elif option == "-m":
                sys.argv = [rest[0], *rest[1:]]
                sys.path.insert(0, os.getcwd())
                runpy.run_module(rest[0], run_name="__main__", alter_sys=True)
            else:
                sys.argv = [option, *rest]
                sys.path.insert(0, os.path.dirname(os.path.abspath(option)))
                runpy.run_path(option, run_name="__main__")
            code = 0
        except SystemExit as stop:
            code = 0 if stop.code is None else stop.code if isinstance(stop.code, int) else 1
            if not isinstance(stop.code, (int, type(None))):
                print(stop.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            code = 1
        threading._shutdown()  # as the interpreter ends: non-daemon threads, then atexit
        atexit._run_exitfuncs()
    except BaseException:  # in setting the command up: said where the command's stderr is, or the server's
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


if __name__ == "__main__" and sys.argv[1:] == ["--serve"]:
    sys.path.pop(0)  # tests/ is not where the commands' imports come from: each command puts its own first
    serve()
