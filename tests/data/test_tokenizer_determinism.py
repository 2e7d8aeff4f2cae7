"""train_tokenizer is deterministic: byte-identical tokenizer.json across processes, thread counts, input order and
input form; the EM that makes it so computes true expectations and reads the same words as the trainer."""

import itertools
import json
import math
import os
import random
import subprocess
import sys
import textwrap
from collections import Counter

import numpy as np
import pytest

import xlnet_lite.tokenization_xlnet_lite as tokenization
from xlnet_lite.tokenization_xlnet_lite import (
    SPECIAL_TOKENS,
    _backend_tokenizer,
    _expected_counts,
    _lattice,
    _WordCounter,
    train_tokenizer,
)


def corpus(n=150, seed=0):
    """Sentences from a small lexicon with some rare words, accents and punctuation: many tied counts."""
    rng = random.Random(seed)
    lexicon = (
        "the market bridge museum harbour opened closed rebuilt quiet famous Lyon Oslo Quito Zürich "
        "café naïve tower gate road in of and 1901 1987 2011 (rare) x-ray co-op ‘quoted’"
    ).split()
    return [" ".join(rng.choice(lexicon) for _ in range(rng.randint(3, 12))) + rng.choice(".!?") for _ in range(n)]


VOCAB_SIZE = 90

TRAIN = textwrap.dedent(
    """
    import importlib.util, json, sys
    module_file, texts_file, vocab_size, folder = sys.argv[1:]
    spec = importlib.util.spec_from_file_location("tokenization_xlnet_lite", module_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # the module alone: the package's torch models are not needed to train
    texts = json.loads(open(texts_file, encoding="utf-8").read())
    module.train_tokenizer(texts, vocab_size=int(vocab_size)).save_pretrained(folder)
    """
)


@pytest.mark.slow
def test_same_file_in_separate_processes_and_thread_counts(tmp_path):
    """The trainer's word map is seeded afresh in every process: two processes (1 and 2 rayon threads, set before
    the pool starts) and this one must still write the same bytes."""
    texts_file = tmp_path / "texts.json"
    texts_file.write_text(json.dumps(corpus()), encoding="utf-8")
    runs = {}
    for threads in ("1", "2"):
        env = {**os.environ, "RAYON_NUM_THREADS": threads, "HF_HUB_OFFLINE": "1"}
        folder = tmp_path / f"threads{threads}"
        command = [sys.executable, "-c", TRAIN, tokenization.__file__, str(texts_file), str(VOCAB_SIZE), str(folder)]
        runs[folder] = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    train_tokenizer(corpus(), vocab_size=VOCAB_SIZE).save_pretrained(tmp_path / "here")
    for process in runs.values():
        _, err = process.communicate(timeout=300)
        assert process.returncode == 0, err[-3000:]
    files = [(folder / "tokenizer.json").read_bytes() for folder in [*runs, tmp_path / "here"]]
    assert files[0] == files[1] == files[2]


def test_same_file_whatever_the_order_and_form_of_the_input(tmp_path):
    texts = corpus()
    reference = train_tokenizer(texts, vocab_size=VOCAB_SIZE).backend_tokenizer.to_str()
    assert train_tokenizer(texts[::-1], vocab_size=VOCAB_SIZE).backend_tokenizer.to_str() == reference
    assert train_tokenizer(iter(texts), vocab_size=VOCAB_SIZE).backend_tokenizer.to_str() == reference
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(texts) + "\n", encoding="utf-8")
    assert train_tokenizer([path], vocab_size=VOCAB_SIZE).backend_tokenizer.to_str() == reference


def test_vocabulary_is_ranked_by_score_then_text():
    tokenizer = train_tokenizer(corpus(), vocab_size=VOCAB_SIZE)
    pieces = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["vocab"][len(SPECIAL_TOKENS) :]
    assert pieces == sorted(pieces, key=lambda ps: (-ps[1], ps[0]))
    assert len({score for _, score in pieces}) < len(pieces)  # ties exist, so the text order is exercised


def test_word_counter_reads_the_words_the_trainer_reads():
    backend = _backend_tokenizer()
    odd = "a▁b ▁ ▁▁x y▁ \u3000z\u2003w\x85v\x1cu \u200bq ``hi'' ’ \u180e k\u2028m"  # "▁" inside words, odd spaces
    texts = [odd, "Crème brûlée\tnaïve  café\n", *corpus(20)]
    counter = _WordCounter(backend)
    for text in texts:
        counter.add(text)
    expected = Counter(
        word
        for text in texts
        for word, _ in backend.pre_tokenizer.pre_tokenize_str(backend.normalizer.normalize_str(text))
    )
    assert dict(counter.sorted_items()) == expected


def brute_force_expected_counts(words, counts, pieces, scores):
    """Expected piece counts by enumerating every segmentation of every word."""
    index = {p: i for i, p in enumerate(pieces)}
    expected = np.zeros(len(pieces))
    for word, count in zip(words, counts):
        segmentations = []
        for cuts in itertools.product([0, 1], repeat=len(word) - 1):
            bounds = [0] + [i + 1 for i, c in enumerate(cuts) if c] + [len(word)]
            parts = [word[a:b] for a, b in zip(bounds, bounds[1:])]
            if all(p in index for p in parts):
                segmentations.append([index[p] for p in parts])
        weights = [math.exp(sum(scores[i] for i in seg)) for seg in segmentations]
        for seg, weight in zip(segmentations, weights):
            for i in seg:
                expected[i] += count * weight / sum(weights)
    return expected


def test_forward_backward_matches_enumeration():
    words = ["▁abab", "▁ba", "▁abc", "▁c", "▁aabbcc"]
    counts = np.array([3.0, 1.0, 2.0, 5.0, 1.0])
    pieces = ["▁", "a", "b", "c", "▁a", "ab", "ba", "bc", "abc", "▁ab", "aab", "bcc"]
    scores = np.log(np.random.default_rng(0).uniform(0.05, 1.0, len(pieces)))
    np.testing.assert_allclose(
        _expected_counts(_lattice(words, pieces), counts, scores),
        brute_force_expected_counts(words, counts, pieces, scores),
        rtol=1e-12,
    )


@pytest.mark.parametrize("n_docs", [1, 40])
def test_all_characters_stay_in_the_vocabulary(n_docs):
    text = " ".join(corpus(n_docs, seed=1))
    tokenizer = train_tokenizer([text], vocab_size=VOCAB_SIZE)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids) == tokenizer.backend_tokenizer.normalizer.normalize_str(text)
