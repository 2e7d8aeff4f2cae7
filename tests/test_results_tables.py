"""benchmarks/RESULTS.md's generated tables (every arm, the compute curve) are what their recorded commands print, and
benchmarks.results_tables finds a table edited by hand, puts the printed one back, and adds arms and curve points."""

import pytest
from recipe_helpers import REPO

from benchmarks import results_tables as rt


@pytest.fixture(scope="module")
def printed(tmp_path_factory):
    """The tables the recorded commands print, their outputs in a temporary folder."""
    scratch = tmp_path_factory.mktemp("tables")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(REPO)
        return [
            table
            for path in rt.GENERATED.values()
            for table in rt.markdown_tables(rt.run_module(*rt.recorded_argv(path), outputs_to=scratch))
        ]


def test_the_results_document_holds_what_the_commands_print(printed):
    doc = (REPO / rt.DOC).read_text()
    assert len(printed) == 3 and all(len(table) > 3 for table in printed)
    assert rt.differing_tables(doc, printed) == []


def test_a_table_edited_by_hand_is_found_and_replaced(printed):
    doc = (REPO / rt.DOC).read_text()
    row = printed[0][5]
    edited = doc.replace(row, row.replace(" ± ", " +/- ", 1))
    assert edited != doc and rt.differing_tables(edited, printed) == [printed[0][0]]
    assert rt.replace_tables(edited, printed) == doc
    shorter = doc.replace(row + "\n", "")  # a row lost
    assert rt.differing_tables(shorter, printed) == [printed[0][0]] and rt.replace_tables(shorter, printed) == doc
    with pytest.raises(ValueError, match="occurs 2 times"):
        rt.differing_tables(doc + "\n" + "\n".join(printed[1]) + "\n", printed)


def test_the_check_command_exits_1_on_an_edited_table(tmp_path, monkeypatch, capsys, printed):
    monkeypatch.chdir(REPO)
    doc = (REPO / rt.DOC).read_text()
    edited = tmp_path / "RESULTS.md"
    edited_text = doc.replace(printed[2][2], printed[2][2] + " x", 1)
    assert edited_text != doc
    edited.write_text(edited_text)
    assert rt.main(["--doc", str(edited)]) == 1
    assert printed[2][0][:60] in capsys.readouterr().err
    assert edited.read_text() == edited_text  # a check changes nothing


def test_arms_and_curve_points_go_where_their_commands_read_them():
    levers = ["a=1.json", "b=2.json", "--reference", "r.json", "--out", "o.json"]
    assert rt.with_lever(levers, "c=3.json") == [
        "a=1.json",
        "b=2.json",
        "c=3.json",
        "--reference",
        "r.json",
        "--out",
        "o.json",
    ]
    curve = [
        "m1.json",
        "m2.json",
        "--name",
        "main",
        "--series",
        "s1",
        "x.json",
        "--series",
        "s2",
        "y.json",
        "--out",
        "o.json",
    ]
    assert rt.with_curve_point(curve, "s1", "n.json") == [
        "m1.json",
        "m2.json",
        "--name",
        "main",
        "--series",
        "s1",
        "x.json",
        "n.json",
        "--series",
        "s2",
        "y.json",
        "--out",
        "o.json",
    ]
    assert rt.with_curve_point(curve, "s2", "n.json")[-3:] == ["n.json", "--out", "o.json"]
    assert rt.with_curve_point(curve, "main", "n.json")[:3] == ["m1.json", "m2.json", "n.json"]
    with pytest.raises(ValueError, match="no line 'other'.*'main', 's1', 's2'"):
        rt.with_curve_point(curve, "other", "n.json")


@pytest.mark.parametrize(
    "args,says",
    [
        (["--lever", "a=benchmarks/results/levers.json"], "pass --write too"),
        (["--write", "--lever", "no_name"], "is not NAME=FILE"),
        (["--write", "--curve", "the defaults=nothing.json"], "no result file nothing.json"),
        (["--write", "--curve", "nope=benchmarks/results/levers.json"], "no line 'nope'"),
    ],
)
def test_bad_arguments_are_one_line(monkeypatch, capsys, args, says):
    monkeypatch.chdir(REPO)
    with pytest.raises(SystemExit) as stop:
        rt.main(args)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and says in err and "Traceback" not in err


def test_a_failing_command_stops_the_write_with_one_line_and_no_file_changed(tmp_path, monkeypatch, capsys):
    """A curve point with no random-init arm to hold it against: compute_curve refuses it, so nothing is written,
    not even the levers table's JSON, which would have been rewritten first."""
    import json

    monkeypatch.chdir(REPO)
    data = json.loads(rt.GENERATED["levers"].with_name("newsgroups_amx_ptlr6e4_13200_50pc_8ep.json").read_text())
    data["finetune_flags"] = "--num_train_epochs 99"
    point = tmp_path / "point.json"
    point.write_text(json.dumps(data))
    before = {path: path.read_bytes() for path in [*rt.GENERATED.values(), rt.DOC]}
    code = rt.main(["--write", "--lever", f"epochs 99={point}", "--curve", f"the defaults={point}"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "compute_curve failed" in err and "no random-init arm" in err and "--num_train_epochs 99" in err
    assert {path: path.read_bytes() for path in before} == before
