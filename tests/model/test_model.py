"""XLNet-Lite beyond equivalence: no leak through the query stream, what transformers' XLNet cannot do, bad input."""

import pytest
import torch
import torch.nn.functional as F
from model_helpers import TINY, blind_first_prediction, randomise

from xlnet_lite import XLNetLiteConfig, XLNetLiteForSequenceClassification, XLNetLiteLMHeadModel
from xlnet_lite import modeling_xlnet_lite as modeling
from xlnet_lite.collator import random_factorization_masks as xlnet_masks

B, T, P = 4, 12, 4


def lite_model(seed=0, cls=XLNetLiteLMHeadModel, **overrides):
    torch.manual_seed(seed)
    return randomise(cls(XLNetLiteConfig(**{**TINY, **overrides})), seed=seed).eval()


def ids(seed=0, batch=B, length=T):
    return torch.randint(0, 97, (batch, length), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
@pytest.mark.parametrize("seed", range(4))
def test_query_stream_leaks_nothing(impl, seed):
    """d(prediction of target p) / d(embedding of token j) is zero for j = the target itself and every j its
    perm_mask hides, and non-zero for what it may see."""
    model = lite_model(seed, mem_len=4, reuse_len=None)
    model.config._attn_implementation = impl
    perm_mask, target_mapping = xlnet_masks(B, T, P, seed=seed)
    with torch.no_grad():
        mems = model(ids(seed + 9), use_mems=True).mems
    embeds = model.transformer.word_embedding(ids(seed)).detach().requires_grad_(True)
    logits = model(inputs_embeds=embeds, perm_mask=perm_mask, target_mapping=target_mapping, mems=mems).logits
    for b in range(B):
        for p in range(P):
            (grad,) = torch.autograd.grad(logits[b, p].square().sum(), embeds, retain_graph=True)
            influence = grad[b].abs().sum(-1)  # (T,)
            target = int(target_mapping[b, p].argmax())
            hidden = perm_mask[b, target].bool()
            assert hidden[target], "a target never sees itself"
            assert influence[hidden].max() == 0, f"leak into batch {b} target {target}"
            assert (influence[~hidden] > 0).all()
            other_rows = torch.arange(B) != b
            assert grad[other_rows].abs().max() == 0


def test_uni_with_attention_mask_and_perm_mask():
    """transformers' XLNet crashes here (transformers#21626); XLNet-Lite combines the causal mask and the data masks."""
    model = lite_model(attn_type="uni")
    attention_mask = torch.ones(B, T, dtype=torch.long)
    attention_mask[0, :3] = 0
    perm_mask, target_mapping = xlnet_masks(B, T, P)
    with torch.no_grad():
        out = model(ids(), attention_mask=attention_mask, perm_mask=perm_mask, target_mapping=target_mapping)
        plain = model(ids(), attention_mask=attention_mask).logits
        changed = ids().clone()
        changed[1, -1] = (changed[1, -1] + 1) % 97  # uni: earlier positions cannot see a later token
        plain2 = model(changed, attention_mask=attention_mask).logits
    assert out.logits.shape == (B, P, 97) and torch.isfinite(out.logits).all()
    torch.testing.assert_close(plain[1, :-1], plain2[1, :-1])
    changed = ids().clone()
    changed[0, 1] = (changed[0, 1] + 1) % 97  # a padded position changes nothing for real tokens
    with torch.no_grad():
        plain3 = model(changed, attention_mask=attention_mask).logits
    torch.testing.assert_close(plain[0, 3:], plain3[0, 3:])


def autocast_step(impl, autocast, perm_mask, target_mapping, tt):
    """Two segments through the memory, loss and backward, under torch.autocast(bf16) or in fp32."""
    model = lite_model(mem_len=6, dropout=0.0).train()
    model.config._attn_implementation = impl
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        out = model(
            ids(),
            perm_mask=perm_mask,
            target_mapping=target_mapping,
            token_type_ids=tt,
            labels=ids(1, length=P),
            use_mems=True,
        )
        out2 = model(
            ids(2),
            perm_mask=perm_mask,
            target_mapping=target_mapping,
            token_type_ids=tt,
            mems=out.mems,
            labels=ids(3, length=P),
        )
    loss = out.loss + out2.loss
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_bf16_autocast_training_step_tracks_fp32(impl):
    """What --mixed_precision bf16 runs: the loss and every parameter's gradient of an autocast step within bf16
    rounding of the fp32 step's. Measured: at most 4% relative (norm) per gradient on this tiny, large-weight model,
    through two layers and a memory; a wrong or missing term is off by far more."""
    perm_mask, target_mapping = xlnet_masks(B, T, P)
    tt = torch.zeros(B, T, dtype=torch.long)
    tt[:, 6:] = 1
    loss32, grads32 = autocast_step(impl, False, perm_mask, target_mapping, tt)
    loss16, grads16 = autocast_step(impl, True, perm_mask, target_mapping, tt)
    assert abs(loss16 - loss32) < 0.01 * loss32
    errors = {n: ((grads16[n].float() - g).norm() / g.norm()).item() for n, g in grads32.items()}
    assert max(errors.values()) < 0.1, sorted(errors.items(), key=lambda e: -e[1])[:3]


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_pure_bfloat16_two_stream_forward_and_backward(impl):
    model = lite_model(mem_len=6).to(torch.bfloat16).train()
    model.config._attn_implementation = impl
    perm_mask, target_mapping = xlnet_masks(B, T, P)
    tt = torch.zeros(B, T, dtype=torch.long)
    tt[:, 6:] = 1
    out = model(
        ids(),
        perm_mask=perm_mask,
        target_mapping=target_mapping,
        token_type_ids=tt,
        labels=ids(1, length=P),
        use_mems=True,
    )
    out2 = model(ids(2), perm_mask=perm_mask, target_mapping=target_mapping, mems=out.mems, labels=ids(3, length=P))
    (out.loss + out2.loss).backward()
    assert out.logits.dtype == torch.bfloat16 and torch.isfinite(out2.loss)
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and g.dtype == torch.bfloat16 and torch.isfinite(g).all() for g in grads)
    fp32 = lite_model(mem_len=6)
    with torch.no_grad():
        ref = fp32(ids(), perm_mask=perm_mask, target_mapping=target_mapping, token_type_ids=tt).logits
    model.eval()
    with torch.no_grad():
        low = model(ids(), perm_mask=perm_mask, target_mapping=target_mapping, token_type_ids=tt).logits.float()
    assert (low - ref).abs().max() / ref.abs().max() < 0.1


def test_gradient_checkpointing_gives_the_same_gradients():
    perm_mask, target_mapping = xlnet_masks(B, T, P)
    grads = []
    for checkpointing in (False, True):
        model = lite_model().train()
        model.config.dropout = 0.0
        if checkpointing:
            model.activation_checkpointing_enable()  # transformers 5 name of gradient_checkpointing_enable
            assert model.transformer.layer[0].gradient_checkpointing
        tt = (torch.arange(T) >= 6).long().expand(B, T)
        loss = model(
            ids(), perm_mask=perm_mask, target_mapping=target_mapping, token_type_ids=tt, labels=ids(1, length=P)
        ).loss
        loss.backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def test_sdpa_selectable_and_matches_eager_in_training_gradients():
    """SDPA against the explicit kernel, a training step: the loss and every gradient, with a factorization order's
    masks and one prediction that may see no key (its row zeroed after attention; the blocked keys' bias gradient
    passed through unmasked, as exactly 0)."""
    perm_mask, target_mapping = xlnet_masks(B, T, P)
    blind_first_prediction(perm_mask, target_mapping)
    tt = torch.zeros(B, T, dtype=torch.long)
    tt[:, 5:] = 1
    results = []
    for impl in ("eager", "sdpa"):
        config = XLNetLiteConfig(**TINY)
        model = randomise(XLNetLiteLMHeadModel._from_config(config, attn_implementation=impl))
        assert model.config._attn_implementation == impl
        loss = model(
            ids(), perm_mask=perm_mask, target_mapping=target_mapping, token_type_ids=tt, labels=ids(1, length=P)
        ).loss
        loss.backward()
        results.append((loss.detach(), [p.grad for p in model.parameters()]))
    torch.testing.assert_close(results[0][0], results[1][0])
    for a, b in zip(results[0][1], results[1][1]):
        assert a.isfinite().all()
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)


def test_fully_masked_query_attends_to_nothing():
    """A query row that may see no key gets a zero attention vector (transformers' XLNet spreads it uniformly over
    every key, including the hidden ones): for both implementations."""
    outs = []
    for impl in ("eager", "sdpa"):
        model = lite_model(n_layer=1)
        model.config._attn_implementation = impl
        perm_mask = torch.ones(1, T, T)  # nobody may see anybody in the query stream
        target_mapping = torch.zeros(1, 1, T)
        target_mapping[0, 0, 3] = 1
        with torch.no_grad():
            a = model(ids(batch=1), perm_mask=perm_mask, target_mapping=target_mapping).logits
            changed = ids(batch=1).clone()
            changed[0, 3] = (changed[0, 3] + 5) % 97
            b = model(changed, perm_mask=perm_mask, target_mapping=target_mapping).logits
        torch.testing.assert_close(a, b, atol=0, rtol=0)
        outs.append(a)
    torch.testing.assert_close(outs[0], outs[1])


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_no_backward_pass_masks_a_gradient_of_every_score(impl):
    """The masks go on the scores (eager) or SDPA's bias by a fill whose backward passes the gradient through: the
    backward graph masks no (B, N, Q, K) gradient (that pass was 6% of an eager step on an H200), only rows."""
    perm_mask, target_mapping = xlnet_masks(B, T, P)
    blind_first_prediction(perm_mask, target_mapping)  # a row's mask too
    model = randomise(XLNetLiteLMHeadModel._from_config(XLNetLiteConfig(**TINY), attn_implementation=impl))
    loss = model(ids(), perm_mask=perm_mask, target_mapping=target_mapping, labels=ids(1, length=P)).loss
    seen, stack, masks = set(), [loss.grad_fn], []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        for saved in ("_saved_mask", "_saved_condition"):  # masked_fill's, torch.where's
            if hasattr(node, saved):
                masks.append((type(node).__name__, tuple(getattr(node, saved).shape)))
        stack.extend(next_node for next_node, _ in node.next_functions)
    assert masks and all(shape[-1] == 1 for _, shape in masks), masks


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("chunk_bytes", [3 * 4 * 37, 1 << 20])  # 3 rows of 37 classes a chunk (the last short); one
def test_the_cpu_loss_in_chunks_equals_cross_entropy_and_keeps_no_fp32_copy(monkeypatch, dtype, seed, chunk_bytes):
    """The CPU's cross-entropy in chunks of rows: F.cross_entropy(logits.float()) in loss and gradient (mean, and a
    sum over num_items_in_batch), rows at -100 ignored, a fully masked row (every score finfo.min) and a row of huge
    scores as F's, the logits left as they were; its graph keeps no fp32 scores of every row."""
    monkeypatch.setattr(modeling._ChunkedCrossEntropy, "CHUNK_BYTES", chunk_bytes)
    generator = torch.Generator().manual_seed(seed)
    rows, classes = 20, 37
    logits = (4 * torch.randn(rows, classes, generator=generator)).to(dtype)
    logits[3] = torch.finfo(dtype).min  # a question-answering row whose p_mask masks every position
    logits[7] += 3e4  # where logsumexp - x loses precision
    labels = torch.randint(0, classes, (rows,), generator=generator)
    labels[torch.randperm(rows, generator=generator)[:5]] = -100
    labels[3], labels[7] = 2, 5  # both scored
    for num_items in (None, torch.tensor(23)):
        ours, theirs = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
        loss = modeling.cross_entropy(ours, labels.int(), num_items)  # any integer labels
        reduction = "mean" if num_items is None else "sum"
        expected = F.cross_entropy(theirs.float(), labels, ignore_index=-100, reduction=reduction)
        expected = expected if num_items is None else expected / num_items
        torch.testing.assert_close(loss, expected, rtol=1e-6, atol=0)
        saved = loss.grad_fn.next_functions[0][0].saved_tensors  # the chunked loss's node, under the division
        assert all(t.numel() == rows for t in saved if t is not ours and t.dtype == torch.float32), saved
        (loss * 3).backward()
        (expected * 3).backward()
        tolerance = {} if dtype == torch.bfloat16 else dict(rtol=1e-6, atol=1e-7)  # bf16: within its rounding
        torch.testing.assert_close(ours.grad, theirs.grad, **tolerance)
        assert ours.grad[labels == -100].abs().max() == 0
        assert torch.equal(ours.detach(), logits)
    no_label = torch.full((rows,), -100)
    assert modeling.cross_entropy(logits, no_label).isnan()  # 0 / 0, as F.cross_entropy's mean
    for bad in (-1, classes):
        with pytest.raises(IndexError, match=f"Target {bad} is out of bounds"):  # F.cross_entropy's error
            modeling.cross_entropy(logits, torch.where(labels == 0, bad, labels).index_fill(0, torch.tensor([0]), bad))


@pytest.mark.parametrize("attn_type,rows", [("bi", 0), ("bi", 1), ("uni", 0), ("uni", 1)])  # T + rows queries
def test_the_shifted_positional_scores_backward_writes_every_entry_it_reads(monkeypatch, attn_type, rows):
    """The content stream's positional term and its gradients equal the composite rel_shift(q @ kr)'s, with the
    backward's buffer drawn full of NaN: what the shifted gradient does not cover (the head, each row's distances no
    key reads, the tail of predict_next's extra row) is zeroed, not left as it was."""
    T, M, N, D = 5, 3, 2, 4
    K = M + T
    R = K + T if attn_type == "bi" else K + 1
    generator = torch.Generator().manual_seed(rows)
    q = torch.randn(B, N, T + rows, D, generator=generator, requires_grad=True)
    kr = torch.randn(N, D, R, generator=generator, requires_grad=True)
    upstream = torch.randn(B, N, T + rows, K, generator=generator)
    expected = modeling.rel_shift(modeling.positional_scores(q, kr[None]), qlen=T, klen=K)
    expected_grads = torch.autograd.grad(expected, (q, kr), upstream)
    empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *args, **kwargs: empty(*args, **kwargs).fill_(float("nan")))
    out = modeling._ShiftedPositionalScores.apply(q, kr, T, K)
    grads = torch.autograd.grad(out, (q, kr), upstream)
    torch.testing.assert_close(out, expected)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad)


def test_torch_compile_forward_matches_eager():
    model = lite_model()
    perm_mask, target_mapping = xlnet_masks(B, T, P)
    compiled = torch.compile(model, backend="aot_eager")
    with torch.no_grad():
        ref = model(ids(), perm_mask=perm_mask, target_mapping=target_mapping).logits
        out = compiled(ids(), perm_mask=perm_mask, target_mapping=target_mapping).logits
    torch.testing.assert_close(ref, out)


def test_right_padding_is_refused_for_last_token_pooling():
    model = lite_model(cls=XLNetLiteForSequenceClassification)
    attention_mask = torch.ones(B, T, dtype=torch.long)
    attention_mask[0, -2:] = 0
    with pytest.raises(ValueError, match="pad on the left"):
        model(ids(), attention_mask=attention_mask)


BAD_INPUTS = [
    (dict(perm_mask=torch.zeros(B, T, T - 1)), "perm_mask must have shape"),
    (dict(perm_mask=torch.zeros(T, T)), "perm_mask must have shape"),
    (dict(target_mapping=torch.zeros(B, P, T + 1)), "target_mapping must have shape"),
    (dict(target_mapping=torch.full((B, P, T), 0.5)), "one-hot"),
    (
        dict(target_mapping=torch.eye(T)[None, :P].repeat(B, 1, 1), labels=torch.zeros(B, T, dtype=torch.long)),
        "labels must have shape",
    ),
    (dict(mems=[torch.zeros(B, 3, 32)]), "one tensor per layer"),
    (dict(mems=[torch.zeros(B, 3, 16)] * 2), r"mems\[0\] must have shape"),
    (dict(mems=[torch.zeros(B + 1, 3, 32)] * 2), r"mems\[0\] must have shape"),
    (dict(input_ids=None), "exactly one of input_ids"),
    (dict(inputs_embeds=torch.zeros(B, T, 32)), "exactly one of input_ids"),
    (dict(input_ids=torch.full((B, T), 97)), "vocab_size=97"),
    (dict(input_ids=torch.full((B, T), -1)), r"\[0, vocab_size"),
    (dict(attention_mask=torch.ones(B, T + 1)), "attention_mask must have shape"),
    (dict(token_type_ids=torch.zeros(B, 1, dtype=torch.long)), "token_type_ids must have shape"),
    (dict(attention_mask=torch.ones(B, T), input_mask=torch.zeros(B, T)), "only one of attention_mask"),
]


@pytest.mark.parametrize("kwargs,message", BAD_INPUTS)
def test_bad_input_names_the_argument(kwargs, message):
    model = lite_model()
    inputs = {"input_ids": ids(), **kwargs}
    with pytest.raises(ValueError, match=message):
        model(**inputs)


def test_odd_batch_with_bi_data():
    model = lite_model(bi_data=True)
    with pytest.raises(ValueError, match="even batch"):
        model(ids(batch=3))


@pytest.mark.parametrize(
    "kwargs,field",
    [
        (dict(d_model=30, n_head=4), "d_model"),
        (dict(attn_type="tri"), "attn_type"),
        (dict(ff_activation="nope"), "ff_activation"),
        (dict(mem_len=-3), "mem_len"),
        (dict(reuse_len=-1), "reuse_len"),
        (dict(clamp_len=-2), "clamp_len"),
        (dict(n_layer=0), "n_layer"),
        (dict(dropout=1.5), "dropout"),
    ],
)
def test_config_validation_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        XLNetLiteConfig(**{**TINY, **kwargs})


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_keeps_the_right_fraction_and_scales(p):
    from xlnet_lite.modeling_xlnet_lite import Dropout

    torch.manual_seed(0)
    x = torch.ones(501, 999, requires_grad=True)  # odd size: the mask covers every element
    y = Dropout(p).train()(x)
    kept = y > 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.005
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 1 / (1 - p)))
    y.sum().backward()
    assert torch.equal(x.grad > 0, kept)
    assert torch.equal(Dropout(p).eval()(x), x)


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_off_the_cheap_mask_devices_is_torchs_own(monkeypatch, p):
    """On a GPU (any device but the CPU) Dropout is F.dropout: the same output and gradient for the same seed."""
    from xlnet_lite import modeling_xlnet_lite as modeling

    monkeypatch.setattr(modeling, "CHEAP_MASK_DEVICES", set())  # the CPU as a GPU is treated
    x = torch.randn(37, 53, requires_grad=True)
    torch.manual_seed(3)
    y = modeling.Dropout(p).train()(x)
    (grad,) = torch.autograd.grad(y, x, torch.ones_like(y))
    torch.manual_seed(3)
    expected = F.dropout(x, p, training=True)
    (expected_grad,) = torch.autograd.grad(expected, x, torch.ones_like(expected))
    assert torch.equal(y, expected) and torch.equal(grad, expected_grad)
    assert modeling.CHEAP_MASK_DEVICES == set()
    monkeypatch.undo()
    torch.manual_seed(3)
    assert not torch.equal(modeling.Dropout(p).train()(x), expected)  # the CPU's own mask: drawn another way


def test_gradient_checkpointing_with_dropout_replays_the_same_masks():
    perm_mask, target_mapping = xlnet_masks(B, T, P)
    grads = []
    for checkpointing in (False, True):
        model = lite_model(dropout=0.3).train()
        if checkpointing:
            model.activation_checkpointing_enable()
        torch.manual_seed(5)
        loss = model(ids(), perm_mask=perm_mask, target_mapping=target_mapping, labels=ids(1, length=P)).loss
        loss.backward()
        grads.append([p.grad for p in model.parameters() if p.grad is not None])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)
    torch.manual_seed(6)  # and the masks are really random: another seed, other gradients
    model = lite_model(dropout=0.3).train()
    model(ids(), perm_mask=perm_mask, target_mapping=target_mapping, labels=ids(1, length=P)).loss.backward()
    assert any(
        not torch.allclose(a, p.grad) for a, p in zip(grads[0], (q for q in model.parameters() if q.grad is not None))
    )
