"""Partial-prediction targets and permutation masks for XLNet pretraining.

Reproduces zihangdai/xlnet: `_sample_mask` (span targets) in data_utils.py and `_local_perm`
(factorization order, perm_mask) as used by its `get_dataset` parser, vectorised in torch.

Conventions (transformers' XLNet): `perm_mask[b, i, j] = 1` means position i may NOT attend to
position j; `target_mapping[b, k]` is a one-hot row selecting the k-th target position.
Unlike transformers' `DataCollatorForPermutationLanguageModeling`, the input is not corrupted
with `<mask>` (the query stream never sees a target's own token anyway), only about
`plm_probability` of the tokens are targets, and `target_mapping` has P = ceil(T * p) rows.
"""

from __future__ import annotations

import json
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from tokenizers import decoders, pre_tokenizers

from .tokenization_xlnet_lite import special_token_ids

XLNET_PAD_TOKEN_TYPE_ID = 3
_PUNCTUATION = set('!"#$%&"()*+,-./:;?@[\\]^_`{|}~')


@dataclass(frozen=True)
class WordBoundaries:
    """Word starts per vocabulary id (see `word_boundaries`).

    Attributes:
        kind: how they were found ("metaspace", "wordpiece", "byte_level", "end_of_word_suffix",
            "word_level", "given" or "unknown").
        starts: (V,) bool, True where the token begins a word.
        ends: (V,) bool or None, True where the token ends a word, so that the next one begins one.
    """

    kind: str
    starts: torch.Tensor
    ends: torch.Tensor | None = None

    def flags(self, ids: torch.Tensor) -> torch.Tensor:
        """(R, L) token ids in text order -> (R, L) bool, True where a word starts."""
        ids = ids.clamp(0, len(self.starts) - 1)
        flags = self.starts[ids]
        if self.ends is not None:  # the first token has no predecessor: a start only if special
            flags[:, 1:] |= self.ends[ids[:, :-1]]
        return flags


def word_boundaries(tokenizer) -> WordBoundaries:
    """Where words start, per vocabulary id, read from the tokenizer itself.

    Span targets begin at word starts (XLNet's `_is_start_piece`). How a piece marks one depends
    on the tokenizer, so its kind is read from the `tokenizers` backend (model, normalizer,
    pre-tokenizer, decoder):

    - "metaspace" (SentencePiece: XLNet, T5, ALBERT, Llama 2): a piece that begins with the
      marker "▁" starts a word, and so do "<...>" pieces and single punctuation marks. This is
      XLNet's own rule, unchanged.
    - "wordpiece" (BERT, or a BPE with a continuing-subword prefix): a piece without the
      prefix ("##") starts a word.
    - "byte_level" (GPT-2, RoBERTa, Llama 3): a piece whose first byte is whitespace ("Ġ",
      "Ċ") starts a word, and so do single punctuation marks. The first word of a text has no
      space before it and is not seen as a start; PretrainingStream encodes sentence by
      sentence, so that is each sentence's first word.
    - "end_of_word_suffix" (CLIP, OpenAI GPT: "</w>"): a piece that ends with the suffix ends a
      word, so the next piece starts one; the first piece of a row (or part) is not a start.
    - "word_level": every token is a word.

    Special and added tokens always start a word. A tokenizer of none of these kinds whose
    pieces still carry "▁" (a tenth of them or more) gets XLNet's rule. Any other (a custom
    Python tokenizer; a BPE or Unigram model whose pieces carry no word marker) gets every token
    as a word start, with a warning: spans then keep XLNet's length law but may begin inside a
    word. Pass `word_starts` to the collator to set them yourself.
    """
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    added = _added_token_ids(tokenizer)
    always = torch.tensor([p is None or i in added for i, p in enumerate(pieces)], dtype=torch.bool)
    kind, arg = _tokenizer_kind(tokenizer, pieces)
    if kind == "metaspace":
        starts = [p is not None and (p.startswith(arg) or p.startswith("<") or p in _PUNCTUATION) for p in pieces]
    elif kind == "wordpiece":
        starts = [p is not None and not p.startswith(arg) for p in pieces]
    elif kind == "byte_level":
        spaces = _byte_level_whitespace()
        starts = [p is not None and (p[:1] in spaces or p in _PUNCTUATION) for p in pieces]
    elif kind == "end_of_word_suffix":
        ends = torch.tensor([p is not None and p.endswith(arg) for p in pieces]) | always
        return WordBoundaries(kind, always.clone(), ends)
    else:
        if kind == "unknown":
            warnings.warn(
                f"DataCollatorForXLNetPretraining: cannot tell where words start from this tokenizer ({arg}); "
                "every token counts as a word start, so span targets may begin inside words. Pass "
                "word_starts=<bool per vocabulary id> to the collator to set them.",
                UserWarning,
                stacklevel=2,
            )
        starts = [True] * len(pieces)
    return WordBoundaries(kind, torch.tensor(starts, dtype=torch.bool) | always)


def _tokenizer_kind(tokenizer, pieces: list[str | None]) -> tuple[str, str | None]:
    """(kind, its marker) of a transformers tokenizer; for "unknown", a description instead."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        if getattr(tokenizer, "sp_model", None) is not None:
            return "metaspace", "▁"
        return _kind_from_pieces(pieces, f"{type(tokenizer).__name__} without a tokenizers backend")
    model = backend.model
    model_type = type(model).__name__
    steps = _pipeline_steps(backend)
    if model_type == "WordLevel":
        return "word_level", None
    for step in steps:
        if step.get("type") == "Metaspace":
            return "metaspace", step["replacement"]
        if step.get("type") == "Replace" and step.get("content") == " " and "String" in step.get("pattern", {}):
            return "metaspace", step["pattern"]["String"]  # a decoder that turns the marker back into spaces
    prefix = getattr(model, "continuing_subword_prefix", None)
    if model_type == "WordPiece" or (model_type == "BPE" and prefix):
        return "wordpiece", prefix or "##"
    suffix = getattr(model, "end_of_word_suffix", None)
    if model_type == "BPE" and suffix:  # before ByteLevel: CLIP splits off the spaces, then maps bytes
        return "end_of_word_suffix", suffix
    if any(step.get("type") == "ByteLevel" for step in steps):
        return "byte_level", None
    names = ", ".join(step["type"] for step in steps) or "none"
    return _kind_from_pieces(pieces, f"{model_type} model; normalizer/pre-tokenizer/decoder steps: {names}")


def _kind_from_pieces(pieces: list[str | None], description: str) -> tuple[str, str | None]:
    """SentencePiece's "▁" convention when the pieces carry it (a tenth of them or more), else unknown."""
    marked = sum(p is not None and p.startswith("▁") and len(p) > 1 for p in pieces)
    return ("metaspace", "▁") if marked >= 0.1 * max(len(pieces), 1) else ("unknown", description)


def _pipeline_steps(backend) -> list[dict]:
    """The normalizer, pre-tokenizer and decoder steps of a `tokenizers.Tokenizer` as JSON dicts,
    with Sequences flattened; a step that cannot be serialised (custom Python code) is left out."""
    steps = []

    def walk(node):
        if isinstance(node, dict):
            if "type" in node:
                steps.append(node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for part in (backend.normalizer, backend.pre_tokenizer, backend.decoder):
        if part is None:
            continue
        try:
            walk(json.loads(part.__getstate__()))
        except Exception:  # custom components cannot be serialised
            continue
    return steps


def _byte_level_whitespace() -> set[str]:
    """The characters of the byte-level alphabet that stand for whitespace bytes ("Ġ", "Ċ", ...)."""
    decoder = decoders.ByteLevel()
    return {c for c in pre_tokenizers.ByteLevel.alphabet() if decoder.decode([c]).isspace()}


def _added_token_ids(tokenizer) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    ids |= set(getattr(tokenizer, "added_tokens_decoder", {}) or {})
    return {i for i in ids if isinstance(i, int) and i >= 0}


def next_true_index(flags: torch.Tensor) -> torch.Tensor:
    """(R, L) bool -> (R, L + 1) long: for each i the smallest j >= i with flags[j], else L."""
    R, L = flags.shape
    idx = torch.arange(L).expand(R, L)
    idx = torch.where(flags, idx, torch.full_like(idx, L))
    idx = torch.cat([idx, torch.full((R, 1), L, dtype=idx.dtype)], dim=1)  # (R, L + 1)
    return idx.flip(1).cummin(dim=1).values.flip(1)


def sample_spans(
    start_ok: torch.Tensor,
    eligible: torch.Tensor,
    goal: torch.Tensor,
    first: torch.Tensor,
    *,
    plm_probability: float,
    max_span_length: int,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """XLNet's span sampling (`_sample_mask`), for R rows at once, without filling the budget.

    Walking left to right from `first`: draw a span length n in 1..max_span_length with
    P(n) ∝ 1/n (capped by the budget left), a context of ctx = round(n / p) tokens split into
    a random left part l and right part ctx - l; the span starts at the first word-start piece
    at or after cur + l and covers n tokens; the walk continues at span end + (ctx - l). A row
    stops when its budget `goal` of eligible tokens is reached or a span would pass the end.

    Args:
        start_ok: (R, L) bool, word-start pieces.
        eligible: (R, L) bool, positions that may be targets (not <sep>/<cls>/<pad>).
        goal: (R,) long, target budget per row.
        first: (R,) long, where the walk starts (first non-padding position).

    Returns:
        (begins, ends): (R, K) long span bounds; empty spans have begin == end.
    """
    R, L = start_ok.shape
    p = plm_probability
    ctx_table = torch.tensor([0] + [max(1, round(n / p)) for n in range(1, max_span_length + 1)])
    max_steps = L // (int(ctx_table[1]) + 1) + 2  # each span moves the walk >= ctx(1) + 1
    weights = 1.0 / torch.arange(1, max_span_length + 1, dtype=torch.float)
    span_len = torch.multinomial(weights, R * max_steps, replacement=True, generator=generator) + 1
    span_len = span_len.view(R, max_steps)  # (R, K)
    left_frac = torch.rand(R, max_steps, generator=generator, dtype=torch.float64)  # (R, K)

    next_start = next_true_index(start_ok)  # (R, L + 1)
    cum_eligible = torch.cat([torch.zeros(R, 1, dtype=torch.long), eligible.long().cumsum(1)], dim=1)  # (R, L + 1)
    begins = torch.zeros(R, max_steps, dtype=torch.long)
    ends = torch.zeros(R, max_steps, dtype=torch.long)
    cur, num = first.clone(), torch.zeros(R, dtype=torch.long)
    alive = num < goal
    for k in range(max_steps):
        n = torch.minimum(span_len[:, k], (goal - num).clamp(min=1))
        ctx = ctx_table[n]
        left = (left_frac[:, k] * ctx).long().clamp(max=ctx - 1)
        beg = next_start.gather(1, (cur + left).clamp(max=L)[:, None])[:, 0]
        end = beg + n
        ok = alive & (end <= L)
        begins[:, k] = torch.where(ok, beg, 0)
        ends[:, k] = torch.where(ok, end, 0)
        gained = (
            cum_eligible.gather(1, end.clamp(max=L)[:, None])[:, 0]
            - cum_eligible.gather(1, beg.clamp(max=L)[:, None])[:, 0]
        )
        num = torch.where(ok, num + gained, num)
        cur = torch.where(ok, end + ctx - left, cur)
        alive = ok & (num < goal) & (cur < L)
        if not bool(alive.any()):
            break
    return begins, ends


def spans_to_mask(begins: torch.Tensor, ends: torch.Tensor, length: int) -> torch.Tensor:
    """(R, K) span bounds -> (R, length) bool coverage."""
    R = begins.shape[0]
    diff = torch.zeros(R, length + 1, dtype=torch.long)
    diff.scatter_add_(1, begins, torch.ones_like(begins))
    diff.scatter_add_(1, ends, -torch.ones_like(ends))
    return diff.cumsum(1)[:, :length] > 0


def random_ranks(keys: torch.Tensor) -> torch.Tensor:
    """(R, L) sort keys -> (R, L) long rank of each position in ascending key order."""
    order = keys.argsort(dim=1)
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(keys.shape[1]).expand_as(order).contiguous())
    return ranks


def fill_budget(mask: torch.Tensor, eligible: torch.Tensor, deficit: torch.Tensor, generator) -> torch.Tensor:
    """Add `deficit[r]` random eligible positions not yet in mask[r] (XLNet's leftover fill)."""
    candidate = eligible & ~mask
    keys = torch.rand(mask.shape, generator=generator, dtype=torch.float64)
    keys = torch.where(candidate, keys, torch.full_like(keys, 2.0))
    return mask | (candidate & (random_ranks(keys) < deficit[:, None]))


@dataclass
class DataCollatorForXLNetPretraining:
    """Collate XLNet pretraining examples and sample targets and factorization orders.

    Call it on a list of examples, each a dict with `input_ids` (and optionally
    `token_type_ids`, `attention_mask`, and `is_reversed` as given by `PretrainingStream` with
    bi_data; a reversed row snaps its spans to word starts of the un-reversed text, as XLNet
    does). Examples of different lengths are padded on the LEFT.

    Targets (XLNet's `_sample_mask`): per part (see reuse_len), a budget of about
    plm_probability of its real tokens, filled first by spans of n in 1..max_span_length tokens
    with P(n) ∝ 1/n, each starting at a word start inside a context of round(n / p) tokens,
    then by random single tokens. `<sep>`, `<cls>` and `<pad>` are never targets.

    Factorization order (XLNet's `_local_perm`): a random order within chunks of perm_size
    positions; non-targets come first (rank -1), so a non-target sees every non-target and no
    target; a target sees all non-targets and the targets strictly earlier in the order, never
    itself. `<sep>`/`<cls>` keep their rank and see themselves. With reuse_len, positions
    [0:reuse_len] and [reuse_len:] are permuted independently; the reused part never sees the
    new part and the new part sees all of the reused part.

    Returns a dict of tensors:
        input_ids (B, T) long, unchanged; token_type_ids (B, T) long (only if the examples
        have them; padding 3); attention_mask (B, T) long (1 real, 0 padding); perm_mask
        (B, T, T) float (1 = may not attend); target_mapping (B, P, T) float one-hot rows, in
        position order, zero rows for padding; labels (B, P) long, the original tokens, -100
        on padding rows. P = ceil(T * plm_probability).

    Args:
        tokenizer: gives `<sep>`, `<cls>`, `<pad>` ids and where words start (`word_boundaries`:
            SentencePiece "▁", WordPiece "##", byte-level BPE "Ġ", BPE "</w>", WordLevel).
        plm_probability: fraction of tokens to predict, in (0, 1).
        max_span_length: longest span of targets (>= 1).
        reuse_len: length of the part reused as memory by the next step (None: no split).
        perm_size: chunk length of the factorization order (default reuse_len, else T);
            must be <= reuse_len.
        seed: seed of a private torch.Generator (None: torch's global RNG).
        return_tensors: only "pt".
        word_starts: (V,) bool per vocabulary id, True where the token begins a word; overrides
            what `word_boundaries` reads from the tokenizer (None: read it).
    """

    tokenizer: object
    plm_probability: float = 1 / 6
    max_span_length: int = 5
    reuse_len: int | None = None
    perm_size: int | None = None
    seed: int | None = None
    return_tensors: str = "pt"
    word_starts: torch.Tensor | Sequence[bool] | None = field(default=None, repr=False)
    generator: torch.Generator | None = field(init=False, repr=False, default=None)

    def __post_init__(self):
        p = self.plm_probability
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p < 1:
            raise ValueError(f"plm_probability must be in (0, 1), got {p!r}")
        _check_optional_int("max_span_length", self.max_span_length, 1, required=True)
        _check_optional_int("reuse_len", self.reuse_len, 0)
        _check_optional_int("perm_size", self.perm_size, 1)
        if self.reuse_len == 0:
            self.reuse_len = None
        if self.perm_size is not None and self.reuse_len is not None and self.perm_size > self.reuse_len:
            raise ValueError(
                f"perm_size={self.perm_size} must be <= reuse_len={self.reuse_len}: a longer factorization "
                "chunk would let the reused part leak into the memory of the next step"
            )
        if self.return_tensors != "pt":
            raise ValueError(f"return_tensors must be 'pt', got {self.return_tensors!r}")
        if self.seed is not None:
            _check_optional_int("seed", self.seed, 0)
        ids = special_token_ids(self.tokenizer)
        if ids["<sep>"] is None or ids["<cls>"] is None or ids["<pad>"] is None:
            raise ValueError("tokenizer must define <sep>, <cls> and <pad> tokens")
        self.sep_id, self.cls_id, self.pad_id = ids["<sep>"], ids["<cls>"], ids["<pad>"]
        self.boundaries = self._word_boundaries()
        if self.seed is not None:
            self.generator = torch.Generator().manual_seed(self.seed)

    def _word_boundaries(self) -> WordBoundaries:
        if self.word_starts is None:
            return word_boundaries(self.tokenizer)
        try:
            starts = torch.as_tensor(self.word_starts)
        except (TypeError, ValueError, RuntimeError) as error:
            raise ValueError(f"word_starts must be a 1-D bool sequence: {error}") from None
        if starts.dim() != 1 or starts.dtype != torch.bool or len(starts) < len(self.tokenizer):
            raise ValueError(
                f"word_starts must be a 1-D bool sequence with one entry per vocabulary id ({len(self.tokenizer)}), "
                f"got dtype {starts.dtype} and shape {tuple(starts.shape)}"
            )
        return WordBoundaries("given", starts.clone())

    # -- state for resumable training ------------------------------------------------------------

    def state_dict(self) -> dict:
        """Seed and generator state (JSON-serialisable); empty state when using the global RNG."""
        if self.generator is None:
            return {"seed": None, "generator_state": None}
        return {"seed": self.seed, "generator_state": self.generator.get_state().tolist()}

    def load_state_dict(self, state: dict) -> None:
        """Restore the generator saved by `state_dict()`."""
        if state.get("generator_state") is None:
            return
        if self.generator is None:
            self.generator = torch.Generator()
        self.generator.set_state(torch.tensor(state["generator_state"], dtype=torch.uint8))

    # -- collation --------------------------------------------------------------------------------

    def __call__(self, examples: Sequence[Mapping]) -> dict[str, torch.Tensor]:
        batch = self._collate(examples)
        ids, real = batch["input_ids"], batch["attention_mask"].bool()
        T = ids.shape[1]
        if self.reuse_len is not None and T <= self.reuse_len:
            raise ValueError(f"input_ids: sequences of length {T} are too short for reuse_len={self.reuse_len}")
        functional = (ids == self.sep_id) | (ids == self.cls_id)
        eligible = self._text_positions(ids, real)
        reversed_rows = batch.pop("is_reversed")
        parts = [(0, T)] if self.reuse_len is None else [(0, self.reuse_len), (self.reuse_len, T)]
        num_predict = math.ceil(T * self.plm_probability)
        is_target = self._sample_targets(ids, real, eligible, reversed_rows, parts, num_predict)
        batch["perm_mask"] = self._perm_mask(is_target, functional, parts)
        batch["target_mapping"], batch["labels"] = _targets_to_mapping(ids, is_target, num_predict)
        return batch

    def _text_positions(self, ids, real) -> torch.Tensor:
        """(B, T) bool: real tokens that are text, the positions an objective may score (not <sep>, <cls>, <pad>)."""
        return real & (ids != self.sep_id) & (ids != self.cls_id) & (ids != self.pad_id)

    def _collate(self, examples) -> dict[str, torch.Tensor]:
        if isinstance(examples, Mapping) or not isinstance(examples, Sequence) or len(examples) == 0:
            raise ValueError("examples must be a non-empty list of dicts with input_ids")
        if not all(isinstance(e, Mapping) for e in examples):
            kinds = sorted({type(e).__name__ for e in examples})
            raise ValueError(f"examples must all be dicts (mappings) with input_ids; got {kinds}")
        if not all("input_ids" in e for e in examples):
            raise ValueError("examples: every example needs an 'input_ids' entry")
        for key in ("token_type_ids", "attention_mask"):
            have = sum(key in e for e in examples)
            if 0 < have < len(examples):
                raise ValueError(f"examples: {key} is given for some examples and not others")
        seqs = [_as_1d_long("input_ids", e["input_ids"]) for e in examples]
        lengths = [len(s) for s in seqs]
        T = max(lengths)
        out = {"input_ids": _left_pad(seqs, T, self.pad_id)}
        given_mask = (
            _left_pad([_as_1d_long("attention_mask", e["attention_mask"]) for e in examples], T, 0)
            if "attention_mask" in examples[0]
            else None
        )
        if "token_type_ids" in examples[0]:
            types = [_as_1d_long("token_type_ids", e["token_type_ids"]) for e in examples]
            if [len(t) for t in types] != lengths:
                raise ValueError("examples: token_type_ids and input_ids differ in length")
            out["token_type_ids"] = _left_pad(types, T, XLNET_PAD_TOKEN_TYPE_ID)
        positions = torch.arange(T)
        mask = positions[None, :] >= (T - torch.tensor(lengths))[:, None]
        if given_mask is not None:
            mask &= given_mask.bool()
        out["attention_mask"] = mask.long()
        out["is_reversed"] = torch.tensor([bool(e.get("is_reversed", False)) for e in examples])
        return out

    def _sample_targets(self, ids, real, eligible, reversed_rows, parts, num_predict) -> torch.Tensor:
        B, T = ids.shape
        n_real = real.sum(1)
        goal = torch.ceil(n_real * self.plm_probability).long().clamp(max=num_predict)
        is_target = torch.zeros(B, T, dtype=torch.bool)
        assigned = torch.zeros(B, dtype=torch.long)
        for k, (lo, hi) in enumerate(parts):
            if k == len(parts) - 1:
                part_goal = goal - assigned
            else:  # share the budget in proportion to the real tokens of the part
                part_real = real[:, lo:hi].sum(1)
                part_goal = torch.round(goal * part_real / n_real.clamp(min=1)).long()
            assigned += part_goal
            is_target[:, lo:hi] = self._sample_part(
                ids[:, lo:hi], real[:, lo:hi], eligible[:, lo:hi], reversed_rows, part_goal
            )
        return is_target

    def _sample_part(self, ids, real, eligible, reversed_rows, goal) -> torch.Tensor:
        """Targets for one part; reversed rows are sampled on the un-reversed text."""
        flip = reversed_rows[:, None]
        ids = torch.where(flip, ids.flip(1), ids)
        real = torch.where(flip, real.flip(1), real)
        eligible = torch.where(flip, eligible.flip(1), eligible)
        goal = torch.minimum(goal, eligible.sum(1))
        start_ok = self.boundaries.flags(ids)
        first = real.long().argmax(1)
        begins, ends = sample_spans(
            start_ok,
            eligible,
            goal,
            first,
            plm_probability=self.plm_probability,
            max_span_length=self.max_span_length,
            generator=self.generator,
        )
        mask = spans_to_mask(begins, ends, ids.shape[1]) & eligible
        mask = fill_budget(mask, eligible, goal - mask.sum(1), self.generator)
        return torch.where(flip, mask.flip(1), mask)

    def _perm_mask(self, is_target, functional, parts) -> torch.Tensor:
        B, T = is_target.shape
        positions = torch.arange(T)
        chunk = torch.empty(T, dtype=torch.float64)
        for k, (lo, hi) in enumerate(parts):
            size = self.perm_size or (hi - lo)
            chunk[lo:hi] = k * T + (positions[lo:hi] - lo) // size
        keys = chunk + torch.rand(B, T, generator=self.generator, dtype=torch.float64)  # (B, T)
        rank = random_ranks(keys)
        masked_or_functional = is_target | functional
        rev = torch.where(masked_or_functional, rank, torch.full_like(rank, -1)).int()
        self_rev = torch.where(is_target, rev, rev + 1)
        # XLNet also ANDs with masked_or_functional[j]; that is implied: self_rev >= 0 > rev[j] = -1
        perm_mask = self_rev[:, :, None] <= rev[:, None, :]  # (B, T, T)
        if len(parts) == 2:
            r = parts[1][0]
            perm_mask[:, :r, r:] = True
            perm_mask[:, r:, :r] = False
        return perm_mask.float()


def random_factorization_masks(batch: int, seq_len: int, num_predict: int, *, seed: int = 0):
    """perm_mask (B, T, T) and one-hot target_mapping (B, P, T) for a random factorization order over whole
    sequences, in XLNet's scheme: P random positions are the targets, in a random order; a target sees every
    non-target and the targets before it; a non-target sees every non-target and no target. For scoring or timing the
    model on hand-made inputs; training batches come from DataCollatorForXLNetPretraining (spans, word starts)."""
    gen = torch.Generator().manual_seed(seed)
    perm_mask = torch.zeros(batch, seq_len, seq_len)
    target_mapping = torch.zeros(batch, num_predict, seq_len)
    for b in range(batch):
        targets = torch.randperm(seq_len, generator=gen)[:num_predict]
        rank = torch.full((seq_len,), -1)
        rank[targets] = torch.randperm(num_predict, generator=gen)
        is_target = rank >= 0
        self_rank = torch.where(is_target, rank, rank + 1)
        perm_mask[b] = ((self_rank[:, None] <= rank[None, :]) & is_target[None, :]).float()
        target_mapping[b, torch.arange(num_predict), targets] = 1.0
    return perm_mask, target_mapping


def _targets_to_mapping(ids: torch.Tensor, is_target: torch.Tensor, num_predict: int):
    B, T = ids.shape
    positions = torch.arange(T)
    order = torch.where(is_target, positions, positions + T).argsort(dim=1)[:, :num_predict]  # (B, P)
    valid = torch.arange(num_predict)[None, :] < is_target.sum(1, keepdim=True)  # (B, P)
    target_mapping = torch.zeros(B, num_predict, T)
    target_mapping.scatter_(2, order[:, :, None], valid[:, :, None].float())  # (B, P, T)
    labels = torch.where(valid, ids.gather(1, order), torch.full_like(order, -100))
    return target_mapping, labels


def _as_1d_long(name: str, value) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        tensor = value
    else:
        array = np.asarray(value)
        if array.dtype == object or (array.size and not np.issubdtype(array.dtype, np.integer)):
            raise ValueError(f"{name} must be a sequence of integers, got dtype {array.dtype}")
        tensor = torch.from_numpy(array.astype(np.int64, copy=False))
    if tensor.dim() != 1 or tensor.numel() == 0 or tensor.is_floating_point():
        raise ValueError(f"{name} must be a non-empty 1-D sequence of integers, got shape {tuple(tensor.shape)}")
    return tensor.long()


def _left_pad(seqs: list[torch.Tensor], length: int, value: int) -> torch.Tensor:
    if all(len(s) == length for s in seqs):
        return torch.stack(seqs)
    out = torch.full((len(seqs), length), value, dtype=torch.long)
    for row, s in enumerate(seqs):
        out[row, length - len(s) :] = s
    return out


def _check_optional_int(name: str, value, minimum: int, required: bool = False) -> None:
    if value is None and not required:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
