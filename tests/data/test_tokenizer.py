"""train_tokenizer: XLNet special tokens and templates, round trips, XLNetTokenizerFast compatibility, loading
without xlnet_lite."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from model_helpers import BLOCK_XLNET_LITE
from transformers import AutoTokenizer, XLNetTokenizerFast

import xlnet_lite
from xlnet_lite.collator import DataCollatorForXLNetPretraining
from xlnet_lite.data import PretrainingStream
from xlnet_lite.tokenization_xlnet_lite import SPECIAL_TOKENS, load_tokenizer, train_tokenizer

CORPUS = [
    f"The {adj} {noun} of {place} {verb} the {noun2} in {year}."
    for adj in ("old", "quiet", "famous", "small", "busy")
    for noun in ("market", "bridge", "museum", "harbour")
    for place, verb, noun2, year in (
        ("Lyon", "opened", "gate", 1901),
        ("Oslo", "closed", "road", 1987),
        ("Quito", "rebuilt", "tower", 2011),
    )
]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(CORPUS, vocab_size=120)


def test_special_ids_and_templates(tokenizer):
    assert tokenizer.convert_tokens_to_ids(SPECIAL_TOKENS) == list(range(8))
    assert (tokenizer.sep_token_id, tokenizer.cls_token_id, tokenizer.pad_token_id) == (4, 3, 5)
    single = tokenizer("The old bridge")
    assert single["input_ids"][-2:] == [4, 3]
    assert single["token_type_ids"] == [0] * (len(single["input_ids"]) - 1) + [2]
    pair = tokenizer("The old bridge", "of Oslo")
    ids, types = pair["input_ids"], pair["token_type_ids"]
    first_sep = ids.index(4)
    assert ids[-2:] == [4, 3] and ids.count(4) == 2
    assert types == [0] * (first_sep + 1) + [1] * (len(ids) - first_sep - 2) + [2]
    assert (
        tokenizer.decode(tokenizer("The famous museum", add_special_tokens=False)["input_ids"]) == "The famous museum"
    )


def test_left_padding_with_type_three(tokenizer):
    batch = tokenizer(["The old bridge of Lyon opened", "Oslo"], padding=True)
    short_ids, short_types, short_mask = batch["input_ids"][1], batch["token_type_ids"][1], batch["attention_mask"][1]
    n_pad = short_mask.count(0)
    assert n_pad > 0 and short_mask[:n_pad] == [0] * n_pad
    assert short_ids[:n_pad] == [5] * n_pad and short_ids[-1] == 3
    assert short_types[:n_pad] == [3] * n_pad


def test_round_trip(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    texts = ["The busy harbour of Quito", "Unseen wörds, ünïcode"]
    for loaded in (AutoTokenizer.from_pretrained(tmp_path), load_tokenizer(tmp_path)):
        assert loaded.padding_side == "left"
        for text in texts:
            assert loaded(text, "of Lyon").data == tokenizer(text, "of Lyon").data
    assert load_tokenizer(tmp_path)(texts, padding=True).data == tokenizer(texts, padding=True).data


def test_train_from_files(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    from_files = train_tokenizer([path], vocab_size=120)
    from_strings = train_tokenizer([str(path)], vocab_size=120)
    from_texts = train_tokenizer(CORPUS, vocab_size=120)
    assert from_files.backend_tokenizer.to_str() == from_strings.backend_tokenizer.to_str()
    assert from_files.backend_tokenizer.to_str() == from_texts.backend_tokenizer.to_str()
    ids = from_files(CORPUS[0], add_special_tokens=False)["input_ids"]
    assert 0 not in ids and from_files.decode(ids) == CORPUS[0]


def test_empty_corpus_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="texts_or_files"):
        train_tokenizer([], vocab_size=100)
    with pytest.raises(ValueError, match="texts_or_files"):
        train_tokenizer(["   ", "\n"], vocab_size=100)
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n", encoding="utf-8")
    with pytest.raises(ValueError, match="texts_or_files"):
        train_tokenizer([blank], vocab_size=100)


def test_xlnet_tokenizer_fast_works_in_the_pipeline(tokenizer, tmp_path):
    """transformers' XLNetTokenizerFast on the same tokenizer.json: same encodings, same samples."""
    tokenizer.save_pretrained(tmp_path)
    xlnet = XLNetTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    for text in CORPUS[:10]:
        assert xlnet(text, "the road")["input_ids"] == tokenizer(text, "the road")["input_ids"]
    texts = CORPUS * 4
    kwargs = dict(batch_size=2, seq_len=24, reuse_len=8, seed=3)
    ours = PretrainingStream(texts, tokenizer, **kwargs).next_batch()
    theirs = PretrainingStream(texts, xlnet, **kwargs).next_batch()
    for a, b in zip(ours, theirs):
        assert (a["input_ids"] == b["input_ids"]).all() and (a["token_type_ids"] == b["token_type_ids"]).all()
    out_a = DataCollatorForXLNetPretraining(tokenizer, reuse_len=8, seed=0)(ours)
    out_b = DataCollatorForXLNetPretraining(xlnet, reuse_len=8, seed=0)(theirs)
    assert all((out_a[k] == out_b[k]).all() for k in out_a)


# Loading the saved tokenizer where xlnet_lite cannot be imported, with transformers' AutoTokenizer alone.
CLEAN_LOAD = BLOCK_XLNET_LITE + textwrap.dedent(
    """
    import json, sys
    from transformers import AutoTokenizer
    loads, texts = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    results = []
    for folder, kwargs in loads:
        tokenizer = AutoTokenizer.from_pretrained(folder, **kwargs)
        results.append({"pad_token_type_id": tokenizer.pad_token_type_id, "padding_side": tokenizer.padding_side,
                        "pair": tokenizer(texts[0], texts[1]).data, "batch": tokenizer(texts, padding=True).data})
    print("\\nRESULTS", json.dumps(results))  # after whatever a prompt printed
    """
)
TEXTS = ["The busy harbour of Quito", "Oslo", "Unseen wörds"]


@pytest.fixture(scope="module")
def clean_loads(tokenizer, tmp_path_factory):
    """Loads in fresh processes, run side by side: stdin closed (so a remote-code prompt is answered at once),
    HF_HOME and the working directory in a temporary folder. Returns, per process, what it printed before its
    results, its stderr and the results of its loads."""
    root = tmp_path_factory.mktemp("clean_loads")
    tokenizer.save_pretrained(root / "tokenizer_only")
    config = xlnet_lite.XLNetLiteConfig(vocab_size=len(tokenizer), d_model=32, n_layer=2, n_head=4, d_inner=48)
    xlnet_lite.XLNetLiteModel(config).save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    processes = {
        "silent": [(str(root / "tokenizer_only"), {}), (str(root / "model"), {"trust_remote_code": True})],
        "model_plain": [(str(root / "model"), {})],
    }
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    runs = {}
    for name, loads in processes.items():
        workdir = root / f"run_{name}"  # not the package's folder: nothing on sys.path can stand in for xlnet_lite
        workdir.mkdir()
        command = [sys.executable, "-c", CLEAN_LOAD, json.dumps(loads), json.dumps(TEXTS)]
        runs[name] = subprocess.Popen(
            command,
            cwd=workdir,
            env={**env, "HF_HOME": str(workdir / "hf_home"), "HF_HUB_OFFLINE": "1"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    results = {}
    for name, process in runs.items():
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-3000:]
        printed, loads = out.split("\nRESULTS ")
        results[name] = {"printed": printed, "stderr": err, "loads": json.loads(loads)}
    return results


def assert_encodes_like(loaded, tokenizer):
    assert loaded["padding_side"] == "left"
    assert loaded["pair"] == tokenizer(TEXTS[0], TEXTS[1]).data
    expected = tokenizer(TEXTS, padding=True).data
    assert loaded["batch"]["input_ids"] == expected["input_ids"]
    assert loaded["batch"]["attention_mask"] == expected["attention_mask"]
    for got, want, mask in zip(
        loaded["batch"]["token_type_ids"], expected["token_type_ids"], expected["attention_mask"]
    ):
        assert [g for g, m in zip(got, mask) if m] == [w for w, m in zip(want, mask) if m]


@pytest.mark.slow
def test_loads_silently_where_xlnet_lite_is_missing(clean_loads, tokenizer):
    """A tokenizer folder (pretraining's output_dir/tokenizer) loads with plain AutoTokenizer.from_pretrained, a
    model folder with trust_remote_code=True (the config's code, which the model needs anyway): no prompt, no
    warning, the same encodings; padded positions get token type 0, not 3 (see the next test)."""
    run = clean_loads["silent"]
    assert run["printed"] == "" and run["stderr"] == ""
    for loaded in run["loads"]:
        assert_encodes_like(loaded, tokenizer)


@pytest.mark.xfail(
    strict=True,
    reason=(
        "transformers 5.23: AutoTokenizer.from_pretrained loads config.json with AutoConfig before it reads "
        "tokenizer_config.json, and a config with auto_map and an unregistered model_type asks 'run the custom code? "
        "[y/N]' whatever the tokenizer files say; and no built-in tokenizer class keeps pad_token_type_id 3 "
        "(XLNetTokenizer sets it before PreTrainedTokenizerBase.__init__ resets it to 0)."
    ),
)
def test_plain_autotokenizer_on_a_model_folder(clean_loads, tokenizer):
    run = clean_loads["model_plain"]
    [loaded] = run["loads"]
    assert_encodes_like(loaded, tokenizer)
    assert run["printed"] == "" and run["stderr"] == ""
    assert loaded["pad_token_type_id"] == 3
