"""Properties of DataCollatorForXLNetPretraining over many seeds (XLNet's _sample_mask / _local_perm)."""

import json
import math

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models

from xlnet_lite.collator import DataCollatorForXLNetPretraining, sample_spans, spans_to_mask
from xlnet_lite.modeling_xlnet_lite import blocked_positions, mask_ranks
from xlnet_lite.tokenization_xlnet_lite import SPECIAL_TOKENS, wrap_tokenizer

SEP, CLS, PAD = 4, 3, 5
WORDS = 40  # ids 8..47 are "▁w*" word starts, 48..87 are continuation pieces


@pytest.fixture(scope="module")
def tokenizer():
    vocab = [(t, 0.0) for t in SPECIAL_TOKENS]
    vocab += [(f"▁w{i}", -1.0) for i in range(WORDS)] + [(f"x{i}", -2.0) for i in range(WORDS)]
    return wrap_tokenizer(Tokenizer(models.Unigram(vocab, unk_id=0)))


def make_examples(rng, batch_size, seq_len, reuse_len, lengths=None):
    """Pretraining-layout examples: [reuse] + A <sep> B <sep> <cls>, random word pieces."""
    examples = []
    for b in range(batch_size):
        T = seq_len if lengths is None else lengths[b]
        ids = rng.integers(8, 8 + 2 * WORDS, size=T)
        a_end = int(rng.integers(reuse_len + 1, T - 3))
        ids[a_end], ids[-2], ids[-1] = SEP, SEP, CLS
        types = np.zeros(T, dtype=np.int64)
        types[a_end + 1 : -1], types[-1] = 1, 2
        examples.append({"input_ids": ids, "token_type_ids": types, "is_reversed": bool(b % 2)})
    return examples


def target_positions(out):
    return out["target_mapping"].sum(1) > 0  # (B, T)


def check_order(perm_mask, is_target, lo, hi):
    """Visibility among the targets of [lo:hi] is a strict total order."""
    idx = torch.nonzero(is_target[lo:hi]).flatten() + lo
    sees = perm_mask[idx][:, idx] == 0  # (n, n): row may attend to column
    assert not sees.diagonal().any(), "a target sees itself"
    off = ~torch.eye(len(idx), dtype=torch.bool)
    assert torch.equal((sees ^ sees.T)[off], torch.ones(int(off.sum()), dtype=torch.bool)), "not one direction per pair"
    two_steps = (sees.float() @ sees.float()) > 0
    assert not (two_steps & ~sees).any(), "not transitive"


@pytest.mark.parametrize("reuse_len,perm_size", [(None, None), (32, 8)])
def test_the_masks_have_the_ranks_form_the_fused_kernels_read(tokenizer, reuse_len, perm_size):
    """Each batch's perm_mask with its padding and a memory, as the model combines them, is a mask whose rows nest:
    mask_ranks gives it as ranks (the Triton kernels compare two vectors instead of reading the block)."""
    T = 64
    for seed in range(10):
        rng = np.random.default_rng(seed)
        collator = DataCollatorForXLNetPretraining(tokenizer, reuse_len=reuse_len, perm_size=perm_size, seed=seed)
        out = collator(make_examples(rng, 4, T, reuse_len or 0, lengths=[T, 50, T, 40]))
        assert (out["attention_mask"] == 0).any()
        blocked = blocked_positions(
            perm_mask=out["perm_mask"],
            pad_mask=out["attention_mask"] == 0,
            attn_type="bi",
            same_length=False,
            qlen=T,
            mlen=16,
            device="cpu",
        )
        assert mask_ranks(blocked) is not None, seed


@pytest.mark.parametrize("reuse_len,perm_size", [(None, None), (32, 32), (32, 8)])
def test_mask_properties_over_seeds(tokenizer, reuse_len, perm_size):
    T, B = 64, 6
    for seed in range(25):
        rng = np.random.default_rng(seed)
        collator = DataCollatorForXLNetPretraining(tokenizer, reuse_len=reuse_len, perm_size=perm_size, seed=seed)
        examples = make_examples(rng, B, T, reuse_len or 0)
        out = collator(examples)
        ids, pm = out["input_ids"], out["perm_mask"]
        tgt = target_positions(out)
        functional = (ids == SEP) | (ids == CLS)
        context = ~tgt & ~functional
        parts = [(0, T)] if reuse_len is None else [(0, reuse_len), (reuse_len, T)]
        assert torch.equal(ids, torch.stack([torch.as_tensor(e["input_ids"]) for e in examples])), "inputs changed"
        assert not (tgt & functional).any()
        for b in range(B):
            for lo, hi in parts:
                check_order(pm[b], tgt[b], lo, hi)
                rows = slice(lo, hi)
                # context (non-target, non-functional) rows see every context token of their part, no target
                ctx_rows = torch.nonzero(context[b, lo:hi]).flatten() + lo
                assert (pm[b][ctx_rows][:, context[b] & _in(lo, hi, T)] == 0).all()
                assert (pm[b][ctx_rows][:, tgt[b] & _in(lo, hi, T)] == 1).all()
                # every position of the part sees the context tokens of the part
                assert (pm[b, rows][:, context[b] & _in(lo, hi, T)] == 0).all()
            if reuse_len is not None:
                assert (pm[b, :reuse_len, reuse_len:] == 1).all(), "reused part sees the new part"
                assert (pm[b, reuse_len:, :reuse_len] == 0).all(), "new part does not see all of the reused part"
                assert tgt[b, :reuse_len].any() and tgt[b, reuse_len:].any(), "XLNet predicts in both parts"


def _in(lo, hi, T):
    m = torch.zeros(T, dtype=torch.bool)
    m[lo:hi] = True
    return m


def test_targets_labels_and_counts(tokenizer):
    T, B, p = 96, 8, 1 / 6
    for seed in range(20):
        rng = np.random.default_rng(100 + seed)
        lengths = [T] + [int(x) for x in rng.integers(40, T + 1, size=B - 1)]
        examples = make_examples(rng, B, T, 0, lengths=lengths)
        out = DataCollatorForXLNetPretraining(tokenizer, plm_probability=p, seed=seed)(examples)
        P = math.ceil(T * p)
        assert out["target_mapping"].shape == (B, P, T) and out["labels"].shape == (B, P)
        tm, labels, ids = out["target_mapping"], out["labels"], out["input_ids"]
        valid = tm.sum(2) > 0  # (B, P)
        assert ((tm.sum(2) == 1) | (tm.sum(2) == 0)).all(), "rows are one-hot or zero"
        assert ((labels == -100) == ~valid).all()
        picked = torch.einsum("bpt,bt->bp", tm, ids.float()).long()
        assert torch.equal(labels[valid], picked[valid]), "labels are not the original tokens"
        positions = tm.argmax(2).masked_fill(~valid, 10**6)
        assert (positions[:, 1:] > positions[:, :-1])[valid[:, 1:]].all(), "targets not in position order"
        for b, n in enumerate(lengths):
            assert int(valid[b].sum()) == math.ceil(n * p), "target count is not ceil(p * real tokens)"
            assert (out["attention_mask"][b, : T - n] == 0).all() and (out["attention_mask"][b, T - n :] == 1).all()
            assert (out["token_type_ids"][b, : T - n] == 3).all()
            assert not target_positions(out)[b, : T - n].any(), "a padding position is a target"


def test_span_lengths_follow_one_over_n():
    R, L, max_n, p = 8, 20000, 5, 1 / 6
    gen = torch.Generator().manual_seed(0)
    starts_ok = torch.ones(R, L, dtype=torch.bool)
    begins, ends = sample_spans(
        starts_ok,
        starts_ok,
        torch.full((R,), L),
        torch.zeros(R, dtype=torch.long),
        plm_probability=p,
        max_span_length=max_n,
        generator=gen,
    )
    lengths = (ends - begins)[ends > begins]
    law = 1 / torch.arange(1, max_n + 1, dtype=torch.float64)
    law /= law.sum()
    freq = torch.bincount(lengths, minlength=max_n + 1)[1:].double() / len(lengths)
    assert len(lengths) > 8000
    assert torch.allclose(freq, law, atol=0.02), (freq, law)
    assert abs(lengths.double().mean() - (law * torch.arange(1, max_n + 1)).sum()) < 0.06
    covered = spans_to_mask(begins, ends, L).double().mean()
    assert abs(covered - p / (1 + p)) < 0.01, "span windows should cover n / (n + n/p) of the tokens"


def test_spans_start_at_word_starts():
    R, L = 4, 3000
    gen = torch.Generator().manual_seed(1)
    starts_ok = torch.zeros(R, L, dtype=torch.bool)
    starts_ok[:, ::3] = True
    eligible = torch.ones(R, L, dtype=torch.bool)
    begins, ends = sample_spans(
        starts_ok,
        eligible,
        torch.full((R,), L),
        torch.zeros(R, dtype=torch.long),
        plm_probability=1 / 6,
        max_span_length=5,
        generator=gen,
    )
    real = ends > begins
    assert real.sum() > 100
    assert (begins[real] % 3 == 0).all()
    for r in range(R):
        b, e = begins[r][real[r]], ends[r][real[r]]
        assert (b[1:] > e[:-1]).all(), "spans touch or overlap"


def test_seed_determinism_and_state_dict(tokenizer):
    examples = make_examples(np.random.default_rng(0), 4, 64, 32)
    a = DataCollatorForXLNetPretraining(tokenizer, reuse_len=32, seed=7)
    b = DataCollatorForXLNetPretraining(tokenizer, reuse_len=32, seed=7)
    c = DataCollatorForXLNetPretraining(tokenizer, reuse_len=32, seed=8)
    out_a, out_b, out_c = a(examples), b(examples), c(examples)
    for k in out_a:
        assert torch.equal(out_a[k], out_b[k]), k
    assert not torch.equal(out_a["perm_mask"], out_c["perm_mask"])
    state = json.loads(json.dumps(a.state_dict()))
    next_a = a(examples)
    b.load_state_dict(state)
    next_b = b(examples)
    for k in next_a:
        assert torch.equal(next_a[k], next_b[k]), k
    assert not torch.equal(next_a["perm_mask"], out_a["perm_mask"])


def test_permutation_chunks_order_targets(tokenizer):
    """With perm_size 8, a target in a later chunk comes later in the order than one in an earlier chunk."""
    T, R, size = 64, 32, 8
    for seed in range(10):
        examples = make_examples(np.random.default_rng(seed), 4, T, R)
        out = DataCollatorForXLNetPretraining(tokenizer, reuse_len=R, perm_size=size, plm_probability=0.4, seed=seed)(
            examples
        )
        tgt = target_positions(out)
        for b in range(4):
            idx = torch.nonzero(tgt[b]).flatten()
            for i in idx:
                for j in idx:
                    same_part = (i < R) == (j < R)
                    if same_part and (i // size) > (j // size):
                        assert out["perm_mask"][b, i, j] == 0 and out["perm_mask"][b, j, i] == 1


def test_bad_inputs(tokenizer):
    good = make_examples(np.random.default_rng(0), 2, 32, 8)
    with pytest.raises(ValueError, match="plm_probability"):
        DataCollatorForXLNetPretraining(tokenizer, plm_probability=1.0)
    with pytest.raises(ValueError, match="plm_probability"):
        DataCollatorForXLNetPretraining(tokenizer, plm_probability=0)
    with pytest.raises(ValueError, match="max_span_length"):
        DataCollatorForXLNetPretraining(tokenizer, max_span_length=0)
    with pytest.raises(ValueError, match="perm_size"):
        DataCollatorForXLNetPretraining(tokenizer, reuse_len=8, perm_size=16)
    with pytest.raises(ValueError, match="return_tensors"):
        DataCollatorForXLNetPretraining(tokenizer, return_tensors="np")
    collator = DataCollatorForXLNetPretraining(tokenizer, reuse_len=8, seed=0)
    with pytest.raises(ValueError, match="input_ids"):
        collator([{"token_type_ids": [0, 0]}])
    with pytest.raises(ValueError, match="examples"):
        collator([])
    with pytest.raises(ValueError, match="dicts"):
        collator([good[0], list(good[1]["input_ids"])])
    with pytest.raises(ValueError, match="token_type_ids"):
        collator([good[0], {"input_ids": good[1]["input_ids"]}])
    with pytest.raises(ValueError, match="input_ids.*too short"):
        collator([{"input_ids": [10, 11, 4, 3]}])
    with pytest.raises(ValueError, match="input_ids"):
        collator([{"input_ids": [1.5, 2.5] * 10}])


@pytest.mark.parametrize("seed", range(3))
def test_collator_output_through_the_model_leaks_nothing(tokenizer, seed):
    """Collated batches fed to XLNetLiteLMHeadModel (with a memory and bi_data): a target's prediction has zero
    gradient with respect to its own token and every token its perm_mask hides, non-zero for the ones it sees."""
    from model_helpers import randomise

    from xlnet_lite import XLNetLiteConfig, XLNetLiteLMHeadModel

    config = XLNetLiteConfig(
        vocab_size=len(tokenizer),
        d_model=32,
        n_layer=2,
        n_head=4,
        d_inner=48,
        dropout=0.0,
        mem_len=8,
        reuse_len=8,
        bi_data=True,
    )
    model = randomise(XLNetLiteLMHeadModel(config), seed=seed).eval()
    rng = np.random.default_rng(seed)
    collator = DataCollatorForXLNetPretraining(tokenizer, reuse_len=8, perm_size=8, seed=seed)
    first = collator(make_examples(rng, 4, 24, 8))
    with torch.no_grad():
        mems = model(**first, use_mems=True).mems
    batch = collator(make_examples(rng, 4, 24, 8))
    embeds = model.transformer.word_embedding(batch["input_ids"]).detach().requires_grad_(True)
    inputs = {k: v for k, v in batch.items() if k not in ("input_ids", "labels")}
    logits = model(inputs_embeds=embeds, mems=mems, **inputs).logits  # (B, P, V)
    checked = 0
    for b, p in torch.nonzero(batch["target_mapping"].sum(-1) > 0).tolist():
        (grad,) = torch.autograd.grad(logits[b, p].square().sum(), embeds, retain_graph=True)
        influence = grad[b].abs().sum(-1)  # (T,)
        position = int(batch["target_mapping"][b, p].argmax())
        hidden = batch["perm_mask"][b, position].bool()
        assert hidden[position] and influence[hidden].max() == 0
        assert (influence[~hidden] > 0).all()
        checked += 1
    assert checked == int(batch["target_mapping"].sum())
