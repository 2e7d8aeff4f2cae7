"""Pretraining on two machines, verified on one host: two torchrun nodes of one process each, each with its own token
store cache and one shared output folder (a shared filesystem, as checkpoints need), give the losses of one node with
two processes and resume; a node that dies stops the other with one line; a checkpoint resumes under another number of
processes at the same global batch, every row of the corpus read once."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from recipe_helpers import PRETRAIN, assert_same_losses, read_metrics, small_args
from safetensors.torch import load_file

from pretrain import run_pretraining
from xlnet_lite.data import PretrainingStream
from xlnet_lite.errors import RecipeError
from xlnet_lite.tokenization_xlnet_lite import load_tokenizer
from xlnet_lite.training import checkpoints, parse_args

pytestmark = pytest.mark.recipes  # runs the recipe end to end

ENV = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_node(rank, port, args, cache, **popen):
    """Node `rank` of 2 (one process) as its own torchrun, rendezvous at 127.0.0.1:port, its own store cache."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1"]
    cmd += ["--node_rank", str(rank), "--master_addr", "127.0.0.1", "--master_port", str(port), PRETRAIN, *args]
    env = {**ENV, "XLNET_LITE_CACHE": str(cache)}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def two_nodes(args, caches):
    port = free_port()
    nodes = [start_node(rank, port, args, caches[rank]) for rank in (0, 1)]
    done = [(node.communicate(timeout=300), node.returncode) for node in nodes]
    for (_, err), code in done:
        assert code == 0, err[-4000:]
    return done[0][0][0]  # node 0's stdout


def stores(cache: Path):
    """{name: inode} of the cache's token stores; everything else the cache holds (nothing: no leftovers)."""
    found = {p.name: p.stat().st_ino for p in cache.iterdir() if p.name.startswith("store-")}
    return found, sorted(p.name for p in cache.iterdir() if not p.name.startswith(("store-", ".")))


def test_two_nodes_give_the_losses_of_one_node_with_two_processes_and_resume(corpus, tmp_path, capsys):
    """1 node x 2 processes, 4 steps, against 2 nodes x 1 process, 2 steps then resumed to 4: the same losses and
    weights; each node built its store once (the resume found it), each in its own cache. Then one process goes on
    from the two nodes' last checkpoint."""
    ref = tmp_path / "one_node"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", PRETRAIN]
    env = {**ENV, "XLNET_LITE_CACHE": str(tmp_path / "cache_ref")}
    done = subprocess.run(cmd + small_args(corpus, ref), env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]

    out, caches = tmp_path / "two_nodes", [tmp_path / "cache0", tmp_path / "cache1"]
    args = small_args(corpus, out)
    args[args.index("--max_steps") + 1] = "2"
    two_nodes(args, caches)
    built = [stores(cache) for cache in caches]
    assert all(len(found) == 1 and not other for found, other in built), built
    assert built[0][0].keys() == built[1][0].keys()  # the same store, built on each node

    stdout = two_nodes(small_args(corpus, out, "--resume_from_checkpoint", "latest"), caches)
    assert f"resumed from {out / 'checkpoints' / 'step_2'} at step 2" in stdout
    assert [stores(cache) for cache in caches] == built, "a node built its store again"
    assert_same_losses(read_metrics(ref), [m for m in read_metrics(out) if "loss" in m])
    ours, theirs = load_file(str(out / "model.safetensors")), load_file(str(ref / "model.safetensors"))
    assert ours.keys() == theirs.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=0, atol=1e-6)
    assert json.loads((out / "results.json").read_text())["num_processes"] == 2

    # and the other way: the two nodes' checkpoint at step 4, continued by one process with their 4 rows
    more = small_args(corpus, out, "--resume_from_checkpoint", "latest", "--per_device_train_batch_size", "4")
    more[more.index("--max_steps") + 1] = "6"
    results = run_pretraining.main([*more, "--token_store_cache_dir", str(caches[0])])
    assert (results["steps"], results["num_processes"]) == (6, 1)
    assert "the rows of 2 processes re-split over 1" in capsys.readouterr().out
    assert [m["step"] for m in read_metrics(out) if "loss" in m] == list(range(1, 7))


def process_tree(pid: int) -> list[int]:
    """pid and its descendants, children first (torchrun's workers are not in its process group)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [p for child in children for p in process_tree(int(child))] + [pid]


@pytest.mark.skipif(not Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists(), reason="Linux /proc")
def test_a_lost_node_stops_the_other_with_one_line(corpus, tmp_path, how="SIGSTOP"):
    """Node 1 frozen after the first step (a hang: nothing closes, so --process_group_timeout ends the wait; a killed
    node closes its connections and is noticed sooner, 2.4 s by hand, benchmarks/RESULTS.md "Data scale"): node 0
    stops within seconds, exit status non-zero, one error line from the recipe (torchrun then reports the failed
    worker its own way)."""
    out, port, timeout = tmp_path / "out", free_port(), 5
    args = small_args(corpus, out, "--process_group_timeout", str(timeout))
    args[args.index("--max_steps") + 1] = "100000"
    args[args.index("--eval_steps") + 1] = "100000"
    nodes = [start_node(rank, port, args, tmp_path / f"cache{rank}", start_new_session=True) for rank in (0, 1)]
    try:
        deadline = time.monotonic() + 240
        while not (out / "metrics.jsonl").is_file() or not (out / "metrics.jsonl").read_text().strip():
            assert time.monotonic() < deadline and nodes[0].poll() is None, nodes[0].communicate()[1][-3000:]
            time.sleep(0.05)
        for pid in process_tree(nodes[1].pid):
            os.kill(pid, getattr(signal, how))
        lost = time.monotonic()
        _, err = nodes[0].communicate(timeout=120)
        took = time.monotonic() - lost
    finally:
        for node in nodes:
            if node.poll() is None:
                for pid in process_tree(node.pid):
                    os.kill(pid, signal.SIGKILL)
            node.communicate()
    assert nodes[0].returncode != 0
    assert took < timeout + 15, took
    errors = [line for line in err.splitlines() if "run_pretraining.py: error:" in line]
    assert len(errors) == 1, err[-3000:]
    assert "lost contact with another process" in errors[0] and "--resume_from_checkpoint latest" in errors[0]
    assert err.count("Traceback") <= 1, err[-3000:]  # torchrun's own report of the failed worker, none from it


def test_a_checkpoint_resumes_under_another_number_of_processes(corpus, tmp_path):
    """1 process x 4 rows for 2 steps, resumed by torchrun as 2 processes x 2 rows: the run goes on at step 3 with
    the learning rates of the uninterrupted run, each process's rows where the one process left them."""
    out, straight = tmp_path / "out", tmp_path / "straight"
    first = small_args(corpus, out, "--per_device_train_batch_size", "4")
    first[first.index("--max_steps") + 1] = "2"
    assert run_pretraining.main(first)["steps"] == 2
    run_pretraining.main(small_args(corpus, straight, "--per_device_train_batch_size", "4"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", PRETRAIN]
    cmd += small_args(corpus, out, "--resume_from_checkpoint", "latest")  # 2 rows per process; the store cached
    done = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "re-split over 2" in done.stdout and "resumed from" in done.stdout
    resumed, uninterrupted = read_metrics(out), read_metrics(straight)
    assert [m["step"] for m in resumed if "loss" in m] == [1, 2, 3, 4]
    for a, b in zip(resumed, uninterrupted):
        assert a["learning_rate"] == pytest.approx(b["learning_rate"], rel=1e-6), a["step"]
        assert np.isfinite(a["loss"])
    # the samples' B segments and targets are drawn anew after the re-split: the same losses only before it
    assert_same_losses(uninterrupted[:2], resumed[:2])
    step = out / "checkpoints" / "step_4"
    states = [json.loads((step / f"rank{r}_state.json").read_text())["stream"] for r in (0, 1)]
    straight_state = json.loads((straight / "checkpoints" / "step_4" / "rank0_state.json").read_text())["stream"]
    for rank, state in enumerate(states):
        assert (state["epoch"], state["step"]) == (straight_state["epoch"], straight_state["step"])
        assert state["layout"] == {**straight_state["layout"], "batch_size": 2, "rank": rank, "world_size": 2}
        mems = load_file(str(step / f"rank{rank}_tensors.safetensors"))
        assert all(m.shape[0] == 2 for m in mems.values()) and len(mems) == 2


def global_rows(streams, reuse_len):
    """{(reversed?, global forward row): its next reused window} over the processes' streams, one step of each."""
    rows = {}
    for stream in streams:
        halves = 2 if stream.bi_data else 1
        fwd = stream.batch_size // halves
        for j, example in enumerate(stream.next_batch()):
            key = (j // fwd, stream.rank * fwd + j % fwd)
            assert key not in rows
            rows[key] = example["input_ids"][:reuse_len].tolist()
    return rows


@pytest.mark.parametrize("before,after,bi_data", [(1, 2, False), (2, 1, False), (4, 2, True), (1, 4, False)])
def test_the_rows_of_a_stream_resplit_over_another_number_of_processes(corpus, before, after, bi_data):
    """Saved by `before` processes at step 3, continued by `after` at the same global batch: the next steps read
    every row of the uninterrupted run exactly once, at the same place; each memory row follows its stream row."""
    tokenizer = load_tokenizer(corpus / "tokenizer")
    tokens = [list(range(10, 390)) * 40]
    kw = dict(seq_len=32, reuse_len=16, bi_data=bi_data, seed=3)

    def streams(world):
        return [
            PretrainingStream(tokens, tokenizer, batch_size=8 // world, rank=r, world_size=world, **kw)
            for r in range(world)
        ]

    saved = streams(before)
    for _ in range(3):
        global_rows(saved, 16)
    states = [s.state_dict() for s in saved]
    uninterrupted = [global_rows(saved, 16) for _ in range(2)]
    mems = [{"mems.0": torch.tensor([[[q * 100.0 + j]] for j in range(8 // before)])} for q in range(before)]
    resumed = streams(after)
    for rank, stream in enumerate(resumed):
        state, moved = checkpoints.resplit_rank_states(
            [{"stream": s} for s in states], mems, rank=rank, num_processes=after
        )
        stream.load_state_dict(state["stream"])
        fwd, fwd_before = stream.batch_size // (2 if bi_data else 1), 8 // before // (2 if bi_data else 1)
        for j, value in enumerate(moved["mems.0"][:, 0, 0].tolist()):
            half, g = j // fwd, rank * fwd + j % fwd
            assert value == (g // fwd_before) * 100 + half * fwd_before + g % fwd_before
    assert [global_rows(resumed, 16) for _ in range(2)] == uninterrupted


def test_a_resume_that_changes_the_global_batch_is_one_line(tmp_path):
    """Another number of processes must keep --per_device_train_batch_size x processes; the line says which value
    does. A checkpoint whose data state does not re-split (finetuning's) still needs its own number of processes."""
    step = tmp_path / "step_2"
    step.mkdir()
    (step / "trainer_state.json").write_text(
        json.dumps({"flags": {"per_device_train_batch_size": 4, "seed": 42}, "num_processes": 1, "model": {}})
    )
    (step / "rank0_state.json").write_text(json.dumps({"stream": {"layout": {"batch_size": 4}}}))
    args = parse_args(run_pretraining.PretrainingArguments, ["--per_device_train_batch_size", "4"])
    with pytest.raises(RecipeError, match=r"global batch .* 4 x 1 = 4 in the checkpoint, 4 x 2 = 8 now \(pass "):
        checkpoints.check_resume(args, step, num_processes=2)
    with pytest.raises(RecipeError, match="do not split evenly over 3 processes"):
        checkpoints.check_resume(args, step, num_processes=3)
    args.per_device_train_batch_size = 2
    checkpoints.check_resume(args, step, num_processes=2)
    checkpoints.check_resume_model(step, {}, num_processes=2)
    with pytest.raises(RecipeError, match="per_device_train_batch_size: 4 in the checkpoint, 2 now"):
        checkpoints.check_resume(args, step, num_processes=1)
    (step / "rank0_state.json").write_text("{}")
    with pytest.raises(RecipeError, match="processes: 1 in the checkpoint, 2 now"):
        checkpoints.check_resume_model(step, {}, num_processes=2)
