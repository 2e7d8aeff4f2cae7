"""Pretraining objectives on one XLNet-Lite backbone: XLNet's permutation LM, BERT's masked LM and a causal LM.

The pretraining recipe's `--objective`. Each objective is a collator over `PretrainingStream`'s examples (the same
rows, memory, batch and sequence shapes, so runs differ only in what is predicted from what) and the config fields the
model trains with (`objective_config`):

- `plm`: XLNet's permutation LM, `DataCollatorForXLNetPretraining`: two streams; the targets (a share
  `plm_probability` of the tokens) are predicted through the query stream in a random factorization order, their
  inputs never corrupted.
- `mlm`: BERT's masked LM through the content stream alone, XLNet's own ablation (its "denoising auto-encoder" on the
  same architecture): a share `mlm_probability` of each row's tokens are targets; 80% of their inputs become
  `<mask>`, 10% a random piece, 10% stay (BERT's rule). Attention is bidirectional, except that the reused part of a
  sample never sees its new part, as in `plm`: the next step's memory is that part's states, and the new part is the
  next step's text, so without the block the memory would carry tokens the next step predicts.
- `clm`: a causal LM, the autoregressive end of XLNet's family (Transformer-XL): `attn_type="uni"`, every position
  predicts the token after it (where that token is text, not `<sep>`, `<cls>` or padding). The saved model keeps
  `attn_type="uni"`, so it finetunes the way it was pretrained (the classifier reads the last token, `<cls>`, which
  sees the whole input); a bidirectional finetune would read through attention it never trained.

`mlm` and `clm` set `sparse_prediction`, so the LM head runs on the scored rows only (as `plm` runs it on its P
target rows), and take (B, T) labels with -100 where nothing is scored.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .collator import DataCollatorForXLNetPretraining, fill_budget
from .tokenization_xlnet_lite import special_token_ids

OBJECTIVES = {"plm": "permutation LM", "mlm": "masked LM", "clm": "causal LM"}


def objective_config(objective: str) -> dict:
    """The model config fields an objective trains with (plm leaves the model's own)."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {list(OBJECTIVES)}, got {objective!r}")
    return {
        "plm": {},
        "mlm": {"attn_type": "bi", "sparse_prediction": True},
        "clm": {"attn_type": "uni", "sparse_prediction": True},
    }[objective]


def make_collator(objective: str, tokenizer, *, mlm_probability: float = 0.15, **kwargs):
    """The objective's collator; kwargs are DataCollatorForXLNetPretraining's (plm_probability, max_span_length,
    reuse_len, perm_size, seed), of which mlm and clm use reuse_len and seed."""
    objective_config(objective)  # names a wrong objective
    if objective == "plm":
        return DataCollatorForXLNetPretraining(tokenizer, **kwargs)
    if objective == "mlm":
        return DataCollatorForXLNetMaskedLM(tokenizer, mlm_probability=mlm_probability, **kwargs)
    return DataCollatorForXLNetCausalLM(tokenizer, **kwargs)


@dataclass
class DataCollatorForXLNetMaskedLM(DataCollatorForXLNetPretraining):
    """BERT's masked LM on PretrainingStream's examples (see the module docstring).

    Per row, ceil(mlm_probability * its text tokens) targets drawn uniformly among them (a fixed count, so every batch
    of full rows scores the same number of tokens); `<sep>`, `<cls>` and `<pad>` are never targets nor random
    replacements. Returns input_ids (B, T), corrupted; token_type_ids and attention_mask as the plm collator;
    labels (B, T), the original token at targets and -100 elsewhere; with reuse_len, perm_mask (B, T, T) float, 1
    where a position of the reused part would see the new part.

    Args (beyond DataCollatorForXLNetPretraining's; plm_probability, max_span_length and perm_size are unused):
        mlm_probability: share of the text tokens predicted, in (0, 1) (BERT: 0.15).
        mask_replace_prob: share of the targets whose input becomes <mask> (BERT: 0.8).
        random_replace_prob: share of the targets whose input becomes a random piece (BERT: 0.1); the rest stay.
    """

    mlm_probability: float = 0.15
    mask_replace_prob: float = 0.8
    random_replace_prob: float = 0.1

    def __post_init__(self):
        super().__post_init__()
        for name in ("mlm_probability", "mask_replace_prob", "random_replace_prob"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
                raise ValueError(f"{name} must be in [0, 1], got {value!r}")
        if not 0 < self.mlm_probability < 1:
            raise ValueError(f"mlm_probability must be in (0, 1), got {self.mlm_probability!r}")
        if self.mask_replace_prob + self.random_replace_prob > 1:
            raise ValueError(
                f"mask_replace_prob + random_replace_prob must be <= 1, got "
                f"{self.mask_replace_prob} + {self.random_replace_prob}"
            )
        self.mask_id = special_token_ids(self.tokenizer)["<mask>"]
        if self.mask_id is None:
            raise ValueError("tokenizer must define a <mask> token for the masked LM")
        special = set(getattr(self.tokenizer, "all_special_ids", []) or []) | {self.sep_id, self.cls_id, self.pad_id}
        self.replacement_ids = torch.tensor([i for i in range(len(self.tokenizer)) if i not in special])

    def __call__(self, examples):
        batch = self._collate(examples)
        batch.pop("is_reversed")
        ids, real = batch["input_ids"], batch["attention_mask"].bool()
        B, T = ids.shape
        if self.reuse_len is not None and T <= self.reuse_len:
            raise ValueError(f"input_ids: sequences of length {T} are too short for reuse_len={self.reuse_len}")
        eligible = self._text_positions(ids, real)
        goal = torch.ceil(eligible.sum(1) * self.mlm_probability).long()
        is_target = fill_budget(torch.zeros(B, T, dtype=torch.bool), eligible, goal, self.generator)
        draw = torch.rand(B, T, generator=self.generator)
        masked = is_target & (draw < self.mask_replace_prob)
        replaced = is_target & ~masked & (draw < self.mask_replace_prob + self.random_replace_prob)
        pick = torch.randint(len(self.replacement_ids), (B, T), generator=self.generator)
        corrupted = torch.where(masked, torch.full_like(ids, self.mask_id), ids)
        batch["input_ids"] = torch.where(replaced, self.replacement_ids[pick], corrupted)
        batch["labels"] = torch.where(is_target, ids, torch.full_like(ids, -100))
        if self.reuse_len is not None:
            perm_mask = torch.zeros(B, T, T)
            perm_mask[:, : self.reuse_len, self.reuse_len :] = 1.0
            batch["perm_mask"] = perm_mask
        return batch


@dataclass
class DataCollatorForXLNetCausalLM(DataCollatorForXLNetPretraining):
    """Next-token targets on PretrainingStream's examples, for a model with attn_type="uni" (see the module
    docstring). Returns input_ids (B, T), unchanged; token_type_ids and attention_mask as the plm collator; labels
    (B, T): at position i the token at i + 1 where both are real and that token is text, else -100 (the last position
    too: its successor is the next step's). No randomness: the generator is left as it is."""

    def __call__(self, examples):
        batch = self._collate(examples)
        if bool(batch.pop("is_reversed").any()):
            raise ValueError("examples: reversed rows (bi_data) are for the permutation LM, not the causal LM")
        ids, real = batch["input_ids"], batch["attention_mask"].bool()
        text = self._text_positions(ids, real)
        labels = torch.full_like(ids, -100)
        scored = real[:, :-1] & text[:, 1:]
        labels[:, :-1] = torch.where(scored, ids[:, 1:], labels[:, :-1])
        batch["labels"] = labels
        return batch


__all__ = [
    "OBJECTIVES",
    "DataCollatorForXLNetCausalLM",
    "DataCollatorForXLNetMaskedLM",
    "make_collator",
    "objective_config",
]
