"""The fused Triton attention (attn_implementation="xlnet_lite_triton"), run on the CPU in Triton's interpreter:
the kernels against a plain PyTorch reference, forward and every gradient, and the model on them against
transformers' XLNet (forward) and against its own explicit kernel (a training step's gradients). On a GPU the same
kernels are compiled; tests/model/test_gpu.py runs them there."""

import sys
from collections import Counter

import pytest
import torch
import torch.nn.functional as F

triton = pytest.importorskip("triton")  # on a CPU conftest.py has chosen its interpreter
tl = pytest.importorskip("triton.language")

from model_helpers import (  # noqa: E402
    BENCH_TINY,
    TINY,
    plain_relative_attention,
    randomise,
    run_both,
    segments_and_left_padding,
    twins,
)

import xlnet_lite  # noqa: E402
from xlnet_lite.collator import random_factorization_masks as xlnet_masks  # noqa: E402
from xlnet_lite.modeling_xlnet_lite import (  # noqa: E402
    NO_DIAGONAL,
    TRITON_ATTENTION,
    MaskRanks,
    blocked_positions,
    content_stream_mask,
    mask_ranks,
    rel_shift,
    triton_mask_ranks,
)
from xlnet_lite.triton_attention import relative_attention  # noqa: E402

B, T, P = 3, 21, 5  # T not a multiple of the interpreter's 16-row tiles
KERNEL_NAMES = ("_attn_fwd", "_attn_bwd_dkdv", "_attn_bwd_dq", "_attn_bwd_dkr")


def tall_tiles(monkeypatch):
    """For the test, the interpreter's forward and dq at 32 rows by 16 keys, dk/dv at 16 rows by 32 keys held keys by
    rows (bench_triton_kernels' 32x64/4/3 scaled to the interpreter's tiles)."""
    from xlnet_lite import triton_attention as ta

    interpreter = ta.launch_settings(torch.device("cpu"), torch.float32)
    for kernel, (rows, keys) in dict(forward=(32, 16), dq=(32, 16), dk_dv=(16, 32)).items():
        monkeypatch.setitem(interpreter, kernel, ta.Launch(rows, 1, 1, keys=keys))


def logged_launches(monkeypatch, launched, flag):
    """The module's four kernels, for the test, log (kernel, its launch's keyword `flag`) into `launched` as they
    launch."""
    from xlnet_lite import triton_attention as ta

    def logged(kernel, name):
        class Logged:
            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    launched.append((name, kwargs.get(flag)))
                    return kernel[grid](*args, **kwargs)

                return launch

        return Logged()

    for attr in KERNEL_NAMES:
        monkeypatch.setattr(ta, attr, logged(getattr(ta, attr), attr))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("banded", [True, False])
@pytest.mark.parametrize("whole_keys", [False, True])
def test_kernels_equal_the_plain_attention_forward_and_backward(monkeypatch, seed, banded, whole_keys):
    """Scores with every term (content, positional banded or dense, segments, perm-style masks with a row that sees
    nothing), 2 heads of size 12 (padded to 16 inside), queries and keys not multiples of the tile, a memory of 6;
    positional keys shared by the batch or one per row (bi_data), a mask per row or shared by the batch ("uni"):
    output and the gradient of every input. Or (whole_keys) 17 queries, a memory of 15 and heads of 16: keys and
    head that fill whole tiles (EVEN: no bounds checked) with queries that do not (the rows past them reading the
    last query's operands, that query seeing no key in one batch row)."""
    launched = []
    logged_launches(monkeypatch, launched, "EVEN")
    gen = torch.Generator().manual_seed(seed)
    N, Q, M, D = (2, 17, 15, 16) if whole_keys else (2, 19, 6, 12)
    K, R = Q + M, 2 * Q + M

    def rand(*shape):
        return torch.randn(*shape, generator=gen).requires_grad_()

    qw, qr, k, v = rand(B, N, Q, D), rand(B, N, Q, D), rand(B, N, K, D), rand(B, N, K, D)
    kr = rand(B if seed == 2 else 1, N, D, R) if banded else None
    pos = None if banded else rand(B, N, Q, K)
    gain = rand(B, N, Q)
    seg_q, seg_k = torch.randint(0, 3, (B, Q), generator=gen), torch.randint(0, 3, (B, K), generator=gen)
    blocked = torch.rand(1 if seed == 1 else B, Q, K, generator=gen) < 0.5
    blocked[-1, 4] = True  # a query that may see no key
    if whole_keys:
        blocked[0, -1] = True  # and the last one, whose operands the rows past the queries read
    out = relative_attention(
        qw,
        k,
        v,
        qr=qr if banded else None,
        kr=kr,
        pos=pos,
        gain=gain,
        seg_q=seg_q,
        seg_k=seg_k,
        blocked=blocked,
        qlen=Q,
    )
    expected = plain_relative_attention(qw, qr, k, v, kr, pos, gain, seg_q, seg_k, blocked, Q)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert out[-1, 4].abs().max() == 0
    inputs = [t for t in (qw, qr if banded else None, k, v, kr, pos, gain) if t is not None]
    grad_out = torch.randn(out.shape, generator=gen)
    got = torch.autograd.grad((out * grad_out).sum(), inputs)
    want = torch.autograd.grad((expected * grad_out).sum(), inputs)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)
    assert {even for name, even in launched if name != "_attn_bwd_dkr"} == {whole_keys}


@pytest.mark.parametrize("banded", [True, False])
def test_the_mask_as_ranks_gives_what_the_mask_gives(banded):
    """MaskRanks in place of the block it stands for: the kernels compare a row's rank with a key's (the content
    stream re-opening its own key, at a memory of 6) and give the output and every gradient bit for bit as they do
    reading the block; ties among the ranks, a row that blocks every key, ranks shared by the batch."""
    gen = torch.Generator().manual_seed(7)
    N, Q, M, D = 2, 19, 6, 12
    K = Q + M

    def rand(*shape):
        return torch.randn(*shape, generator=gen).requires_grad_()

    qw, qr, k, v = rand(B, N, Q, D), rand(B, N, Q, D), rand(B, N, K, D), rand(B, N, K, D)
    kr, pos = (rand(1, N, D, 2 * Q + M), None) if banded else (None, rand(B, N, Q, K))
    gain = rand(B, N, Q)
    seg_q, seg_k = torch.randint(0, 3, (B, Q), generator=gen), torch.randint(0, 3, (B, K), generator=gen)
    for rows in (B, 1):
        row_rank = torch.randint(0, K + 1, (rows, Q), generator=gen, dtype=torch.int32)
        row_rank[0, 3] = K  # blocks every key (but its own, in the content stream)
        key_rank = torch.randint(1, K // 2, (rows, K), generator=gen, dtype=torch.int32)  # many ties
        diagonal = M if banded else NO_DIAGONAL
        own = torch.arange(K)[None, :] == torch.arange(Q)[:, None] + diagonal
        blocked = (key_rank[:, None, :] <= row_rank[:, :, None]) & ~own
        assert blocked.any() and not blocked.all()
        terms = dict(qr=qr if banded else None, kr=kr, pos=pos, gain=gain, seg_q=seg_q, seg_k=seg_k, qlen=Q)
        out_block = relative_attention(qw, k, v, blocked=blocked, **terms)
        ranks = MaskRanks(torch.cat([row_rank, key_rank], dim=-1), diagonal)
        out_ranks = relative_attention(qw, k, v, blocked=ranks, **terms)
        assert torch.equal(out_ranks, out_block)
        expected = plain_relative_attention(qw, qr, k, v, kr, pos, gain, seg_q, seg_k, blocked, Q)
        torch.testing.assert_close(out_ranks, expected, atol=1e-5, rtol=1e-5)
        inputs = [t for t in (qw, qr if banded else None, k, v, kr, pos, gain) if t is not None]
        grad_out = torch.randn(out_block.shape, generator=gen)
        got = torch.autograd.grad((out_ranks * grad_out).sum(), inputs)
        want = torch.autograd.grad((out_block * grad_out).sum(), inputs)
        for a, b in zip(got, want):
            assert torch.equal(a, b)
    with pytest.raises(ValueError, match="MaskRanks has 5 ranks, not Q \\+ K = 44"):
        relative_attention(qw, k, v, blocked=MaskRanks(torch.zeros(B, 5, dtype=torch.int32)), **terms)


def test_mask_ranks_exist_exactly_when_the_rows_nest():
    """mask_ranks over many random masks: ranks that reproduce the mask whenever every two rows' blocked keys are
    nested, None otherwise; XLNet's factorization masks with left padding, a memory, a shared causal mask or none,
    always nest (the kernels' fast path in pretraining)."""
    gen = torch.Generator().manual_seed(0)
    found = {True: 0, False: 0}
    for trial in range(300):
        Q, K = int(torch.randint(1, 9, (1,), generator=gen)), int(torch.randint(1, 9, (1,), generator=gen))
        if trial % 2:  # nested by construction: thresholds on random key scores
            score = torch.randint(0, 4, (2, K), generator=gen)
            blocked = score[:, None, :] >= torch.randint(0, 5, (2, Q, 1), generator=gen)
        else:
            blocked = torch.rand(2, Q, K, generator=gen) < 0.5
        beyond = (blocked[:, :, None, :] & ~blocked[:, None, :, :]).any(-1)  # (2, Q, Q): row i blocks a key i' does not
        nested = not (beyond & beyond.transpose(1, 2)).any()
        ranks = mask_ranks(blocked)
        assert (ranks is not None) == nested, blocked
        if ranks is not None:
            row_rank, key_rank = ranks.ranks.split([Q, K], dim=-1)
            assert ranks.ranks.dtype == torch.int32 and ranks.diagonal == NO_DIAGONAL
            assert torch.equal(key_rank[:, None, :] <= row_rank[:, :, None], blocked)
        found[nested] += 1
    assert min(found.values()) > 50, found
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[1, :3] = True
    for seed in range(20):
        perm_mask, _ = xlnet_masks(B, T, P, seed=seed)
        for attn_type, perm in (("bi", perm_mask), ("uni", None)):
            blocked = blocked_positions(
                perm_mask=perm, pad_mask=pad, attn_type=attn_type, same_length=False, qlen=T, mlen=4, device="cpu"
            )
            assert mask_ranks(blocked) is not None


def test_the_content_stream_takes_ranks_of_its_own_where_its_mask_nests():
    """triton_mask_ranks: the content stream's mask (the query stream's with each row's own key re-opened) as ranks
    of its own, with no key re-opened (one comparison a score fewer in the kernels), for XLNet's factorization masks
    over a memory; where re-opening the diagonal leaves rows that do not nest (two rows blocking the same keys, their
    own among them: left padding, or every key of the segment blocked) the query stream's ranks with the diagonal
    re-opened. Each reproduces the content stream's mask exactly, and the query stream's ranks its rows."""

    def as_block(ranks, Q):
        row_rank, key_rank = ranks.ranks.split([Q, ranks.ranks.shape[-1] - Q], dim=-1)
        own = torch.arange(key_rank.shape[-1])[None, :] == torch.arange(Q)[:, None] + ranks.diagonal
        return (key_rank[:, None, :] <= row_rank[:, :, None]) & ~own

    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[1, :3] = True
    tied = torch.ones(1, T, T, dtype=torch.bool)  # every row blocks every key of the segment, its own among them
    for seed in range(10):
        perm_mask, target_mapping = xlnet_masks(B, T, P, seed=seed)
        query_pos = target_mapping.argmax(-1)
        for perm, padding, diagonal in ((perm_mask, None, NO_DIAGONAL), (perm_mask, pad, 4), (tied, None, 4)):
            blocked = blocked_positions(
                perm_mask=perm, pad_mask=padding, attn_type="bi", same_length=False, qlen=T, mlen=4, device="cpu"
            )
            content, query = triton_mask_ranks(blocked, mlen=4, query_pos=query_pos)
            assert content.diagonal == diagonal and query.diagonal == NO_DIAGONAL
            want = content_stream_mask(blocked, qlen=T, mlen=4).expand(B, -1, -1)
            assert torch.equal(as_block(content, T).expand(B, -1, -1), want)
            rows = blocked.expand(B, -1, -1).gather(1, query_pos[:, :, None].expand(-1, -1, T + 4))
            assert torch.equal(as_block(query, P).expand(B, -1, -1), rows)


def test_kernel_forms_reads_the_masks_and_the_segment_ids_once_and_passes_the_operator_checks():
    """kernel_forms (the model's, for the kernels): the segment ids counted as max id + 1 where none is negative (the
    one-hot dims need ids in [0, count)), else 0, as with none; the masks' forms as triton_mask_ranks gives them
    (ranks exact where found; a mask of no such form or no query stream: none); the facts on the CPU (the operators
    read them without a sync); torch.library.opcheck (schema, the shapes torch.compile is told, no aliasing) on
    masks of both batch shapes, with and without a query stream and ids."""
    from xlnet_lite.modeling_xlnet_lite import KernelForms, kernel_forms

    perm_mask, target_mapping = xlnet_masks(B, T, P, seed=2)
    query_pos = target_mapping.argmax(-1)
    blocked = blocked_positions(
        perm_mask=perm_mask, pad_mask=None, attn_type="bi", same_length=False, qlen=T, mlen=4, device="cpu"
    )
    scrambled = F.pad(torch.rand(B, T, T, generator=torch.Generator().manual_seed(3)) < 0.5, (4, 0))
    causal = blocked_positions(
        perm_mask=None, pad_mask=None, attn_type="uni", same_length=False, qlen=T, mlen=4, device="cpu"
    )  # (1, T, K)
    for ids, classes in (([[0, 2, 1], [4, 0, 0]], 5), ([[0, -1, 1], [0, 0, 0]], 0), ([[0, 0, 0], [0, 0, 0]], 1)):
        seg_keys = torch.tensor(ids).repeat_interleave(9, dim=1)[:, : T + 4]
        ranks_h, facts_h, ranks_g, facts_g = kernel_forms(blocked, query_pos, seg_keys, 4)
        assert facts_h.device.type == facts_g.device.type == "cpu"
        assert facts_h[2] == facts_g[2] == classes
    _, facts_h, _, facts_g = kernel_forms(blocked, None, None, 4)
    assert facts_h[2] == facts_g[2] == 0 and facts_g[0] == 0  # no ids, no query stream
    content, query = triton_mask_ranks(blocked, mlen=4, query_pos=query_pos)
    found = kernel_forms(blocked, query_pos, None, 4)
    assert torch.equal(KernelForms(*found[:2]).mask_ranks().ranks, content.ranks)
    assert torch.equal(KernelForms(*found[2:]).mask_ranks().ranks, query.ranks)
    _, facts_h, _, facts_g = kernel_forms(scrambled, query_pos, None, 4)
    assert facts_h[0] == facts_g[0] == 0

    def free(mask):  # leading keys no row of any batch row blocks
        seen_by_all = [not mask[:, :, j].any() for j in range(mask.shape[-1])]
        return seen_by_all.index(False) if False in seen_by_all else len(seen_by_all)

    for mask in (blocked, scrambled, causal, torch.ones_like(scrambled), torch.zeros_like(scrambled)):
        _, facts_h, _, facts_g = kernel_forms(mask, query_pos, None, 4)
        content = content_stream_mask(mask, qlen=T, mlen=4)
        assert (facts_h[3], facts_g[3]) == (free(content), free(mask))
    assert free(blocked) >= 4 and free(causal) == 5 and free(scrambled) == 4
    assert kernel_forms(None, None, seg_keys, 4)[1][3] == 0  # no mask given: none free
    seg_keys = torch.randint(0, 2, (B, T + 4))
    for args in (
        (blocked, query_pos, seg_keys, 4),
        (scrambled, None, seg_keys, 4),
        (causal, query_pos, None, 4),
        (None, None, seg_keys, 0),
    ):
        torch.library.opcheck(kernel_forms, args)
    with pytest.raises(ValueError, match="needs a mask, query rows or segment ids"):
        kernel_forms(None, None, None, 0)
    with torch.device("meta"):  # the facts stay on the CPU whatever the default device
        assert kernel_forms(None, None, torch.zeros(2, 3, dtype=torch.long, device="cpu"), 0)[1].device.type == "cpu"


def test_the_model_gives_the_kernels_ranks_for_factorization_masks_and_the_block_otherwise(monkeypatch):
    """Both streams of a pretraining batch (factorization masks, segments, left padding, a memory of 5) reach the
    kernels as MaskRanks, and a perm_mask of no factorization order as the block, with the segment ids counted;
    transformers' logits either way."""
    seen = []
    forms_seen(monkeypatch, seen)
    hf, lite = twins(mem_len=5)
    perm_mask, target_mapping = xlnet_masks(B, T, P, seed=3)
    ids = torch.randint(0, 97, (B, T), generator=torch.Generator().manual_seed(4))
    first_hf, first_lite = run_both(hf, lite, TRITON_ATTENTION, input_ids=ids.flip(1))  # the memory
    scrambled = torch.rand(B, T, T, generator=torch.Generator().manual_seed(6)) < 0.5
    # the first layer's content stream (left padding: its own key re-opened) and query stream, the last's query stream
    for mask, kinds in ((perm_mask, ["diagonal", "ranks", "ranks"]), (scrambled.float(), ["block"] * 3)):
        seen.clear()
        inputs = dict(input_ids=ids, perm_mask=mask, target_mapping=target_mapping, **segments_and_left_padding((B, T)))
        with torch.no_grad():
            a, b = hf(**inputs, mems=first_hf.mems), lite(**inputs, mems=first_lite.mems)
        torch.testing.assert_close(a.logits, b.logits, atol=1e-4, rtol=1e-4)
        assert seen == [(kind, 3) for kind in kinds]  # ids 0, 1, 2 counted


def forms_seen(monkeypatch, seen):
    """The operators, for the test, log into `seen` the form of the mask they hand the kernels ("ranks", "diagonal":
    ranks with each row's own key re-opened, or "block") and the segment ids' count (0: compared), as they run
    (forward and backward, eager or compiled)."""
    from xlnet_lite import triton_attention as ta

    decide = ta._forms

    def spy(*args):
        blocked, diagonal, classes, free = decide(*args)
        ranked = blocked is not None and blocked.dtype == torch.int32
        seen.append(("block" if not ranked else "ranks" if diagonal == NO_DIAGONAL else "diagonal", classes))
        return blocked, diagonal, classes, free

    monkeypatch.setattr(ta, "_forms", spy)


def pretraining_batch(seed, length=T, targets=P):
    """A batch of the pretraining recipe's kind: tokens, factorization masks and targets, their labels."""
    perm_mask, target_mapping = xlnet_masks(B, length, targets, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    return dict(
        input_ids=torch.randint(0, 97, (B, length), generator=gen),
        perm_mask=perm_mask,
        target_mapping=target_mapping,
        labels=torch.randint(0, 97, (B, targets), generator=gen),
    )


def training_step(forward, model, inputs):
    """The loss of forward(**inputs) and the gradient of each of model's parameters, from cleared gradients."""
    model.zero_grad()
    loss = forward(**inputs).loss
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.slow
def test_model_on_the_kernels_equals_transformers():
    """Two streams with perm_mask, target_mapping, segments, left padding and a memory: transformers' logits."""
    hf, lite = twins(mem_len=7)
    perm_mask, target_mapping = xlnet_masks(B, T, P, seed=1)
    inputs = dict(
        input_ids=torch.randint(0, 97, (B, T), generator=torch.Generator().manual_seed(2)),
        perm_mask=perm_mask,
        target_mapping=target_mapping,
        **segments_and_left_padding((B, T)),
    )
    a, b = run_both(hf, lite, TRITON_ATTENTION, **inputs)
    torch.testing.assert_close(a.logits, b.logits, atol=1e-4, rtol=1e-4)
    with torch.no_grad():  # the next segment reads the memory
        a2 = hf(inputs["input_ids"].flip(1), mems=a.mems)
        b2 = lite(inputs["input_ids"].flip(1), mems=b.mems)
    torch.testing.assert_close(a2.logits, b2.logits, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
def test_a_training_step_has_the_explicit_kernels_gradients():
    """The pretraining loss through the fused kernels, and every parameter's gradient, equal the explicit
    kernel's (dropout 0, fp32, memory carried in, segments)."""
    config = xlnet_lite.XLNetLiteConfig(**{**TINY, "mem_len": 6})
    model = randomise(xlnet_lite.XLNetLiteLMHeadModel(config), seed=3).train()
    gen = torch.Generator().manual_seed(5)
    inputs = dict(
        **pretraining_batch(4),
        mems=[torch.randn(B, 6, 32, generator=gen) for _ in range(2)],
        **segments_and_left_padding((B, T)),
    )
    results = {}
    for kernel in ("eager", TRITON_ATTENTION):
        model.config._attn_implementation = kernel
        results[kernel] = training_step(model, model, inputs)
    (loss_e, grads_e), (loss_t, grads_t) = results["eager"], results[TRITON_ATTENTION]
    torch.testing.assert_close(loss_t, loss_e, atol=1e-5, rtol=1e-5)
    assert grads_t.keys() == grads_e.keys() and len(grads_e) > 10
    for name in grads_e:
        torch.testing.assert_close(grads_t[name], grads_e[name], atol=1e-5, rtol=1e-4, msg=name)


def test_classifier_and_generate_on_the_kernels():
    """The classifier (its last layer's content stream at <cls> only: the dense form) and generate() with its
    key/value cache (predict_next's fused streams) give transformers' logits and tokens."""
    hf, lite = twins("XLNetForSequenceClassification", num_labels=3)
    ids = torch.randint(0, 97, (B, T), generator=torch.Generator().manual_seed(6))
    a, b = run_both(hf, lite, TRITON_ATTENTION, input_ids=ids, **segments_and_left_padding((B, T)))
    torch.testing.assert_close(a.logits, b.logits, atol=1e-4, rtol=1e-4)
    hf, lite = twins()
    lite.config._attn_implementation = TRITON_ATTENTION
    prompt = ids[:1, :6]
    want = hf.generate(prompt, max_new_tokens=4, do_sample=False)
    got = lite.generate(prompt, max_new_tokens=4, do_sample=False)
    assert torch.equal(got, want)


def test_refuses_other_models_and_a_cpu_without_the_interpreter(monkeypatch):
    """Another model cannot take the name; a CPU tensor outside the interpreter is refused in one line instead of
    failing inside Triton."""
    import transformers

    with pytest.raises(ValueError, match="XLNet-Lite's own"):
        config = transformers.BertConfig(
            hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16, vocab_size=20
        )
        bert = transformers.AutoModel.from_config(config, attn_implementation=TRITON_ATTENTION)
        bert(torch.zeros(1, 4, dtype=torch.long))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x = torch.zeros(1, 1, 4, 16)
    if not x.is_cuda:
        with pytest.raises(ValueError, match="needs a CUDA device.*TRITON_INTERPRET=1"):
            relative_attention(x, x, x, pos=torch.zeros(1, 1, 4, 4), qlen=4)


def test_no_queries_or_no_keys_launch_nothing(monkeypatch):
    """With no query rows or no keys the operator launches no kernel (the kernels assume both, so that their loops run
    at least once) and gives rows of zeros, as for a row whose every key is blocked: (B, Q, N, D)."""

    launched = []
    logged_launches(monkeypatch, launched, "BAND")
    batch, N, D = 2, 3, 16
    for Q, K in ((0, 5), (4, 0), (0, 0)):
        qw, k = torch.randn(batch, N, Q, D), torch.randn(batch, N, K, D)
        out = relative_attention(qw, k, k, pos=torch.randn(batch, N, Q, K), qlen=Q)
        assert out.shape == (batch, Q, N, D) and not out.any()
    assert launched == []


def test_dropout_inside_the_kernels_is_one_mask_forward_and_backward():
    """With dropout 0.1 the kernels drop each probability with that chance (after the softmax, the kept ones scaled
    by 1 / 0.9), and the backward kernels redraw the same mask: read back through values that are the identity, the
    mask gives the plain attention's output and every gradient for other values, the same seed."""
    gen = torch.Generator().manual_seed(0)
    N, Q, M, D, p = 2, 16, 16, 32, 0.1
    K = Q + M

    def rand(*shape):
        return torch.randn(*shape, generator=gen).requires_grad_()

    qw, qr, k, kr, gain = rand(B, N, Q, D), rand(B, N, Q, D), rand(B, N, K, D), rand(1, N, D, 2 * Q + M), rand(B, N, Q)
    seg_q, seg_k = torch.randint(0, 2, (B, Q), generator=gen), torch.randint(0, 2, (B, K), generator=gen)
    blocked = torch.rand(B, Q, K, generator=gen) < 0.3
    terms = dict(qr=qr, kr=kr, gain=gain, seg_q=seg_q, seg_k=seg_k, blocked=blocked, qlen=Q)

    def attention(v, seed):
        torch.manual_seed(seed)  # the kernels' seed comes from torch's generator
        return relative_attention(qw, k, v, dropout_p=p, **terms)

    with torch.no_grad():
        identity = torch.eye(K, D).expand(B, N, K, D)
        dropped = attention(identity, seed=1).transpose(1, 2)[..., :K]  # (B, N, Q, K): prob * mask / (1 - p)
        prob = plain_relative_attention(qw, qr, k, identity, kr, None, gain, seg_q, seg_k, blocked, Q)
        prob = prob.transpose(1, 2)[..., :K]
    seen = prob > 1e-6  # (the ratio of smaller ones is rounding)
    scale = dropped[seen] / prob[seen]
    kept = (scale - 1 / (1 - p)).abs() < 1e-3
    assert (kept | (scale.abs() < 1e-6)).all()  # every seen probability kept (scaled) or dropped, nothing else
    assert 0.07 < 1 - kept.float().mean() < 0.13  # of about 1,600 seen
    mask = (dropped > prob * 0.5 / (1 - p)).float() / (1 - p)  # every probability's, the smallest ones too
    v = rand(B, N, K, D)
    out = attention(v, seed=1)
    with torch.no_grad():
        assert not torch.equal(out, attention(v, seed=2))
    score = qw @ k.transpose(-1, -2) + rel_shift(qr @ kr, qlen=Q, klen=K)
    score = score + gain[..., None] * (seg_q[:, None, :, None] == seg_k[:, None, None, :])
    expected = ((score.masked_fill(blocked[:, None], float("-inf")).softmax(-1) * mask) @ v).transpose(1, 2)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    inputs = (qw, qr, k, v, kr, gain)
    grad_out = torch.randn(out.shape, generator=gen)
    got = torch.autograd.grad((out * grad_out).sum(), inputs)
    want = torch.autograd.grad((expected * grad_out).sum(), inputs)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)


@pytest.mark.slow
def test_a_model_trains_with_attention_dropout_reproducibly(monkeypatch):
    """The model in training with dropout 0.1 on the kernels: the kernels are given the rate (0 in eval), the same
    torch seed gives the same loss and gradients, another seed another loss, and neither is the loss without
    dropout."""
    from xlnet_lite import triton_attention

    rates, kernels = [], triton_attention.relative_attention

    def recording(*args, **kwargs):
        rates.append(kwargs["dropout_p"])
        return kernels(*args, **kwargs)

    monkeypatch.setattr(triton_attention, "relative_attention", recording)
    config = xlnet_lite.XLNetLiteConfig(**{**TINY, "dropout": 0.1})
    model = randomise(xlnet_lite.XLNetLiteLMHeadModel(config), seed=4).train()
    model.config._attn_implementation = TRITON_ATTENTION
    inputs = pretraining_batch(2, length=12, targets=3)  # one tile: the interpreter's time goes to the other tests

    def step(seed):
        torch.manual_seed(seed)
        loss, grads = training_step(model, model, inputs)
        return loss.item(), grads

    (loss_a, grads_a), (loss_b, grads_b), (loss_c, _) = step(0), step(0), step(1)
    assert loss_a == loss_b and all(torch.equal(grads_a[n], grads_b[n]) for n in grads_a)
    assert loss_c != loss_a
    assert set(rates) == {0.1} and len(rates) == 3 * 3  # 3 steps of 2 layers' query streams and 1 content stream
    with torch.no_grad():
        assert model.eval()(**inputs).loss.item() not in (loss_a, loss_c)
    assert set(rates[9:]) == {0.0}


@pytest.mark.slow
def test_compiled_whole_with_the_kernels_inside(monkeypatch):
    """torch.compile(fullgraph=True) takes the kernels as operators in its graph (no break around them) and a
    training step gives the uncompiled step's loss and gradients; the kernels are handed the masks in the same forms
    and the segment ids counted as in eager mode, read from the data when the graph runs: the query stream's ranks,
    3 ids. One layer (its query stream only: a second compiles the operators again, twice the time on a CPU; the
    content stream's forms compiled: test_gpu.py)."""
    config = xlnet_lite.XLNetLiteConfig(**{**TINY, "mem_len": 6, "n_layer": 1})
    model = randomise(xlnet_lite.XLNetLiteLMHeadModel(config), seed=7).train()
    model.config._attn_implementation = TRITON_ATTENTION
    inputs = dict(**pretraining_batch(8), **segments_and_left_padding((B, T)))
    seen = []
    forms_seen(monkeypatch, seen)
    loss_a, grads_a = training_step(model, model, inputs)
    eager = list(seen)
    seen.clear()
    loss_b, grads_b = training_step(torch.compile(model, fullgraph=True, dynamic=False), model, inputs)
    assert Counter(seen) == Counter(eager) == Counter({("ranks", 3): 2})  # the query stream, forward and backward
    torch.testing.assert_close(loss_b, loss_a, atol=1e-5, rtol=1e-5)
    assert grads_b.keys() == grads_a.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], atol=1e-5, rtol=1e-4, msg=name)


def test_attention_benchmark_runs_and_its_rows_agree(tmp_path):
    """benchmarks/bench_triton_attention.py at its CPU shape: every row timed, the Triton rows' outputs (the mask as
    the block and as ranks, the positional term as the band and by one matmul) the SDPA path's (the check its GPU run
    reports)."""
    import json

    from benchmarks import bench_triton_attention

    out = tmp_path / "attention.json"
    bench_triton_attention.main(["--shape", "tiny", "--runs", "1", "--warmup", "0", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    triton = ("triton_tile16_warps1", "triton_tile16_warps1_ranks", "triton_tile16_warps1_ranks_matmul")
    assert set(rows) == {"sdpa_path", *triton}
    assert rows["sdpa_path"]["median_s"] > 0
    for name in triton:
        assert rows[name]["max_abs_diff_vs_sdpa"] < 1e-5 and rows[name]["max_abs_grad_diff_vs_sdpa"] < 1e-5


@pytest.mark.slow
def test_kernel_benchmark_times_each_kernel_at_each_setting_and_variant(tmp_path):
    """benchmarks/bench_triton_kernels.py at its CPU shape: every kernel timed in the default row, at each other setting
    (every kernel at it: square tiles of 32, tiles of 32 rows by 16 keys, those with dkr added up in dq, dk/dv at 16
    rows by 32 keys) and in each variant (dkr not launched when the positional term is dense, a matmul's product or dq
    adds dkr up); a setting only reorders sums, and the mask as the block, the dense positional term, the matmul's and
    dkr added up in dq give the same scores and gradients (each within 1e-5 of the default's); every row's step takes
    at least its kernels' time; each kernel's fastest setting is the fastest of the rows that launch every kernel; a
    setting not of that form is refused; POSITIONAL is as before after the run."""
    import json

    from benchmarks import bench_triton_kernels as bench
    from xlnet_lite import triton_attention as ta

    positional = dict(ta.POSITIONAL)
    out = tmp_path / "kernels.json"
    given = ["16x16/1/1", "32x32/1/1", "32x16/1/1", "32x16/1/1/atomic", "16x32/1/1", "16x16/1/1/matmul"]
    bench.main(["--shape", "tiny", "--runs", "1", "--warmup", "0", "--settings", *given, "--out", str(out)])
    result = json.loads(out.read_text())
    rows = {r["label"]: r for r in result["rows"]}
    settings = [f"tile{t}_warps1_stages1" for t in ("32x32", "32x16", "32x16", "16x32")]
    settings[2] += "_atomic"
    matmul = "tile16x16_warps1_stages1_matmul"  # the defaults' tiles, the positional term by one matmul
    others = [v for v in bench.VARIANTS if v not in ("dkr_atomic", "matmul")]
    assert list(rows) == ["default", "dkr_atomic", "matmul", *settings, matmul, *others] and not result["refused"]
    assert rows[matmul]["settings"] == rows["default"]["settings"]
    assert ta.POSITIONAL == positional
    for label, row in rows.items():
        timed = {k for k, s in row["median_s"].items() if s > 0}
        assert row["step_s"] >= row["total_s"] > 0, label
        no_dkr = label in ("dense", "matmul", "dkr_atomic", settings[2], matmul)
        assert timed == ({"forward", "dk_dv", "dq"} if no_dkr else {"forward", "dk_dv", "dq", "dkr"}), label
        if label in ("nomask", "noseg", "dropout"):  # other scores: no check
            assert row["max_abs_diff_vs_default"] is None, label
        else:
            assert row["max_abs_diff_vs_default"] < 1e-5, label
    square = dict(tile=32, warps=1, stages=1, keys=None)
    assert all(s == square for s in rows[settings[0]]["settings"].values())
    assert rows[settings[1]]["settings"] == {
        **dict.fromkeys(("forward", "dk_dv", "dq"), dict(square, keys=16)),
        "dkr": dict(square, tile=16),
    }
    assert rows[settings[2]]["settings"] == {**rows[settings[1]]["settings"], "dkr": None}
    assert rows[settings[3]]["settings"] == {
        **rows[settings[1]]["settings"],
        "dk_dv": dict(square, tile=16, keys=32),  # held keys by rows
    }
    for kernel, best in result["fastest"].items():  # of the rows that launch every kernel
        timed = [rows[label] for label in ("default", *settings[:2], settings[3])]
        fastest = min(timed, key=lambda row: row["median_s"][kernel])
        assert best == dict(setting=fastest["settings"][kernel], median_s=fastest["median_s"][kernel])
    for bad in (
        "24x24/1/1",
        "32x32/3/1",
        "64x16/4/1",
        "16x64/4/1",
        "8x16/1/1",
        "32x32/1",
        "32",
        "32x32/1/1/atom",
        "32x32/1/1/atomic/matmul",
    ):
        with pytest.raises(SystemExit):
            bench.main(["--shape", "tiny", "--settings", bad, "--out", str(out)])


def test_bench_gpu_matmul_row_is_the_triton_row_with_the_positional_term_by_one_matmul(monkeypatch):
    """benchmarks/bench_gpu.py's lite_triton_matmul_nodrop_bf16 runs the dropout-0 Triton row's weights, batch and
    memory with POSITIONAL "matmul" and its launch setting through its forward and backward (no dkr kernel launched;
    the plain row launches one a layer), gives its loss and gradients, and leaves POSITIONAL and LAUNCH as they
    were."""
    from benchmarks import bench_gpu
    from xlnet_lite import triton_attention as ta

    positional, table = dict(ta.POSITIONAL), {k: dict(v) for k, v in ta.LAUNCH.items()}
    monkeypatch.setitem(bench_gpu.MATMUL, "lite_triton_matmul_nodrop_bf16", "32x32/1/1")  # the interpreter's speed
    launched = []
    logged_launches(monkeypatch, launched, "BLOCK_M")  # the forward's rows a tile; the dkr kernel's: None
    cfg = BENCH_TINY
    variants = bench_gpu.build(cfg, ["lite_triton_nodrop_bf16", "lite_triton_matmul_nodrop_bf16"])
    results = {}
    for name, variant in variants.items():
        variant.autocast_dtype = None  # fp32: the interpreter's
        launched.clear()
        loss = variant.forward_backward()
        grads = [p.grad.clone() for p in variant.model.parameters() if p.grad is not None]
        results[name] = (loss.detach(), grads, list(launched))
        assert ta.POSITIONAL == positional and {k: dict(v) for k, v in ta.LAUNCH.items()} == table
    (loss, grads, plain), (loss_mm, grads_mm, matmul) = results.values()
    # layer 1 runs both streams, layer 2 only the query stream; the matmul row every kernel at its 32-row tiles
    assert [x for x in plain if x[0] in ("_attn_fwd", "_attn_bwd_dkr")] == [("_attn_fwd", 16)] * 3 + [
        ("_attn_bwd_dkr", None)
    ]
    assert sorted(matmul) == [("_attn_bwd_dkdv", 32)] * 3 + [("_attn_bwd_dq", 32)] * 3 + [("_attn_fwd", 32)] * 3
    torch.testing.assert_close(loss_mm, loss, atol=1e-5, rtol=1e-5)
    assert len(grads) == len(grads_mm) > 0
    for g, h in zip(grads_mm, grads):
        torch.testing.assert_close(g, h, atol=1e-5, rtol=1e-5)


def test_kernel_benchmark_sets_aside_a_setting_that_cannot_launch(tmp_path, monkeypatch):
    """A setting whose launch fails (here dkr at 32-row tiles, as a device past its shared memory would) is named in
    "refused" with its error and the run goes on; the module's kernels and launch settings are as before after it."""
    import json

    import triton

    from benchmarks import bench_triton_kernels as bench
    from xlnet_lite import triton_attention as ta

    kernels = {attr: getattr(ta, attr) for attr in bench.KERNELS}
    table = {k: dict(v) for k, v in ta.LAUNCH.items()}
    dkr = kernels["_attn_bwd_dkr"]

    class TooLarge:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                if kwargs["BLOCK"] == 32:
                    raise triton.runtime.errors.OutOfResources(300000, 232448, "shared memory")
                return dkr[grid](*args, **kwargs)

            return launch

    monkeypatch.setattr(ta, "_attn_bwd_dkr", TooLarge())
    out = tmp_path / "kernels.json"
    flags = ["--shape", "tiny", "--runs", "1", "--warmup", "0", "--settings", "32x32/1/1"]
    bench.main([*flags, "--variants", "noseg", "--out", str(out)])
    result = json.loads(out.read_text())
    assert [r["label"] for r in result["rows"]] == ["default", "noseg"]
    assert list(result["refused"]) == ["tile32x32_warps1_stages1"]
    assert result["refused"]["tile32x32_warps1_stages1"].startswith("OutOfResources: out of resource: shared memory")
    assert set(result["fastest"]) == set(ta.KERNELS)
    assert isinstance(ta._attn_bwd_dkr, TooLarge)  # what the benchmark found, put back
    assert all(getattr(ta, attr) is kernels[attr] for attr in bench.KERNELS if attr != "_attn_bwd_dkr")
    assert {k: dict(v) for k, v in ta.LAUNCH.items()} == table


def test_attention_benchmark_refuses_a_backend_that_cannot_run_and_finds_a_wrong_gradient():
    """A row whose kernel raises (an SDPA backend that takes no such bias) is set aside with its error, not timed;
    a row whose query gradient differs from the SDPA path's, or is NaN, reports the difference."""
    import math

    from benchmarks import bench_triton_attention as bench

    x = bench.make_inputs(bench.SHAPES["tiny"], torch.device("cpu"), torch.float32)

    class Refused(bench.HeldTo):
        def __call__(self, x, dropout, backward=True):
            raise RuntimeError("No available kernel. Aborting execution.\nmore lines")

    def broken(x, dropout, backward=True):
        raise RuntimeError("an error of a kernel, not a refusal")

    def scaled_grad(factor):
        def row(x, dropout, backward=True):
            for name in bench.GRADS:
                x[name].grad = None
            out = bench.sdpa_path(x, dropout)
            out.register_hook(lambda grad: grad * factor)  # the same output, its gradient times factor
            out.backward(x["grad"])
            return out

        return row

    def plain(x, dropout, backward=True):
        return bench.step(bench.sdpa_path, x, dropout, backward)

    def kr_grad_doubled(x, dropout, backward=True):
        out = bench.step(bench.sdpa_path, x, dropout, backward)
        x["kr"].grad *= 2
        return out

    rows, refused_rows, error, grad_error = bench.checked(
        {
            "sdpa_path": plain,
            "no_kernel": Refused(None),
            "double": scaled_grad(2.0),
            "nan": scaled_grad(float("nan")),
            "kr": kr_grad_doubled,
        },
        x,
    )
    assert set(rows) == {"sdpa_path", "double", "nan", "kr"}
    assert refused_rows == {"no_kernel": "No available kernel. Aborting execution."}
    assert error == {"sdpa_path": 0.0, "double": 0.0, "nan": 0.0, "kr": 0.0}
    assert grad_error["sdpa_path"] == 0.0 and grad_error["double"] > 1e-3 and math.isnan(grad_error["nan"])
    assert grad_error["kr"] > 1e-3  # a gradient other than the queries'
    with pytest.raises(RuntimeError, match="not a refusal"):
        bench.checked({"sdpa_path": plain, "broken": broken}, x)


def test_cuda_launch_settings_by_precision():
    """On CUDA, bf16 and fp16 launch each kernel at its own setting (4 warps a tile, 3 pipeline stages, dkr one), fp32
    8 warps at one stage; the interpreter takes 16-row tiles; the launch options follow the setting."""
    from xlnet_lite import triton_attention as ta

    cuda = torch.device("cuda")  # only read by launch_settings: no GPU needed
    for dtype in (torch.bfloat16, torch.float16):
        table = ta.launch_settings(cuda, dtype)
        assert table is ta.LAUNCH["cuda"] and set(table) == set(ta.KERNELS)
        assert table == {
            "forward": ta.Launch(32, 4, 3),
            "dk_dv": ta.Launch(32, 4, 3),
            "dq": ta.Launch(32, 4, 3),
            "dkr": ta.Launch(32, 4, 1),
        }
        assert ta._launch("dkr", cuda, dtype) == (32, 32, dict(num_warps=4, num_stages=1))
    assert ta.launch_settings(cuda, torch.float32) is ta.LAUNCH["cuda_fp32"]
    assert ta._launch("forward", cuda, torch.float32) == (32, 32, dict(num_warps=8, num_stages=1))
    assert all(s.tile == 16 for s in ta.launch_settings(torch.device("cpu"), torch.float32).values())
    assert ta._block_d(12) == 16 and ta._block_d(64) == 64 and ta._block_d(80) == 128


KERNEL_B = 2  # rows of the kernel-level steps (the interpreter runs every program of every row in turn)


def banded_step(
    seed, Q, M, kr_rows=1, dropout=0.0, qlen=None, extra_distances=0, N=2, D=12, ranks=False, dtype=torch.float32
):
    """A step of the banded form with every term on (segments, a mask blocking 40% of the keys, queries and keys not
    multiples of a tile) on seeded inputs: a function returning the output and the gradients of qw, k, v, qr, kr and
    gain (the dropout's seed the same each call). qlen: Q unless given; R = qlen + K + extra_distances; ranks: the mask
    as MaskRanks of random ranks instead (key j blocked for row i where its rank is at most the row's); dtype: the
    operands' (gain stays fp32)."""
    gen = torch.Generator().manual_seed(seed)
    qlen = Q if qlen is None else qlen
    K = Q + M
    R = qlen + K + extra_distances

    def rand(*shape, dtype=dtype):
        return torch.randn(*shape, generator=gen).to(dtype).requires_grad_()

    b = KERNEL_B
    inputs = dict(qw=rand(b, N, Q, D), k=rand(b, N, K, D), v=rand(b, N, K, D), qr=rand(b, N, Q, D))
    gain = rand(b, N, Q, dtype=torch.float32)
    inputs.update(kr=rand(kr_rows, N, D, R), gain=gain, seg_q=torch.randint(0, 2, (b, Q), generator=gen))
    inputs.update(seg_k=torch.randint(0, 2, (b, K), generator=gen), blocked=torch.rand(b, Q, K, generator=gen) < 0.4)
    grad = torch.randn(b, Q, N, D, generator=gen).to(dtype)
    leaves = [name for name, t in inputs.items() if t.requires_grad]
    if ranks:
        inputs["blocked"] = MaskRanks(torch.randint(0, K, (b, Q + K), generator=gen, dtype=torch.int32), NO_DIAGONAL)

    def run():
        for name in leaves:
            inputs[name].grad = None
        torch.manual_seed(0)
        out = relative_attention(**inputs, dropout_p=dropout, qlen=qlen)
        out.backward(grad)
        return out.detach(), [inputs[name].grad.clone() for name in leaves]

    return run


@pytest.mark.parametrize(
    "step, form, tall",
    [
        (dict(seed=1, Q=32, M=32, D=16), "band", False),
        (dict(seed=2, Q=32, M=32, D=16, ranks=True, dropout=0.1, kr_rows=KERNEL_B), "band", True),
        (dict(seed=3, Q=32, M=32, D=16, ranks=True), "matmul", False),
        (dict(seed=4, Q=32, M=32, D=16, qlen=20), "matmul", True),
        (dict(seed=6, Q=29, M=35, D=16, ranks=True, dropout=0.1), "band", True),
        (dict(seed=7, Q=29, M=35, D=16, ranks=True), "matmul", False),
    ],
)
def test_whole_tiles_check_no_bounds_and_give_the_same_results(monkeypatch, step, form, tall):
    """Keys a multiple of every tile and a head size of 16 (its own block): the forward, dk/dv and dq launch with EVEN
    (no bounds checked in their loops; the dkr kernel checks its own) and give exactly the output and every gradient
    of the same launches with the bounds checked; the mask as a block or as ranks, the positional term as the band or
    one matmul's product, square tiles or tall ones with dk/dv held keys by rows, dropout drawn alike; queries that
    fill whole tiles of rows (WHOLE_ROWS) or not (29: the rows past them read the last query's operands, nothing of
    them stored). Keys that are not whole tiles launch with EVEN off."""
    from xlnet_lite import triton_attention as ta

    launched, whole = [], []
    logged_launches(monkeypatch, launched, "EVEN")
    decide = ta._whole_rows
    monkeypatch.setattr(ta, "_whole_rows", lambda *args: whole.append(decide(*args)) or whole[-1])
    monkeypatch.setitem(ta.POSITIONAL, "interpreter", form)
    monkeypatch.setattr(ta, "WINDOW_ROWS", 16)  # two windows of the product (matmul)
    if tall:
        tall_tiles(monkeypatch)
    run = banded_step(**step)
    out, grads = run()
    kernels = ["_attn_fwd", "_attn_bwd_dkdv", "_attn_bwd_dq"] + ["_attn_bwd_dkr"] * (form == "band")
    assert launched == [(name, None if name == "_attn_bwd_dkr" else True) for name in kernels]
    assert whole == [step["Q"] == 32] * 3
    launched.clear()
    monkeypatch.setattr(ta, "_even", lambda *args: False)
    checked = run()
    assert launched == [(name, None if name == "_attn_bwd_dkr" else False) for name in kernels]
    assert torch.equal(out, checked[0]) and all(torch.equal(g, c) for g, c in zip(grads, checked[1]))
    assert all(g.abs().max() > 0 for g in grads)
    launched.clear()
    banded_step(**{**step, "Q": 31})()  # not whole tiles: the bounds checked
    assert {even for _, even in launched} <= {False, None}


def test_each_kernel_launches_at_its_own_tile(monkeypatch):
    """The forward at 32-row tiles, dk/dv and dq at 16, dkr at 32 (each kernel's own setting): the output and every
    gradient equal those of every kernel at 16-row tiles (only the order of sums differs), on queries and keys that
    are multiples of neither, with every term on."""
    from xlnet_lite import triton_attention as ta

    run = banded_step(seed=5, Q=37, M=6)
    reference = run()
    interpreter = ta.launch_settings(torch.device("cpu"), torch.float32)
    launched = []
    for kernel, tile in (("forward", 32), ("dk_dv", 16), ("dq", 16), ("dkr", 32)):
        monkeypatch.setitem(interpreter, kernel, ta.Launch(tile, 1, 1))
    for attr in ("_attn_fwd", "_attn_bwd_dkdv", "_attn_bwd_dq", "_attn_bwd_dkr"):
        kernel = getattr(ta, attr)

        class Logged:
            def __init__(self, kernel, attr):
                self.kernel, self.attr = kernel, attr

            def __getitem__(self, grid):
                launched.append((self.attr, grid[0]))
                return self.kernel[grid]

        monkeypatch.setattr(ta, attr, Logged(kernel, attr))
    out, grads = run()
    leaves = ("qw", "k", "v", "qr", "kr", "gain")
    # the grids follow each kernel's tile: 37 queries in 2 tiles of 32, 43 keys in 3 of 16, 80 distances in 3 of 32
    assert launched == [("_attn_fwd", 2), ("_attn_bwd_dkdv", 3), ("_attn_bwd_dq", 3), ("_attn_bwd_dkr", 3)]
    torch.testing.assert_close(out, reference[0], atol=1e-5, rtol=1e-5)
    for name, g, r in zip(leaves, grads, reference[1]):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-5, msg=name)


@pytest.mark.parametrize(
    "step, atomic, keys_major",
    [
        (dict(seed=5, Q=37, M=6), False, False),
        (dict(seed=5, Q=37, M=6), False, True),
        (dict(seed=11, Q=35, M=9, kr_rows=KERNEL_B, dropout=0.1, qlen=45, extra_distances=-12), True, True),
        (dict(seed=3, Q=35, M=9, qlen=10), True, False),
    ],
)
def test_tiles_of_twice_as_many_rows_as_keys_give_the_square_tiles_results(monkeypatch, step, atomic, keys_major):
    """The forward and dq at tiles of 32 rows by 16 keys (three chunks of distances a tile, two carried along the
    keys), dk/dv at the same or at 16 rows by 32 keys held keys by rows, dkr by its kernel or
    added up in dq: the output and every gradient equal those of 16-row square tiles (only the order of sums
    differs), over partial tiles of rows and keys, every term on, distances past R or below 0, positional keys shared
    or per row, dropout drawn alike."""
    from xlnet_lite import triton_attention as ta

    run = banded_step(**step)
    reference = run()
    interpreter = ta.launch_settings(torch.device("cpu"), torch.float32)
    for kernel in ("forward", "dk_dv", "dq"):
        monkeypatch.setitem(interpreter, kernel, ta.Launch(32, 1, 1, keys=16))
    if keys_major:
        monkeypatch.setitem(interpreter, "dk_dv", ta.Launch(16, 1, 1, keys=32))
    if atomic:
        monkeypatch.setitem(interpreter, "dkr", None)
    out, grads = run()
    torch.testing.assert_close(out, reference[0], atol=1e-5, rtol=1e-5)
    for name, g, r in zip(("qw", "k", "v", "qr", "kr", "gain"), grads, reference[1]):
        assert r.abs().max() > 0, name
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-5, msg=name)
    for kernel in ("dq", "dkr"):  # more keys than rows: dk/dv's alone
        setting = interpreter[kernel]
        monkeypatch.setitem(interpreter, kernel, ta.Launch(16, 1, 1, keys=32))
        with pytest.raises(ValueError, match=f"{kernel}'s Launch"):
            run()
        monkeypatch.setitem(interpreter, kernel, setting)


def test_the_operator_refuses_layouts_its_kernels_do_not_take():
    """The forward operator called directly (relative_attention arranges its inputs so) refuses, in one line and
    before any launch, qr laid out unlike qw, positional keys with neither 1 nor the batch's rows, and positional
    scores that are not contiguous (dq writes their gradient in their layout)."""
    from xlnet_lite import triton_attention as ta

    batch, N, Q, K, D = 2, 2, 5, 7, 16
    qw, k, v = torch.randn(batch, N, Q, D), torch.randn(batch, N, K, D), torch.randn(batch, N, K, D)

    def forward(qr, kr=None, pos=None):
        return ta._forward(qw, qr, k, v, kr, pos, None, None, None, None, None, None, None, 0.0, Q, ta.NO_DIAGONAL, 0)

    cases = [
        (dict(qr=qw.transpose(2, 3).contiguous().transpose(2, 3), kr=torch.randn(1, N, D, Q + K)), "qr laid out"),
        (dict(qr=qw, kr=torch.randn(3, N, D, Q + K)), "kr has 3 rows"),
        (dict(qr=qw, pos=torch.randn(batch, N, K, Q).transpose(2, 3)), "contiguous positional scores"),
    ]
    for inputs, message in cases:
        with pytest.raises(ValueError, match=message):
            forward(**inputs)


def test_the_operators_pass_torch_librarys_checks_with_the_forms_read_from_the_data():
    """torch.library.opcheck on the forward operator (its schema, the shapes it tells torch.compile, its autograd
    registration, no aliasing) with the mask as a block and KernelForms' ranks and CPU facts beside it, the segment
    ids counted, over the band and the caller's scores; and the operator reads the ranks where the facts say so:
    the content stream's own ranks give the block's output, ranks that block every key give rows of zeros."""
    from xlnet_lite import triton_attention as ta
    from xlnet_lite.modeling_xlnet_lite import kernel_forms

    gen = torch.Generator().manual_seed(13)
    batch, N, Q, M, D = 2, 1, 5, 3, 16
    K = Q + M

    def rand(*shape):
        return torch.randn(*shape, generator=gen).requires_grad_()

    perm_mask, target_mapping = xlnet_masks(batch, Q, 2, seed=13)
    blocked = F.pad(perm_mask.bool(), (M, 0))
    seg = torch.randint(0, 2, (batch, K), generator=gen, dtype=torch.int32)
    ranks_h, facts_h, _, _ = kernel_forms(blocked, target_mapping.argmax(-1), seg, M)
    content = content_stream_mask(blocked, qlen=Q, mlen=M)
    qw, k, v, gain = rand(batch, N, Q, D), rand(batch, N, K, D), rand(batch, N, K, D), rand(batch, N, Q)
    operands = (gain, seg[:, M:].contiguous(), seg, content, ranks_h, facts_h, None, 0.0, Q, ta.NO_DIAGONAL, 0)
    for positional in ((qw, rand(1, N, D, Q + K), None), (qw, None, rand(batch, N, Q, K))):
        torch.library.opcheck(ta._forward, (qw, positional[0], k, v, *positional[1:], *operands))
    _, facts_h, _, _ = kernel_forms(blocked, None, None, M)
    assert facts_h.tolist()[:3] == [1, ta.NO_DIAGONAL, 0] and facts_h[3] >= M  # own ranks, no ids; the memory free
    with torch.no_grad():
        kwargs = dict(qr=qw, kr=torch.randn(1, N, D, Q + K, generator=gen), qlen=Q)
        by_ranks = relative_attention(qw, k, v, blocked=content, forms=(ranks_h, facts_h), **kwargs)
        assert torch.equal(by_ranks, relative_attention(qw, k, v, blocked=content, **kwargs))
        none_seen = relative_attention(qw, k, v, blocked=content, forms=(0 * ranks_h, facts_h), **kwargs)
        assert by_ranks.abs().max() > 0 and not none_seen.any()


@pytest.mark.parametrize("banded, tall", [(True, False), (True, True), (False, False)])
def test_keys_every_row_sees_are_compared_with_nothing_with_the_same_results(monkeypatch, banded, tall):
    """KernelForms' free count (leading keys every row sees: a memory) skips the mask's comparisons in tiles of them:
    the output and every gradient bit for bit those of comparing everywhere, at a count ending mid-tile and at one
    covering whole tiles, the mask as ranks and as the block, square tiles or tall ones (dk/dv held keys by rows), the
    band or the caller's scores; a count past the keys every row sees (wrong) changes the output: the tiles skipped."""
    from xlnet_lite import triton_attention as ta

    if tall:
        tall_tiles(monkeypatch)
    gen = torch.Generator().manual_seed(14)
    N, Q, M, D = 1, 10, 35, 16
    K = Q + M

    def rand(*shape):
        return torch.randn(*shape, generator=gen).requires_grad_()

    operands = dict(qw=rand(B, N, Q, D), k=rand(B, N, K, D), v=rand(B, N, K, D), gain=rand(B, N, Q))
    if banded:
        operands.update(qr=rand(B, N, Q, D), kr=rand(1, N, D, Q + K))
    else:
        operands.update(pos=rand(B, N, Q, K))
    seg_q, seg_k = torch.randint(0, 2, (B, Q), generator=gen), torch.randint(0, 2, (B, K), generator=gen)
    perm_mask, _ = xlnet_masks(B, Q, 4, seed=14)
    blocked = F.pad(perm_mask.bool(), (M, 0))  # the memory seen by every row
    ranks = mask_ranks(blocked).ranks
    grad = torch.randn(B, Q, N, D, generator=gen)

    def run(forms=None, backward=True):
        out = relative_attention(**operands, seg_q=seg_q, seg_k=seg_k, blocked=blocked, forms=forms, qlen=Q)
        return (out, *torch.autograd.grad((out * grad).sum(), list(operands.values()))) if backward else (out,)

    reference = run()
    for ranked, free in ((1, M - 5), (1, M), (0, 32)):
        facts = torch.tensor([ranked, ta.NO_DIAGONAL, 0, free])
        for got, want in zip(run((ranks, facts)), reference):
            assert torch.equal(got, want), (ranked, free)
    with torch.no_grad():
        (wrong,) = run((ranks, torch.tensor([1, ta.NO_DIAGONAL, 0, 2 * K])), backward=False)
    assert not torch.equal(wrong, reference[0])


@pytest.mark.parametrize(
    "kr_rows, qlen, extra_distances, window_rows",
    [(1, None, 0, 64), (1, None, 0, 16), (B, 45, -12, 16), (1, 10, 0, 16), (B, 10, 7, 32)],
)
def test_the_positional_products_windows_hold_the_band_at_aligned_rows(
    monkeypatch, kr_rows, qlen, extra_distances, window_rows
):
    """_positional_windows (POSITIONAL "matmul"): read as the kernels read it (score (b, n, i, j) at b sp_b + n sp_n +
    offset + i sp_m + (i // rows) sp_blk + j), the windowed product of qr and kr holds qr_i times kr's distance qlen - i
    + j, 0 where that is outside [0, R) (as the band reads it), over one window or several, kr shared or per row; each
    window's rows hold K + rows + 1 values (padded to 16 + 1), not qlen + K; in bf16 every row starts 16 bytes
    aligned, so the kernels load rows by vectors."""
    from xlnet_lite import triton_attention as ta

    monkeypatch.setattr(ta, "WINDOW_ROWS", window_rows)
    gen = torch.Generator().manual_seed(1)
    Q, K, N, D = 35, 44, 2, 8
    qlen = Q if qlen is None else qlen
    R = qlen + K + extra_distances
    qr, kr = torch.randn(B, N, Q, D, generator=gen), torch.randn(kr_rows, N, D, R, generator=gen)

    def starts(windows, batch=B, heads=N, rows=Q):
        """Where each (b, n, i) row of scores starts in windows.full."""
        sp_b, sp_n, sp_m, sp_j, sp_blk = windows.strides
        i = torch.arange(rows)
        row = windows.offset + i * sp_m + torch.div(i, windows.rows, rounding_mode="floor") * sp_blk
        assert sp_j == 1
        return torch.arange(batch)[:, None, None] * sp_b + torch.arange(heads)[None, :, None] * sp_n + row

    windows = ta._positional_windows(qr, kr, qlen, K)
    read = windows.full.reshape(-1)[starts(windows)[..., None] + torch.arange(K)]  # (B, N, Q, K)
    r = qlen - torch.arange(Q)[:, None] + torch.arange(K)  # (Q, K) distances
    inside = (r >= 0) & (r < R)
    expected = torch.einsum("bnqd,bndqk->bnqk", qr, kr.expand(B, -1, -1, -1)[..., r.clamp(0, R - 1)]) * inside
    torch.testing.assert_close(read, expected, atol=1e-5, rtol=1e-5)
    assert inside.all() == (qlen == Q and extra_distances >= 0)  # else distances outside [0, R) are read
    assert windows.full.shape[-1] == K + window_rows + 1 + (-(K + window_rows) % 16)
    windows16 = ta._positional_windows(qr.bfloat16(), kr.bfloat16(), qlen, K)
    assert (starts(windows16) % 8 == 0).all()


WIDE_TILES = {  # the dense form's tiles the band does not take, at the interpreter's scale: (rows, keys) a kernel
    "tall_4x": dict(forward=(64, 16), dq=(64, 16), dk_dv=(16, 64)),  # bench_triton_kernels' 32x128/4/3/matmul
    "rows_4x": dict(forward=(64, 16), dq=(64, 16), dk_dv=(64, 16)),  # 128x32/4/3/matmul
}


@pytest.mark.parametrize(
    "step, tiles",
    [
        (dict(seed=5, Q=37, M=6, window_rows=64), None),
        (dict(seed=11, Q=35, M=9, kr_rows=KERNEL_B, dropout=0.1, qlen=45, extra_distances=-12), None),
        (dict(seed=11, Q=35, M=9, kr_rows=KERNEL_B, dropout=0.1, qlen=45, extra_distances=-12), "tall"),
        (dict(seed=3, Q=35, M=9, qlen=10), None),
        (dict(seed=5, Q=37, M=6, kr_rows=KERNEL_B, dropout=0.1), "tall_4x"),
        (dict(seed=3, Q=35, M=9, qlen=10), "rows_4x"),
    ],
)
def test_positional_scores_by_one_matmul_give_the_bands_results(monkeypatch, step, tiles):
    """POSITIONAL "matmul": the content stream's positional term as one product of qr and kr, window by window of
    query rows, that the dense form's kernels read shifted (no band, no dkr kernel; dq writes the scores' gradient
    into the product's layout, two matmuls take it back to qr and kr, the windows' parts of kr summed) gives the band's
    output and every gradient, over one window or several, partial tiles, every term on,
    distances past R or below 0, positional keys shared or per row, dropout drawn alike; also with the forward and dq
    at 32 rows by 16 keys and dk/dv at 16 rows by 32 held keys by rows (bench_triton_kernels' 32x64/4/3/matmul,
    scaled), and at tiles of four times as many rows as keys or keys as rows, which only the dense form takes (the
    band refuses them in one line); with new tensors NaN until written (the backward clears only what dq leaves of
    the product's gradient). A form the kernels do not take is refused by name."""
    from xlnet_lite import triton_attention as ta

    step = dict(step)
    monkeypatch.setattr(ta, "WINDOW_ROWS", step.pop("window_rows", 16))  # one window of the product, or several
    run = banded_step(**step)
    reference = run()
    if tiles == "tall":
        tall_tiles(monkeypatch)
    elif tiles:
        interpreter = ta.launch_settings(torch.device("cpu"), torch.float32)
        for kernel, (rows, keys) in WIDE_TILES[tiles].items():
            monkeypatch.setitem(interpreter, kernel, ta.Launch(rows, 1, 1, keys=keys))
        with pytest.raises(ValueError, match="forward's Launch.* is not a tile the kernel takes"):
            run()  # the band
    launched = []
    logged_launches(monkeypatch, launched, "BAND")
    monkeypatch.setitem(ta.POSITIONAL, "interpreter", "matmul")
    empty_like = torch.empty_like  # what the backward leaves uncleared of the product's gradient: NaN, found
    monkeypatch.setattr(torch, "empty_like", lambda *args, **kwargs: empty_like(*args, **kwargs).fill_(float("nan")))
    out, grads = run()
    monkeypatch.setattr(torch, "empty_like", empty_like)
    assert launched == [("_attn_fwd", False), ("_attn_bwd_dkdv", False), ("_attn_bwd_dq", False)]
    torch.testing.assert_close(out, reference[0], atol=1e-5, rtol=1e-5)
    for name, g, r in zip(("qw", "k", "v", "qr", "kr", "gain"), grads, reference[1]):
        assert r.abs().max() > 0, name
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-5, msg=name)
    monkeypatch.setitem(ta.POSITIONAL, "interpreter", "dense")
    with pytest.raises(ValueError, match="POSITIONAL: 'dense' is not a form"):
        run()


@triton.jit
def added_in_fp32(s, pos, eye, BY_PRODUCT: tl.constexpr):
    """_add_positional's other way, for the test: the positional scores added to the scores in fp32."""
    return s + pos.to(tl.float32)


@pytest.mark.parametrize("tall", [False, True])
def test_16_bit_positional_scores_enter_the_scores_by_a_product_with_the_identity_exactly(monkeypatch, tall):
    """The operator's own positional product in 16 bits (fp16 here: the interpreter computes bf16 wrongly) reaches
    each tile's scores as tl.dot(pos, identity, scores) (_add_positional: on a GPU the tile goes to the tensor cores
    through shared memory as the keys do): the output and every gradient bit for bit those of the same launches adding
    it in fp32, square tiles or tall ones with dk/dv held keys by rows. The caller's scores (the query stream's form)
    are added in fp32, so an infinity in them stays where it is: -inf at a key as blocking it, at a blocked key
    nothing (a product with the identity would spread NaN through the row)."""
    from xlnet_lite import triton_attention as ta

    monkeypatch.setitem(ta.POSITIONAL, "interpreter", "matmul")
    monkeypatch.setattr(ta, "WINDOW_ROWS", 16)
    if tall:
        tall_tiles(monkeypatch)
    run = banded_step(seed=8, Q=32, M=16, ranks=True, dtype=torch.float16)
    out, grads = run()
    monkeypatch.setattr(ta, "_add_positional", added_in_fp32)
    added, added_grads = run()
    assert torch.equal(out, added)
    for got, want in zip(grads, added_grads):
        assert got.abs().max() > 0 and torch.equal(got, want)
    monkeypatch.undo()
    gen = torch.Generator().manual_seed(9)
    qw, k, v, pos = (
        torch.randn(*shape, generator=gen).half()
        for shape in ((B, 2, 21, 16), (B, 2, 40, 16), (B, 2, 40, 16), (B, 2, 21, 40))
    )
    blocked = torch.zeros(B, 21, 40, dtype=torch.bool)
    blocked[:, 7, 9] = True
    pos[:, :, 7, 9] = float("inf")  # at a blocked key
    masked = relative_attention(qw, k, v, pos=pos, blocked=blocked, qlen=21)
    pos[:, :, 3, 5] = float("-inf")  # at a key it sees
    out = relative_attention(qw, k, v, pos=pos, blocked=blocked, qlen=21)
    blocked[:, 3, 5] = True
    assert out.isfinite().all() and torch.equal(out, relative_attention(qw, k, v, pos=pos, blocked=blocked, qlen=21))
    assert torch.equal(out[:, 7], masked[:, 7]) and not torch.equal(out[:, 3], masked[:, 3])


@pytest.mark.parametrize("form, tall", [("band", False), ("matmul", False), ("matmul", True), ("dense", False)])
def test_the_segment_term_by_a_one_hot_product_gives_the_comparisons_results(monkeypatch, form, tall):
    """seg_classes (the ids in [0, seg_classes), at most SEG_DIMS) with 16-bit operands (fp16: the interpreter
    computes bf16 wrongly): the forward, dk/dv and dq add the segment term by one more product of one-hot dims and dq
    takes dgain from the score gradient times the keys' one-hot. The output and the gradients of qw, qr, k, v and
    the positional term bit for bit those of comparing the ids with the gain rounded to fp16 alike, dgain to the
    fp16 rounding of the score gradient; the content stream banded (its dkr kernel by the product too) or by one matmul,
    square tiles or tall ones, and the caller's scores (the query stream's form), at the interpreter's tiles (16 rows;
    SEG_PRODUCT_ROWS lowered to them). More classes than SEG_DIMS, fp32, or tiles of fewer rows than
    SEG_PRODUCT_ROWS compare."""
    from xlnet_lite import triton_attention as ta

    monkeypatch.setattr(ta, "SEG_PRODUCT_ROWS", 16)
    monkeypatch.setitem(ta.POSITIONAL, "interpreter", "matmul" if form == "matmul" else "band")
    monkeypatch.setattr(ta, "WINDOW_ROWS", 16)
    if tall:
        tall_tiles(monkeypatch)
    gen = torch.Generator().manual_seed(12)
    N, Q, M, D = 2, 32, 16, 16
    K = Q + M

    def rand(*shape):
        return torch.randn(*shape, generator=gen)

    operands = dict(qw=rand(KERNEL_B, N, Q, D), k=rand(KERNEL_B, N, K, D), v=rand(KERNEL_B, N, K, D))
    if form == "dense":
        operands.update(pos=rand(KERNEL_B, N, Q, K))
    else:
        operands.update(qr=rand(KERNEL_B, N, Q, D), kr=rand(1, N, D, Q + K))
    gain = rand(KERNEL_B, N, Q)
    seg_q, seg_k = torch.randint(0, 3, (KERNEL_B, Q), generator=gen), torch.randint(0, 3, (KERNEL_B, K), generator=gen)
    blocked = rand(KERNEL_B, Q, K) < 0.4
    grad = rand(KERNEL_B, Q, N, D)
    launched = []
    logged_launches(monkeypatch, launched, "SEG_DIMS")

    def run(seg_classes, gain, dtype=torch.float16):
        leaves = {name: t.to(dtype).requires_grad_() for name, t in operands.items()}
        leaves["gain"] = gain.clone().requires_grad_()
        out = relative_attention(**leaves, seg_q=seg_q, seg_k=seg_k, seg_classes=seg_classes, blocked=blocked, qlen=Q)
        return out, torch.autograd.grad((out.float() * grad).sum(), list(leaves.values()))

    out, grads = run(3, gain)
    assert {flag for name, flag in launched if name != "_attn_bwd_dkr"} == {ta.SEG_DIMS}
    launched.clear()
    compared_out, compared = run(None, gain.half().float())
    assert {flag for name, flag in launched if name != "_attn_bwd_dkr"} == {0}
    assert torch.equal(out, compared_out)
    for got, want in zip(grads[:-1], compared[:-1]):
        assert got.abs().max() > 0 and torch.equal(got, want)
    torch.testing.assert_close(grads[-1], compared[-1], atol=2e-3, rtol=1e-2)
    assert not torch.equal(grads[-1], compared[-1])  # the score gradient rounded to fp16 for the product
    for seg_classes, dtype, rows in (
        (ta.SEG_DIMS + 1, torch.float16, 16),
        (3, torch.float32, 16),
        (3, torch.float16, 32),
    ):
        monkeypatch.setattr(ta, "SEG_PRODUCT_ROWS", rows)
        launched.clear()
        run(seg_classes, gain, dtype)
        assert {flag for name, flag in launched if name != "_attn_bwd_dkr"} == {0}


def test_kernel_settings_by_the_positional_terms_form():
    """bench_triton_kernels' settings: with /matmul any powers of two of rows and keys (the dense form's kernels take
    them), more keys than rows read as for KEYS = 2 ROWS (dk/dv held keys by rows, the forward and dq at KEYS rows by
    ROWS keys), else every kernel at ROWS by KEYS; the band's settings keep their tiles (KEYS, twice or half)."""
    from benchmarks.bench_triton_kernels import parse_setting
    from xlnet_lite.triton_attention import Launch

    tall, wide = Launch(128, 4, 3, keys=32), Launch(32, 4, 3, keys=128)
    assert parse_setting("32x128/4/3/matmul") == dict(forward=tall, dk_dv=wide, dq=tall, dkr=Launch(32, 4, 3))
    assert parse_setting("128x32/4/3/matmul") == dict(forward=tall, dk_dv=tall, dq=tall, dkr=Launch(32, 4, 3))
    assert parse_setting("64x32/8/2") == {
        **dict.fromkeys(("forward", "dk_dv", "dq"), Launch(64, 8, 2, keys=32)),
        "dkr": Launch(32, 8, 2),
    }
    for bad, message in [
        ("128x32/4/3", "any powers of two with /matmul"),
        ("32x128/4/3/atomic", "any powers of two with /matmul"),
        ("48x16/4/3/matmul", "powers of two of at least 16"),
        ("64x8/4/3/matmul", "powers of two of at least 16"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_setting(bad)


@pytest.mark.parametrize(
    "kr_rows, dropout, qlen, extra_distances",
    [(1, 0.0, None, 0), (KERNEL_B, 0.1, None, 0), (1, 0.0, 45, -12), (KERNEL_B, 0.0, 10, 0)],
)
def test_dkr_added_up_in_dq_equals_the_dkr_kernel(monkeypatch, kr_rows, dropout, qlen, extra_distances):
    """dkr's launch setting None: no dkr kernel launched, dq adds dkr up by atomic adds; every gradient as with the dkr
    kernel (the same dropout mask drawn), with positional keys shared by the batch and one per row, over several
    tiles of keys and distances, every term on; also where distances run past R (qlen 45 > Q, R short of qlen + K) or
    below 0 (qlen 10 < Q). While torch.use_deterministic_algorithms is on the dkr kernel runs instead."""
    from xlnet_lite import triton_attention as ta

    run = banded_step(seed=11, Q=35, M=9, kr_rows=kr_rows, dropout=dropout, qlen=qlen, extra_distances=extra_distances)
    reference = run()[1]
    launched = []
    dkr_kernel = ta._attn_bwd_dkr

    class Counted:
        def __getitem__(self, grid):
            launched.append(grid)
            return dkr_kernel[grid]

    monkeypatch.setitem(ta.launch_settings(torch.device("cpu"), torch.float32), "dkr", None)
    monkeypatch.setattr(ta, "_attn_bwd_dkr", Counted())
    for i, (g, r) in enumerate(zip(run()[1], reference)):
        assert g.abs().max() > 0, i
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-5, msg=str(i))
    assert not launched
    deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        grads = run()[1]
    finally:
        torch.use_deterministic_algorithms(deterministic)
    assert len(launched) == 1 and all(torch.equal(g, r) for g, r in zip(grads, reference))


@pytest.mark.slow
def compiled_for_sm90(tmp_path, *arguments):
    """The rows of benchmarks/triton_resources.py run in bf16 with these arguments: a training step's launches compiled
    for sm_90 on this machine (no GPU needed; Triton compiling, not interpreting)."""
    import json
    import os
    import subprocess
    import sys

    out = tmp_path / "resources.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run(
        [sys.executable, "-m", "benchmarks.triton_resources", "--dtypes", "bf16", *arguments, "--out", str(out)],
        check=True,
        env=env,
        capture_output=True,
        timeout=600,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )
    return json.loads(out.read_text())["rows"]


def test_the_cuda_defaults_compile_for_an_h100_without_spills(tmp_path):
    """benchmarks/triton_resources.py compiles for sm_90 here (no GPU needed) the launches of a training step at the
    CUDA defaults in bf16, both streams, as pretraining makes them (the masks as ranks, dropout 0): each fits an H100's
    shared memory and spills at most a few hundred bytes a thread to local memory (64-row tiles spill 1,200-3,400),
    and the machine code's innermost loop holds the tensor-core MMAs, laid out over the launch's warps; so a change
    that raises register pressure far past the limit fails here before it reaches a GPU."""
    import re

    from xlnet_lite import triton_attention

    rows = compiled_for_sm90(tmp_path, "--defaults")
    kernels = {("content", k) for k in ("forward", "dk_dv", "dq", "dkr")} | {
        ("query", k) for k in ("forward", "dk_dv", "dq")
    }
    assert {(r["stream"], r["kernel"]) for r in rows} == kernels and len(rows) == 7
    for row in rows:
        assert row["fits"] and row["ptxas_returncode"] == 0 and row["spill_stores"] <= 400, row
        assert row["loop"]["mma"] > 0 and row["loop"]["instructions"] > row["loop"]["mma"], row
        keys = None if row["keys"] == row["tile"] else row["keys"]
        launched = triton_attention.Launch(row["tile"], row["warps"], row["stages"], keys)
        assert launched == triton_attention.LAUNCH["cuda"][row["kernel"]], row
        # each tensor-core layout shares its tiles among the kernel's warps ("v2 1x4": four side by side)
        layouts = [re.fullmatch(r"v([23]) (\d+)x(\d+)", layout) for layout in row["mma_layouts"]]
        assert layouts and all(m and int(m[2]) * int(m[3]) == row["warps"] for m in layouts), row


def test_warpgroup_mmas_are_issued_asynchronously_at_64_row_tiles(tmp_path):
    """At 64 rows a tile (the positional term by one matmul, 64 x 64, 4 warps) Triton lays each kernel's products out
    as Hopper's warpgroup MMAs; compiled for sm_90 here (benchmarks/triton_resources.py), ptxas issues them
    asynchronously in the forward, dk/dv and dq, both streams, with nothing spilled: no kernel's loop has an exit
    path that sets an MMA's accumulators while it may run (which would have ptxas wait for each MMA before the next:
    its info C7515, which triton_resources reports)."""
    rows = compiled_for_sm90(tmp_path, "--settings", "64x64/4/3/matmul")
    assert sorted((r["stream"], r["kernel"]) for r in rows) == sorted(
        (stream, kernel) for stream in ("content", "query") for kernel in ("forward", "dk_dv", "dq")
    )
    for row in rows:
        assert row["variant"] == "matmul" and (row["tile"], row["keys"], row["warps"]) == (64, 64, 4), row
        assert row["mma_layouts"] == ["v3 4x1"] and row["loop"]["mma"] > 0, row
        assert row["wgmma_serialized"] is None and row["ptxas_returncode"] == 0, row
        assert row["spill_stores"] == 0 and row["fits"], row


@pytest.mark.slow
def test_the_gpu_command_runs_the_kernels_tests_and_rows_that_exist(tmp_path):
    """benchmarks/run_triton_on_gpu.sh, run with a `python3` that only records its arguments: its test selection
    collects the kernels' CUDA tests and SDPA's, and every benchmark row it names exists, and the profile's (with
    PROFILE_S)."""
    import subprocess

    from recipe_helpers import REPO, run_recording_python3

    from benchmarks import bench_gpu

    done, recorded = run_recording_python3("benchmarks/run_triton_on_gpu.sh", tmp_path, OUT=str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    calls = {}
    for args in recorded:
        if args[0] == "-m":
            calls.setdefault(args[1], []).append(args[2:])
    (pytest_args,), gpu_calls = calls["pytest"], calls["benchmarks.bench_gpu"]
    assert "benchmarks.profile_gpu" not in calls  # only with PROFILE_S set
    selection = pytest_args[pytest_args.index("-k") + 1]
    collected = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-m",
            "gpu",
            "tests/model/test_gpu.py",
            "-k",
            selection,
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    names = [line for line in collected.stdout.splitlines() if "::" in line]
    triton = [n for n in names if "triton" in n]  # and SDPA's, the CUDA default path
    assert len(triton) == 33 and len(names) > 33 and all("sdpa" in n for n in set(names) - set(triton)), names
    assert len(gpu_calls) == 2
    for gpu_args in gpu_calls:
        variants = gpu_args[gpu_args.index("--variants") + 1 : gpu_args.index("--out")]
        assert variants and set(variants) <= set(bench_gpu.NAMES) and any("triton" in v for v in variants)
    assert [a[a.index("--dropout") + 1] for a in calls["benchmarks.bench_triton_attention"]] == ["0"]
    (kernel_args,) = calls["benchmarks.bench_triton_kernels"]  # at its base shape and default settings
    assert kernel_args == ["--out", str(tmp_path / "out" / "triton_kernels_base.json")]
    (tmp_path / "profiled").mkdir()
    done, recorded = run_recording_python3(
        "benchmarks/run_triton_on_gpu.sh", tmp_path / "profiled", OUT=str(tmp_path / "out2"), PROFILE_S="60"
    )
    assert done.returncode == 0, done.stderr
    (profile_args,) = [args[2:] for args in recorded if args[:2] == ["-m", "benchmarks.profile_gpu"]]
    assert profile_args[profile_args.index("--variant") + 1] in bench_gpu.NAMES
