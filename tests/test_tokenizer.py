"""train_tokenizer: XLNet special tokens and templates, round trips, XLNetTokenizerFast compatibility."""

import pytest
from transformers import AutoTokenizer, XLNetTokenizerFast

from xlnet_lite.collator import DataCollatorForXLNetPretraining
from xlnet_lite.data import PretrainingStream
from xlnet_lite.tokenization_xlnet_lite import SPECIAL_TOKENS, load_tokenizer, train_tokenizer

CORPUS = [
    f"The {adj} {noun} of {place} {verb} the {noun2} in {year}."
    for adj in ("old", "quiet", "famous", "small", "busy")
    for noun in ("market", "bridge", "museum", "harbour")
    for place, verb, noun2, year in (("Lyon", "opened", "gate", 1901), ("Oslo", "closed", "road", 1987),
                                     ("Quito", "rebuilt", "tower", 2011))
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
    assert tokenizer.decode(tokenizer("The famous museum", add_special_tokens=False)["input_ids"]) == "The famous museum"


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
    assert set(from_files.get_vocab()) == set(from_strings.get_vocab())  # ids of tied pieces may vary
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
