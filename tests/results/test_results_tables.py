"""benchmarks.results_tables: the committed generated tables (every arm, the compute curve) are what their result
files give; a table edited by hand is found and written back; arms and curve points go where they are read; and
benchmarks/RESULTS.md names only result files, commands and anchors that exist."""

import json
import re
import shutil
import subprocess

import pytest
from recipe_helpers import REPO
from test_newsgroups import bench_file

from benchmarks import results_tables as rt

RESULTS_DOC = REPO / "benchmarks" / "RESULTS.md"
GENERATED = [rt.EVERY_ARM_JSON, rt.CURVE_JSON, *rt.TABLES.values()]


@pytest.fixture
def results_copy(tmp_path, monkeypatch):
    """The generated files and what they are made of, copied to a folder of their own; run from the repository."""
    monkeypatch.chdir(REPO)
    copy = tmp_path / "results"
    copy.mkdir()
    for name in GENERATED:
        shutil.copy(REPO / rt.RESULTS / name, copy / name)
    return copy


def repository_files():
    return {name: (REPO / rt.RESULTS / name).read_bytes() for name in [*GENERATED, "compute_curve.png"]}


def test_the_committed_tables_are_what_their_result_files_give(monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    assert rt.main([]) == 0, capsys.readouterr().err
    arms = json.loads((REPO / rt.RESULTS / rt.EVERY_ARM_JSON).read_text())["arms"]
    rows = [line for line in (REPO / rt.RESULTS / "every_arm.md").read_text().splitlines() if line.startswith("| ")]
    assert len(arms) >= 100 and len(rows) == 1 + len(arms)  # the header, then one row per arm's file
    curve = (REPO / rt.RESULTS / "compute_curve.md").read_text()
    assert "| recipe | labels/group | steps |" in curve and "| recipe | labels/group (finetuning) | reaches |" in curve


def test_an_edited_table_is_found_and_written_back(results_copy, capsys):
    table = results_copy / "every_arm.md"
    committed = table.read_text()
    row = next(line for line in committed.splitlines() if " ± " in line)
    for edited in [committed.replace(row, row.replace(" ± ", " +/- ", 1)), committed.replace(row + "\n", "")]:
        table.write_text(edited)
        assert rt.main(["--dir", str(results_copy)]) == 1
        assert f"{table} differs" in capsys.readouterr().err
        assert table.read_text() == edited  # a check changes nothing
        before = repository_files()
        assert rt.main(["--write", "--dir", str(results_copy)]) == 0
        assert table.read_text() == committed and repository_files() == before


def test_a_lever_added_with_write_is_the_last_row(results_copy, tmp_path):
    point = bench_file(tmp_path / "point.json", "50", [0.61, 0.62, 0.63], [0.47, 0.48, 0.49], 0.68, steps=3060)
    before = repository_files()
    assert rt.main(["--write", "--dir", str(results_copy), "--lever", f"a new lever={point}"]) == 0
    assert json.loads((results_copy / rt.EVERY_ARM_JSON).read_text())["arms"][-1] == {
        "name": "a new lever",
        "file": str(point),
    }
    last = (results_copy / "every_arm.md").read_text().splitlines()[-1]
    assert last.startswith("| a new lever | 50 | defaults | 3,060 steps, 6.3M tokens | -2.20 | 0.620 ± 0.010 |")
    assert "| 0.480 ± 0.010 | +14.0 | a test CPU, bf16 | point.json |" in last
    assert repository_files() == before  # the curve did not change, so its command did not rerun


def test_each_arm_is_held_against_its_own_reference(tmp_path):
    # a file with its own random arm (0.40) and a reference file whose random arm (0.48) must not replace it
    own = bench_file(tmp_path / "own.json", "50", [0.30, 0.32, 0.31], [0.39, 0.40, 0.41], 0.68, steps=600)
    reference = bench_file(tmp_path / "ref.json", "50", [0.3] * 3, [0.47, 0.48, 0.49], 0.68, steps=1500)
    data = json.loads(bench_file(tmp_path / "b8.json", "50", [0.322], [0.0], 0.0, steps=2400).read_text())
    data["summary"]["50"] = {"pretrained": data["summary"]["50"]["pretrained"]}  # a --arms pretrained --no_tfidf run
    data["summary"]["50"]["pretrained"]["validation_accuracy"] = {"mean": 0.412}
    data["pretraining_args"] = {
        "per_device_train_batch_size": 8,
        "learning_rate": 6e-4,  # the default
        "max_steps": 2400,
        "output_dir": "/tmp/b8",
        "plm_probability": 1 / 6,
        "max_span_length": 1,
    }
    (tmp_path / "b8.json").write_text(json.dumps(data))
    odd = bench_file(tmp_path / "odd.json", "50", [0.315], [0.0], 0.0, steps=600, flags="--num_train_epochs 16")
    data = json.loads(odd.read_text())
    del data["summary"]["50"]["random_init"]
    odd.write_text(json.dumps(data))
    mean = bench_file(tmp_path / "mean.json", "50", [0.2] * 3, [0.24] * 3, 0.0, steps=600, flags="--summary_type mean")
    data = json.loads(
        bench_file(tmp_path / "mean_pt.json", "50", [0.39] * 3, [0.0], 0.0, flags="--summary_type mean").read_text()
    )
    del data["summary"]["50"]["random_init"]
    (tmp_path / "mean_pt.json").write_text(json.dumps(data))
    named = [
        ("own=", str(own)),
        ("batch 8", str(tmp_path / "b8.json")),
        ("16 epochs", str(odd)),
        ("mean", str(mean)),
        ("mean, longer", str(tmp_path / "mean_pt.json")),
    ]
    rows = rt.every_arm_rows(named, [str(reference)])
    table = rt.every_arm_markdown(rows)
    assert [row["lever"] for row in rows] == ["own=", "batch 8", "16 epochs", "mean", "mean, longer"]
    assert rows[4]["random_init"] == pytest.approx(0.24)  # another named file's random arm with the same flags
    assert rows[0]["random_init"] == pytest.approx(0.40) and round(100 * rows[0]["gain_over_random_init"], 1) == -9.0
    assert (
        rows[1]["random_init"] == pytest.approx(0.48)
        and rows[1]["pretraining_flags"] == "--max_span_length 1 --per_device_train_batch_size 8"
    )  # against XLNet's objective: 1/6 is not listed
    assert (
        "| batch 8 (`--max_span_length 1 --per_device_train_batch_size 8`) | 50 | defaults "
        "| 2,400 steps, 4.9M tokens | -2.20 | "
        "0.322 (1 seed) | 0.412 | 0.480 ± 0.010 | -15.8 | a test CPU, bf16 |" in table
    )
    assert rows[2]["gain_over_random_init"] is None and rows[0]["pretraining_flags"] is None


def test_curve_points_go_where_compute_curve_reads_them():
    curve = ["m1.json", "m2.json", "--name", "main", "--series", "s1", "x.json", "--series", "s2", "y.json"]
    curve += ["--out", "o.json"]
    assert rt.with_curve_point(curve, "s1", "n.json")[4:9] == ["--series", "s1", "x.json", "n.json", "--series"]
    assert rt.with_curve_point(curve, "s2", "n.json")[-3:] == ["n.json", "--out", "o.json"]
    assert rt.with_curve_point(curve, "main", "n.json")[:3] == ["m1.json", "m2.json", "n.json"]
    with pytest.raises(ValueError, match="no line 'other'.*'main', 's1', 's2'"):
        rt.with_curve_point(curve, "other", "n.json")


@pytest.mark.parametrize(
    "args,says",
    [
        (["--lever", "a=benchmarks/results/every_arm.json"], "pass --write too"),
        (["--write", "--lever", "no_name"], "is not NAME=FILE"),
        (["--write", "--lever", "x=/no/such.json"], "no result file /no/such.json (for 'x')"),
        (["--write", "--curve", "the defaults=nothing.json"], "no result file nothing.json"),
        (["--write", "--curve", "nope=benchmarks/results/every_arm.json"], "no line 'nope'"),
    ],
)
def test_bad_arguments_are_one_line(monkeypatch, capsys, args, says):
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit) as stop:
        rt.main(args)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and says in err and "Traceback" not in err


def test_a_failing_command_stops_the_write_with_one_line_and_no_file_changed(results_copy, tmp_path, capsys):
    """A curve point with no random-init arm to hold it against: compute_curve refuses it, so nothing is written,
    not even every_arm.json with the new arm."""
    data = json.loads((REPO / rt.RESULTS / "newsgroups_amx_ptlr6e4_13200_50pc_8ep.json").read_text())
    data["finetune_flags"] = "--num_train_epochs 99"
    point = tmp_path / "point.json"
    point.write_text(json.dumps(data))
    before = repository_files()
    copied = {path: path.read_bytes() for path in results_copy.iterdir()}
    code = rt.main(
        ["--write", "--dir", str(results_copy), "--lever", f"epochs 99={point}", "--curve", f"the defaults={point}"]
    )
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "compute_curve failed" in err and "no random-init arm" in err and "--num_train_epochs 99" in err
    assert repository_files() == before and {path: path.read_bytes() for path in results_copy.iterdir()} == copied


def expand_braces(text):
    """`a_{x,y}.json` as `a_x.json`, `a_y.json` (nested and repeated braces too), as a shell expands them."""
    brace = re.search(r"\{([^{}]*)\}", text)
    if brace is None:
        return [text]
    return [
        expanded
        for choice in brace.group(1).split(",")
        for expanded in expand_braces(text[: brace.start()] + choice + text[brace.end() :])
    ]


def git(root, *args):
    """`git -C root ARGS`: its stdout, or None where git or the repository is missing (a tree without .git)."""
    try:
        result = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
    except FileNotFoundError:
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def in_history(root, revision, path):
    """Whether `git show revision:path` shows a file. A commit git has without the path fails; a commit git does not
    have fails too, but in a shallow clone (which may lack it) or a tree without git, where it cannot be checked."""
    if git(root, "cat-file", "-e", f"{revision}:{path}") is not None:
        return True
    if git(root, "cat-file", "-e", f"{revision}^{{commit}}") is not None:
        return False
    return git(root, "rev-parse", "--is-shallow-repository") in (None, "true")


HISTORY = re.compile(r"(?:research-log-2026-11|git show [0-9a-f]{7,40}):$")  # a path cited from the history


def missing_references(text, root):
    """What a results document names that is not there: result files, scripts and modules (a path cited from the
    history instead, `research-log-2026-11:path` or `git show COMMIT:path`, is looked up there), relative links and
    its own anchors."""
    path_pattern = r"((?:benchmarks|scripts|main_job)/[\w./{},-]*[\w}])"
    missing = []
    for match in re.finditer(r"\b" + path_pattern, text):
        if HISTORY.search(text, max(0, match.start() - 64), match.start()) is None:
            missing += [path for path in expand_braces(match.group(1)) if not (root / path).exists()]
    for revision, path in re.findall(r"git show ([0-9a-f]{7,40}):" + path_pattern, text):
        missing += [] if in_history(root, revision, path) else [f"{revision}:{path}"]
    for module in re.findall(r"python -m ((?:benchmarks|main_job)(?:\.\w+)+)", text):
        if not (root / (module.replace(".", "/") + ".py")).is_file():
            missing.append(f"python -m {module}")
    results = root / "benchmarks" / "results"
    for row in (line for line in text.splitlines() if line.startswith("|")):  # a table names files in results/
        for name in re.findall(r"`([\w{},.-]+\.(?:json|jsonl|png|log|txt|md))`", row):
            names = expand_braces(name)
            missing += [
                file for file in names if not (results / file).exists() and not (results / "gpu" / file).exists()
            ]
    for link in re.findall(r"\]\(((?!#|https?:)[^)#]+)\)", text):
        if not (root / "benchmarks" / link).exists():
            missing.append(link)
    anchors = {
        re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in re.findall(r"^#+ (.+)$", text, re.M)
    }
    missing += [f"#{anchor}" for anchor in re.findall(r"\]\(#([\w-]+)\)", text) if anchor not in anchors]
    return missing


def test_the_results_document_names_only_what_exists():
    text = RESULTS_DOC.read_text()
    assert len(text.splitlines()) <= 600
    assert "research-log-2026-11" in text and "ff27a081f992f434b79111db259f8ec08186ebee" in text
    assert missing_references(text, REPO) == []
    head = git(REPO, "rev-parse", "--short", "HEAD")  # a commit every clone has; None without git
    history = "" if head is None else f"`git show {head}:benchmarks/bench_model.py`, `git show {head}:scripts/none.sh` "
    full_clone = git(REPO, "rev-parse", "--is-shallow-repository") == "false"  # where a commit git lacks is an error
    made_up = (
        "## A claim\n`benchmarks/results/none_{a,b}.json`, `python -m benchmarks.no_such`, [x](results/gone.md), "
        "[y](#a-claim), [z](#elsewhere), `git show research-log-2026-11:benchmarks/results/gone.json`, "
        f"`HEAD~1:benchmarks/gone.py`, {history}`git show 0000000:benchmarks/bench_model.py`\n"
        "| a row | `every_arm.json`, `h200_tests.log`, `gone_{x,y}.json` |"
    )
    assert missing_references(made_up, REPO) == [
        "benchmarks/results/none_a.json",
        "benchmarks/results/none_b.json",
        "benchmarks/gone.py",  # from no commit git show names
        *([] if head is None else [f"{head}:scripts/none.sh"]),
        *(["0000000:benchmarks/bench_model.py"] if full_clone else []),
        "python -m benchmarks.no_such",
        "gone_x.json",
        "gone_y.json",
        "results/gone.md",
        "#elsewhere",
    ]
