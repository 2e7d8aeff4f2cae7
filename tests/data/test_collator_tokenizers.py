"""Word starts for span targets from tokenizers of every kind (SentencePiece, WordPiece, byte-level BPE, BPE with an
end-of-word suffix, WordLevel), and XLNet's span statistics on the text they tokenize.

The reference is a direct port of zihangdai/xlnet's `_sample_mask` (data_utils.py), run on the true word starts of
the same tokens (where the tokenizer's own `word_ids()` change). Run this file as a script to print the statistics.
"""

import math
import warnings

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from xlnet_lite.collator import _PUNCTUATION, DataCollatorForXLNetPretraining, sample_spans, word_boundaries
from xlnet_lite.tokenization_xlnet_lite import SPECIAL_TOKENS, train_tokenizer, wrap_tokenizer

SYLLABLES = ["ka", "lo", "mi", "ter", "sun", "pra", "vel", "dox", "qui", "ren", "bal", "ost", "nu", "gre", "fi", "zam"]
P, MAX_N = 1 / 6, 5


def make_corpus(n_sentences=600, seed=0):
    """Sentences of Zipf-distributed made-up words of 1-4 syllables, with commas and end marks."""
    rng = np.random.default_rng(seed)
    lexicon = ["".join(rng.choice(SYLLABLES, size=rng.integers(1, 5))) for _ in range(400)]
    weights = 1 / np.arange(1, len(lexicon) + 1)
    sentences = []
    for _ in range(n_sentences):
        words = list(rng.choice(lexicon, size=rng.integers(6, 16), p=weights / weights.sum()))
        words[0] = words[0].capitalize()
        if rng.random() < 0.3:
            words[rng.integers(1, len(words) - 1)] += ","
        sentences.append(" ".join(words) + str(rng.choice([".", "!", "?"])))
    return sentences


def _trained(backend, trainer, texts, **special_tokens):
    backend.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, **special_tokens)


BERT_SPECIALS = dict(unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]", pad_token="[PAD]")
GPT_SPECIALS = dict(eos_token="<|endoftext|>", cls_token="<|cls|>", sep_token="<|sep|>", pad_token="<|pad|>")


def sentencepiece(texts):
    return train_tokenizer(texts, vocab_size=200)


def wordpiece(texts):
    backend = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(
        vocab_size=200, special_tokens=list(BERT_SPECIALS.values()), show_progress=False
    )
    return _trained(backend, trainer, texts, **BERT_SPECIALS)


def byte_level_bpe(texts):
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=list(GPT_SPECIALS.values()),
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    return _trained(backend, trainer, texts, **GPT_SPECIALS)


def end_of_word_bpe(texts):
    backend = Tokenizer(models.BPE(unk_token="[UNK]", end_of_word_suffix="</w>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.decoder = decoders.BPEDecoder(suffix="</w>")
    trainer = trainers.BpeTrainer(
        vocab_size=200, special_tokens=list(BERT_SPECIALS.values()), show_progress=False, end_of_word_suffix="</w>"
    )
    return _trained(backend, trainer, texts, **BERT_SPECIALS)


def word_level(texts):
    backend = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=list(BERT_SPECIALS.values()), show_progress=False)
    return _trained(backend, trainer, texts, **BERT_SPECIALS)


KINDS = {
    "metaspace": sentencepiece,
    "wordpiece": wordpiece,
    "byte_level": byte_level_bpe,
    "end_of_word_suffix": end_of_word_bpe,
    "word_level": word_level,
}


def encode_stream(tokenizer, sentences):
    """(ids, true word starts, sentence starts) of the sentences tokenized one by one and concatenated, as
    PretrainingStream does.

    A token starts a word where the tokenizer's own word_ids() change, where it is a single punctuation mark
    (XLNet's rule), or where it is first in its sentence.
    """
    ids, starts, firsts = [], [], []
    for sentence in sentences:
        encoding = tokenizer(sentence, add_special_tokens=False)
        words = encoding.word_ids()
        for k, (i, token) in enumerate(zip(encoding["input_ids"], encoding.tokens())):
            ids.append(i)
            starts.append(k == 0 or words[k] != words[k - 1] or token in _PUNCTUATION)
            firsts.append(k == 0)
    return torch.tensor(ids), torch.tensor(starts), torch.tensor(firsts)


@pytest.fixture(scope="module")
def corpus():
    return make_corpus()


@pytest.fixture(scope="module")
def tokenizers(corpus):
    return {kind: build(corpus) for kind, build in KINDS.items()}


@pytest.mark.parametrize("kind", list(KINDS))
def test_word_starts_match_the_tokenizers_words(tokenizers, corpus, kind):
    """Per token of the corpus, the collator's word starts are the tokenizer's own word boundaries."""
    tokenizer = tokenizers[kind]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every kind here is recognised: no fallback warning
        collator = DataCollatorForXLNetPretraining(tokenizer)
    assert collator.boundaries.kind == kind
    ids, truth, sentence_first = encode_stream(tokenizer, corpus)
    flags = collator.boundaries.flags(ids[None])[0]
    if kind == "byte_level":  # documented: a sentence's first word has no "Ġ"; every other position agrees
        assert torch.equal(flags[~sentence_first], truth[~sentence_first])
        assert not flags[sentence_first].any()
    elif kind == "end_of_word_suffix":  # a start is read from the token before it: the first token has none
        assert torch.equal(flags[1:], truth[1:]) and not flags[0]
    else:
        assert torch.equal(flags, truth)
    assert 0.5 < truth.float().mean() < 0.9 or kind == "word_level"


SAMPLE = "lo pravelter ka, doxqui nu."
T, F = True, False


@pytest.mark.parametrize(
    "kind,pieces,expected",
    [
        (
            "metaspace",
            ["▁lo", "▁", "pra", "vel", "ter", "▁ka", ",", "▁dox", "qui", "▁nu", "."],
            [T, T, F, F, F, T, T, T, F, T, T],
        ),
        (
            "wordpiece",
            ["lo", "pra", "##vel", "##ter", "ka", ",", "dox", "##qui", "nu", "."],
            [T, T, F, F, T, T, T, F, T, T],
        ),
        # the text's first word has no space before it, so no "Ġ": not seen as a word start
        (
            "byte_level",
            ["lo", "Ġpra", "vel", "ter", "Ġka", ",", "Ġdox", "qui", "Ġnu", "."],
            [F, T, F, F, T, T, T, F, T, T],
        ),
        # a start is read from the "</w>" of the token before it: the first token has none
        (
            "end_of_word_suffix",
            ["lo</w>", "pra", "vel", "ter</w>", "ka</w>", ",</w>", "dox", "qui</w>", "nu</w>", ".</w>"],
            [F, T, F, F, T, T, T, F, T, T],
        ),
        ("word_level", ["lo", "[UNK]", "ka", ",", "doxqui", "nu", "."], [T] * 7),
    ],
)
def test_known_words(tokenizers, kind, pieces, expected):
    """Multi-piece words ("pravelter", "doxqui"): only their first piece starts a word; punctuation does."""
    tokenizer = tokenizers[kind]
    encoding = tokenizer(SAMPLE, add_special_tokens=False)
    assert encoding.tokens() == pieces
    flags = DataCollatorForXLNetPretraining(tokenizer).boundaries.flags(torch.tensor([encoding["input_ids"]]))
    assert flags[0].tolist() == expected
    special = [tokenizer.sep_token_id, tokenizer.cls_token_id, tokenizer.pad_token_id]
    assert word_boundaries(tokenizer).starts[special].all(), "special tokens start a word"


def xlnet_is_start_piece(piece):
    """zihangdai/xlnet data_utils._is_start_piece, verbatim."""
    special_pieces = set(list('!"#$%&"()*+,-./:;?@[\\]^_`{|}~'))
    return piece.startswith("▁") or piece.startswith("<") or piece in special_pieces


def test_sentencepiece_keeps_xlnets_rule(tokenizers):
    """SentencePiece vocabularies (read from the Metaspace step, or from "▁" pieces of a bare Unigram model, as in
    test_collator.py) get exactly XLNet's _is_start_piece on every piece, so their targets are unchanged."""
    vocab = (
        [(t, 0.0) for t in SPECIAL_TOKENS]
        + [(f"▁w{i}", -1.0) for i in range(40)]
        + [(f"x{i}", -2.0) for i in range(40)]
    )
    bare = wrap_tokenizer(Tokenizer(models.Unigram(vocab, unk_id=0)))
    for tokenizer in (tokenizers["metaspace"], bare):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            boundaries = word_boundaries(tokenizer)
        pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        assert boundaries.kind == "metaspace" and boundaries.ends is None
        assert boundaries.starts.tolist() == [xlnet_is_start_piece(p) for p in pieces]
        assert 0 < boundaries.starts.float().mean() < 1


def xlnet_sample_mask(is_start, goal, rng):
    """zihangdai/xlnet data_utils._sample_mask (alpha 6, beta 1, max_gram 5) on a row of true word starts."""
    seg_len, mask, num_predict, cur = len(is_start), np.zeros(len(is_start), dtype=bool), 0, 0
    pvals = 1 / np.arange(1, MAX_N + 1)
    while cur < seg_len and num_predict < goal:
        n = min(int(rng.choice(np.arange(1, MAX_N + 1), p=pvals / pvals.sum())), goal - num_predict)
        ctx = n * 6
        l_ctx = int(rng.integers(ctx))
        beg = cur + l_ctx
        while beg < seg_len and not is_start[beg]:
            beg += 1
        end = beg + n  # XLNet's n-gram loop ends n tokens after beg
        if end >= seg_len:
            break
        mask[beg:end] = True
        num_predict += n
        cur = end + ctx - l_ctx
    while num_predict < goal:
        i = int(rng.integers(seg_len))
        if not mask[i]:
            mask[i], num_predict = True, num_predict + 1
    return mask


def run_lengths(mask):
    """Lengths of the runs of consecutive True in each row of a (R, L) bool array."""
    padded = np.pad(np.asarray(mask, dtype=np.int8), ((0, 0), (1, 1)))
    edges = np.diff(padded, axis=1)
    return np.nonzero(edges == -1)[1] - np.nonzero(edges == 1)[1]


def span_statistics(tokenizer, corpus, *, seeds=24, rows=8, seq_len=128):
    """Mean length of the runs of targets: the collator's and XLNet's reference on the same rows."""
    ids, truth, _ = encode_stream(tokenizer, corpus)
    ours, reference = [], []
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        offsets = rng.integers(0, len(ids) - seq_len, size=rows)
        reversed_rows = np.arange(rows) % 2 == 1
        examples = [
            {"input_ids": ids[o : o + seq_len].flip(0) if r else ids[o : o + seq_len], "is_reversed": bool(r)}
            for o, r in zip(offsets, reversed_rows)
        ]
        out = DataCollatorForXLNetPretraining(tokenizer, plm_probability=P, max_span_length=MAX_N, seed=seed)(examples)
        targets = (out["target_mapping"].sum(1) > 0).numpy()
        targets[reversed_rows] = targets[reversed_rows, ::-1]  # back to text order
        ours.append(run_lengths(targets))
        goal = math.ceil(seq_len * P)
        xlnet = [xlnet_sample_mask(truth[o : o + seq_len].numpy(), goal, rng) for o in offsets]
        reference.append(run_lengths(np.stack(xlnet)))
    return float(np.concatenate(ours).mean()), float(np.concatenate(reference).mean())


@pytest.mark.parametrize("kind", list(KINDS))
def test_target_runs_match_xlnets_reference(tokenizers, corpus, kind):
    """Over many seeds the runs of targets are as long as XLNet's own sampler makes them on the true word starts.

    With word starts missing (the "▁"-only rule on a WordPiece or byte-level vocabulary) the spans find few places
    to start, the random single-token fill takes over, and the mean run drops from ~1.8 to ~1.5.
    """
    ours, reference = span_statistics(tokenizers[kind], corpus)
    assert abs(ours - reference) < 0.1, (kind, ours, reference)


@pytest.mark.parametrize("kind", list(KINDS))
def test_spans_follow_xlnets_law_on_real_text(tokenizers, corpus, kind):
    """sample_spans with the collator's word starts, unbounded budget: lengths n with P(n) ∝ 1/n, one span per
    (1 + 1/p) E[n] tokens (n targets in a context of n/p), and every span at a true word start."""
    tokenizer = tokenizers[kind]
    ids, truth, _ = encode_stream(tokenizer, corpus)
    L = 2048
    R = len(ids) // L
    rows, truth = ids[: R * L].view(R, L), truth[: R * L].view(R, L)
    start_ok = DataCollatorForXLNetPretraining(tokenizer).boundaries.flags(rows)
    everything = torch.ones_like(start_ok)
    lengths, begins, seeds = [], [], 8
    for seed in range(seeds):
        b, e = sample_spans(
            start_ok,
            everything,
            torch.full((R,), L),
            torch.zeros(R, dtype=torch.long),
            plm_probability=P,
            max_span_length=MAX_N,
            generator=torch.Generator().manual_seed(seed),
        )
        real = e > b
        lengths.append((e - b)[real])
        begins.append(truth.gather(1, b)[real])
    lengths, at_word_start = torch.cat(lengths), torch.cat(begins)
    law = 1 / torch.arange(1, MAX_N + 1, dtype=torch.float64)
    law /= law.sum()
    mean_n = float((law * torch.arange(1, MAX_N + 1)).sum())
    freq = torch.bincount(lengths, minlength=MAX_N + 1)[1:].double() / len(lengths)
    assert torch.allclose(freq, law, atol=0.03), (kind, freq, law)
    assert abs(float(lengths.double().mean()) - mean_n) < 0.08
    spans_per_token = len(lengths) / (seeds * R * L)
    assert spans_per_token > 0.9 / ((1 + 1 / P) * mean_n), "spans find too few word starts to begin at"
    assert at_word_start.all(), "a span begins inside a word"


def test_unknown_kind_warns_and_treats_every_token_as_a_word_start(corpus):
    backend = Tokenizer(models.BPE(unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()  # pieces carry no word marker at all
    trainer = trainers.BpeTrainer(vocab_size=150, special_tokens=list(BERT_SPECIALS.values()), show_progress=False)
    tokenizer = _trained(backend, trainer, corpus, **BERT_SPECIALS)
    with pytest.warns(UserWarning, match="cannot tell where words start.*word_starts"):
        collator = DataCollatorForXLNetPretraining(tokenizer)
    assert collator.boundaries.kind == "unknown" and collator.boundaries.starts.all()
    given = torch.zeros(len(tokenizer), dtype=torch.bool)
    given[::2] = True
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        collator = DataCollatorForXLNetPretraining(tokenizer, word_starts=given)
    assert collator.boundaries.kind == "given" and torch.equal(collator.boundaries.starts, given)
    with pytest.raises(ValueError, match="word_starts"):
        DataCollatorForXLNetPretraining(tokenizer, word_starts=given[:-1])
    with pytest.raises(ValueError, match="word_starts"):
        DataCollatorForXLNetPretraining(tokenizer, word_starts=given.long())


if __name__ == "__main__":
    sentences = make_corpus()
    for name, build in KINDS.items():
        ours, reference = span_statistics(build(sentences), sentences)
        print(f"{name:20s} mean target run: collator {ours:.3f}, XLNet reference {reference:.3f}")
