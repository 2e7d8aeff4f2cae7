"""Train a SentencePiece-style Unigram tokenizer with XLNet's special tokens and templates.

The tokenizer is built with the `tokenizers` library and returned as a transformers
`PreTrainedTokenizerFast`. Its normalizer and pre-tokenizer are the ones transformers' own
`XLNetTokenizer` uses (quotes, NFKD, accents stripped, whitespace split, Metaspace "▁"), so an
`XLNetTokenizer` built from the same vocabulary encodes every text identically.

Layout (as in XLNet): a single text is `A <sep> <cls>` with token_type_ids 0.., 0, 2; a pair is
`A <sep> B <sep> <cls>` with 0.., 0, 1.., 1, 2; padding goes on the LEFT so `<cls>` stays last.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

# XLNet's vocabulary starts with these pieces, in this order (zihangdai/xlnet data_utils.py).
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<cls>", "<sep>", "<pad>", "<mask>", "<eod>"]
XLNET_PAD_TOKEN_TYPE_ID = 3  # transformers' XLNetTokenizer pads token_type_ids with 3


def _backend_tokenizer() -> Tokenizer:
    """An untrained Unigram tokenizer with XLNet's normalizer, pre-tokenizer and decoder."""
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.Sequence(
        [
            normalizers.Replace("``", '"'),
            normalizers.Replace("''", '"'),
            normalizers.NFKD(),
            normalizers.StripAccents(),
        ]
    )
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.WhitespaceSplit(),
            pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always"),
        ]
    )
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    return tok


def _xlnet_post_processor(sep_id: int, cls_id: int) -> processors.TemplateProcessing:
    return processors.TemplateProcessing(
        single="$A:0 <sep>:0 <cls>:2",
        pair="$A:0 <sep>:0 $B:1 <sep>:1 <cls>:2",
        special_tokens=[("<sep>", sep_id), ("<cls>", cls_id)],
    )


def _as_file_list(texts_or_files) -> list[str] | None:
    """The list of file paths if `texts_or_files` is a list/tuple of existing paths, else None."""
    if isinstance(texts_or_files, (str, os.PathLike)):
        raise ValueError(
            "texts_or_files must be an iterable of texts or a list of file paths, not a single "
            f"{type(texts_or_files).__name__}; wrap it in a list."
        )
    if not isinstance(texts_or_files, (list, tuple)) or not texts_or_files:
        return None
    if all(isinstance(p, Path) for p in texts_or_files):
        paths = [str(p) for p in texts_or_files]
    elif all(isinstance(p, str) and "\n" not in p and len(p) < 4096 and os.path.isfile(p) for p in texts_or_files):
        paths = list(texts_or_files)
    else:
        return None
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise ValueError(f"texts_or_files: file not found: {missing[0]}")
    return paths


def _non_empty_texts(texts: Iterable[str], seen: list[bool]):
    for text in texts:
        if not isinstance(text, str):
            raise ValueError(f"texts_or_files must contain strings, got {type(text).__name__}")
        if text.strip():
            seen[0] = True
            yield text


def _files_have_text(paths: list[str]) -> bool:
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.strip():
                    return True
    return False


def wrap_tokenizer(backend: Tokenizer) -> PreTrainedTokenizerFast:
    """Wrap a `tokenizers.Tokenizer` holding XLNet's special tokens as a transformers tokenizer.

    Sets the special tokens, left padding, `token_type_ids` among the model inputs and
    XLNet's padding token type id 3.
    """
    ids = {t: backend.token_to_id(t) for t in SPECIAL_TOKENS}
    missing = [t for t, i in ids.items() if i is None]
    if missing:
        raise ValueError(f"backend tokenizer lacks the special tokens {missing}")
    backend.post_processor = _xlnet_post_processor(ids["<sep>"], ids["<cls>"])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        cls_token="<cls>",
        sep_token="<sep>",
        pad_token="<pad>",
        mask_token="<mask>",
        additional_special_tokens=["<eod>"],
        padding_side="left",
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    )
    tokenizer._pad_token_type_id = XLNET_PAD_TOKEN_TYPE_ID
    return tokenizer


def train_tokenizer(
    texts_or_files,
    vocab_size: int = 8000,
    *,
    max_piece_length: int = 16,
    show_progress: bool = False,
) -> PreTrainedTokenizerFast:
    """Train a Unigram (SentencePiece-style, Metaspace "▁") tokenizer with XLNet's special tokens.

    Args:
        texts_or_files: an iterable of texts (strings), or a list of paths (str or Path) of
            UTF-8 text files.
        vocab_size: size of the vocabulary including the 8 special tokens. A small corpus may
            yield fewer pieces than asked for.
        max_piece_length: longest piece, in characters.
        show_progress: show the `tokenizers` progress bar.

    Returns:
        A `PreTrainedTokenizerFast` with ids `<unk>`=0, `<s>`=1, `</s>`=2, `<cls>`=3, `<sep>`=4,
        `<pad>`=5, `<mask>`=6, `<eod>`=7, that encodes a text as `A <sep> <cls>` and a pair as
        `A <sep> B <sep> <cls>` (token_type_ids 0/1/2), pads on the left with token type 3.
        Save it with `save_pretrained`; reload with `AutoTokenizer.from_pretrained` or
        `load_tokenizer` (which also restores the padding token type id 3, something
        transformers does not persist).

    Raises:
        ValueError: if the corpus is empty or holds only whitespace, or a file is missing.
    """
    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must be larger than {len(SPECIAL_TOKENS)}, got {vocab_size}")
    backend = _backend_tokenizer()
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        unk_token="<unk>",
        max_piece_length=max_piece_length,
        show_progress=show_progress,
    )
    paths = _as_file_list(texts_or_files)
    if paths is not None:
        if not _files_have_text(paths):
            raise ValueError(f"texts_or_files: the files {paths} hold no text (empty or whitespace only)")
        backend.train(paths, trainer)
    else:
        seen = [False]
        backend.train_from_iterator(_non_empty_texts(texts_or_files, seen), trainer)
        if not seen[0]:
            raise ValueError("texts_or_files is empty or holds only whitespace: nothing to train a tokenizer on")
    for expected_id, token in enumerate(SPECIAL_TOKENS):
        assert backend.token_to_id(token) == expected_id, (token, backend.token_to_id(token))
    return wrap_tokenizer(backend)


def load_tokenizer(name_or_path: str | os.PathLike, **kwargs) -> PreTrainedTokenizerBase:
    """`AutoTokenizer.from_pretrained`, then restore XLNet's padding token type id 3.

    transformers does not save `pad_token_type_id`, so a reloaded tokenizer pads token_type_ids
    with 0 (transformers 5's own XLNetTokenizer does too). Only padded positions differ.
    """
    tokenizer = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    if "token_type_ids" not in tokenizer.model_input_names:
        tokenizer.model_input_names = [*tokenizer.model_input_names, "token_type_ids"]
    tokenizer._pad_token_type_id = XLNET_PAD_TOKEN_TYPE_ID
    return tokenizer


def special_token_ids(tokenizer: PreTrainedTokenizerBase) -> dict[str, int | None]:
    """Ids of XLNet's special tokens, looked up by token string (None where the vocab lacks one).

    Works for tokenizers from `train_tokenizer` and for transformers' `XLNetTokenizer(Fast)`.
    """
    vocab = tokenizer.get_vocab()
    ids = {token: vocab.get(token) for token in SPECIAL_TOKENS}
    for name, attr in (("<sep>", "sep_token_id"), ("<cls>", "cls_token_id"), ("<pad>", "pad_token_id")):
        value = getattr(tokenizer, attr, None)
        if value is not None:
            ids[name] = value
    return ids
