"""tests/prewarmed.py runs a command as `python script args` would: its environment, working directory, argv,
outputs, exit status (SystemExit, a traceback, a signal), threads and atexit; fresh code under test; a server only
for an environment it has seen before, and a subprocess beside a command the server is running."""

import os
import signal
import sys
import textwrap
import time

import prewarmed

SCRIPT = textwrap.dedent(
    """
    import atexit, os, sys, threading, time
    print("argv", sys.argv[1:], "cwd", os.getcwd(), "var", os.environ.get("XLNET_LITE_PROBE"))
    print("xlnet_lite imported before", "xlnet_lite" in sys.modules, "server", os.getppid())
    print("path0", sys.path[0], "name", __name__)
    atexit.register(lambda: print("atexit ran"))
    threading.Thread(target=lambda: (time.sleep(0.2), print("thread joined"))).start()
    how = sys.argv[1]
    if how == "raise":
        raise ValueError("from the script")
    if how == "exit":
        sys.exit(3)
    if how == "message":
        sys.exit("a message")
    if how == "sleep":
        print("sleeping", flush=True)
        time.sleep(60)
    print("to stderr", file=sys.stderr)
    """
)


def test_a_command_runs_as_python_script_args_would(tmp_path, monkeypatch):
    # room for this test's server whatever servers the tests before it in this process started
    monkeypatch.setattr(prewarmed, "MAX_SERVERS", len(prewarmed._servers) + 1)
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PREWARMED_TEST": str(tmp_path)}  # an environment new here

    def run(how, probe="x"):
        return prewarmed.run([sys.executable, script, how], env={**env, "XLNET_LITE_PROBE": probe}, cwd=work)

    first, second = run("plain", "first"), run("plain", "second")  # a new environment, then the same again
    for result, probe in ((first, "first"), (second, "second")):
        assert result.returncode == 0, result.stderr
        assert f"argv ['plain'] cwd {work} var {probe}" in result.stdout
        assert "xlnet_lite imported before False" in result.stdout
        assert f"path0 {tmp_path} name __main__" in result.stdout
        assert result.stdout.index("thread joined") < result.stdout.index("atexit ran")
        assert result.stderr == "to stderr\n"
    assert f"server {os.getpid()}" in first.stdout  # a plain subprocess of this process
    assert f"server {os.getpid()}" not in second.stdout  # a child of the server

    failed = run("raise")
    assert failed.returncode == 1
    assert "Traceback" in failed.stderr and "ValueError: from the script" in failed.stderr
    assert "atexit ran" in failed.stdout
    assert run("exit").returncode == 3
    message = run("message")
    assert (message.returncode, message.stderr) == (1, "a message\n")

    command = prewarmed.start([sys.executable, script, "sleep"], env=env, cwd=work)
    while "sleeping" not in command.out.read_text():
        assert command.poll() is None
        time.sleep(0.05)
    beside = run("plain")  # the server is busy: a subprocess, not a wait
    assert beside.returncode == 0 and f"server {os.getpid()}" in beside.stdout
    command.send_signal(signal.SIGKILL)
    assert command.wait(timeout=60) == -signal.SIGKILL
    after = run("plain")  # the server goes on
    assert after.returncode == 0 and f"server {os.getpid()}" not in after.stdout


def test_code_and_modules_run_as_python_c_and_python_m_would(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PREWARMED_TEST": str(tmp_path)}
    code = "import sys; print(sys.argv, repr(sys.path[0]), __name__); sys.exit(int(sys.argv[1]))"
    (tmp_path / "probe_module.py").write_text("import sys; print(sys.argv[1:], __name__)")
    for _ in range(2):  # a subprocess, then a child of the server
        result = prewarmed.run([sys.executable, "-c", code, "4"], env=env, cwd=tmp_path)
        assert (result.returncode, result.stdout) == (4, "['-c', '4'] '' __main__\n")
        result = prewarmed.run([sys.executable, "-m", "probe_module", "a"], env=env, cwd=tmp_path)
        assert (result.returncode, result.stdout) == (0, "['a'] __main__\n"), result.stderr
