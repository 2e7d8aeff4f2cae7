"""With identical weights, XLNet-Lite computes what transformers' XLNet computes (fp32, eval), feature by feature,
on both attention implementations."""

import pytest
import torch
from model_helpers import BENCH_TINY, run_both, twins

import xlnet_lite
from xlnet_lite.collator import random_factorization_masks as xlnet_masks

B, T, P = 4, 12, 4
ATOL = 1e-4


def close(a, b):
    torch.testing.assert_close(a, b, atol=ATOL, rtol=1e-4)


def ids(seed=0, batch=B, length=T):
    return torch.randint(0, 97, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_plain_forward(forward_impl):
    hf, lite = twins("XLNetModel")
    a, b = run_both(hf, lite, forward_impl, input_ids=ids())
    close(a.last_hidden_state, b.last_hidden_state)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_perm_mask_and_target_mapping_two_stream(forward_impl, seed):
    hf, lite = twins(seed=seed)
    perm_mask, target_mapping = xlnet_masks(B, T, P, seed=seed)
    labels = ids(seed + 5, length=P)
    a, b = run_both(
        hf, lite, forward_impl, input_ids=ids(seed), perm_mask=perm_mask, target_mapping=target_mapping, labels=labels
    )
    assert b.logits.shape == (B, P, 97)
    close(a.logits, b.logits)
    close(a.loss, b.loss)


def test_perm_mask_without_target_mapping(forward_impl):
    hf, lite = twins()
    perm_mask, _ = xlnet_masks(B, T, P)
    a, b = run_both(hf, lite, forward_impl, input_ids=ids(), perm_mask=perm_mask)
    close(a.logits, b.logits)


def test_loss_ignores_padded_prediction_rows(forward_impl):
    hf, lite = twins()
    perm_mask, target_mapping = xlnet_masks(B, T, P)
    target_mapping[1, -1] = 0  # an all-zero (padding) prediction row
    labels = ids(3, length=P)
    labels[1, -1] = -100
    a, b = run_both(
        hf, lite, forward_impl, input_ids=ids(), perm_mask=perm_mask, target_mapping=target_mapping, labels=labels
    )
    close(a.logits, b.logits)
    close(a.loss, b.loss)


def test_token_type_ids_two_segments_and_cls(forward_impl):
    hf, lite = twins()
    tt = torch.zeros(B, T, dtype=torch.long)
    tt[:, 6:] = 1
    tt[:, -1] = 2
    perm_mask, target_mapping = xlnet_masks(B, T, P, seed=4)
    a, b = run_both(
        hf, lite, forward_impl, input_ids=ids(), token_type_ids=tt, perm_mask=perm_mask, target_mapping=target_mapping
    )
    close(a.logits, b.logits)
    a, b = run_both(hf, lite, forward_impl, input_ids=ids(), token_type_ids=tt)
    close(a.logits, b.logits)


def test_left_padding_attention_mask(forward_impl):
    hf, lite = twins("XLNetForSequenceClassification", num_labels=3)
    attention_mask = torch.ones(B, T, dtype=torch.long)
    attention_mask[0, :5] = 0
    attention_mask[2, :2] = 0
    a, b = run_both(hf, lite, forward_impl, input_ids=ids(), attention_mask=attention_mask)
    close(a.logits, b.logits)
    input_mask = 1 - attention_mask
    a, b = run_both(hf, lite, forward_impl, input_ids=ids(), input_mask=input_mask)
    close(a.logits, b.logits)


def test_padding_with_perm_mask(forward_impl):
    hf, lite = twins()
    perm_mask, target_mapping = xlnet_masks(B, T, P, seed=7)
    attention_mask = torch.ones(B, T)
    attention_mask[1, :1] = 0
    target_mapping[1] = 0  # predict nothing where padding could leave a query with no key
    a, b = run_both(
        hf,
        lite,
        forward_impl,
        input_ids=ids(),
        attention_mask=attention_mask,
        perm_mask=perm_mask,
        target_mapping=target_mapping,
    )
    close(a.logits, b.logits)


@pytest.mark.parametrize("reuse_len", [None, 6])
def test_mems_across_two_segments(forward_impl, reuse_len):
    hf, lite = twins(mem_len=8, reuse_len=reuse_len)
    perm_mask, target_mapping = xlnet_masks(B, T, P, seed=1)
    a1, b1 = run_both(hf, lite, forward_impl, input_ids=ids(1), use_mems=True)
    for m_hf, m_lite in zip(a1.mems, b1.mems):
        close(m_hf.transpose(0, 1), m_lite)  # transformers' mems are time-major, ours batch-first
    assert b1.mems[0].shape == (B, reuse_len or 8, 32)
    with torch.no_grad():
        a2 = hf(ids(2), mems=a1.mems, perm_mask=perm_mask, target_mapping=target_mapping, use_mems=True)
        b2 = lite(ids(2), mems=b1.mems, perm_mask=perm_mask, target_mapping=target_mapping, use_mems=True)
    close(a2.logits, b2.logits)
    for m_hf, m_lite in zip(a2.mems, b2.mems):
        close(m_hf.transpose(0, 1), m_lite)
    with torch.no_grad():
        no_mem = lite(ids(2), perm_mask=perm_mask, target_mapping=target_mapping).logits
    assert (no_mem - b2.logits).abs().max() > 1e-2  # the memory matters


def test_mems_with_token_types(forward_impl):
    hf, lite = twins(mem_len=5)
    tt = torch.zeros(B, T, dtype=torch.long)
    tt[:, 7:] = 1
    a1, b1 = run_both(hf, lite, forward_impl, input_ids=ids(1), use_mems=True)
    with torch.no_grad():
        a2 = hf(ids(2), mems=a1.mems, token_type_ids=tt)
        b2 = lite(ids(2), mems=b1.mems, token_type_ids=tt)
    close(a2.logits, b2.logits)


def test_bi_data(forward_impl):
    hf, lite = twins(bi_data=True)
    perm_mask, target_mapping = xlnet_masks(B, T, P, seed=2)
    a, b = run_both(hf, lite, forward_impl, input_ids=ids(), perm_mask=perm_mask, target_mapping=target_mapping)
    close(a.logits, b.logits)


def test_clamp_len(forward_impl):
    hf, lite = twins(clamp_len=3)
    perm_mask, target_mapping = xlnet_masks(B, T, P, seed=3)
    a, b = run_both(hf, lite, forward_impl, input_ids=ids(), perm_mask=perm_mask, target_mapping=target_mapping)
    close(a.logits, b.logits)


@pytest.mark.parametrize("same_length", [False, True])
def test_attn_type_uni(forward_impl, same_length):
    hf, lite = twins(attn_type="uni", same_length=same_length, mem_len=6)
    a1, b1 = run_both(hf, lite, forward_impl, input_ids=ids(1), use_mems=True)
    close(a1.logits, b1.logits)
    with torch.no_grad():
        a2 = hf(ids(2), mems=a1.mems)
        b2 = lite(ids(2), mems=b1.mems)
    close(a2.logits, b2.logits)


@pytest.mark.parametrize("act", ["relu", "gelu"])
def test_activations(forward_impl, act):
    hf, lite = twins(ff_activation=act)
    a, b = run_both(hf, lite, forward_impl, input_ids=ids())
    close(a.logits, b.logits)


@pytest.mark.parametrize("problem", ["single_label_classification", "regression", "multi_label_classification"])
def test_classification_logits_and_loss(forward_impl, problem):
    num_labels = 1 if problem == "regression" else 3
    hf, lite = twins("XLNetForSequenceClassification", num_labels=num_labels, problem_type=problem)
    labels = {
        "single_label_classification": torch.tensor([0, 2, 1, 1]),
        "regression": torch.tensor([0.5, -1.0, 2.0, 0.0]),
        "multi_label_classification": torch.tensor([[1.0, 0, 1], [0, 0, 1], [1, 1, 1], [0, 0, 0]]),
    }[problem]
    tt = torch.zeros(B, T, dtype=torch.long)
    tt[:, 5:] = 1
    tt[:, -1] = 2
    a, b = run_both(hf, lite, forward_impl, input_ids=ids(), token_type_ids=tt, labels=labels)
    close(a.logits, b.logits)
    close(a.loss, b.loss)


def test_flex_attention_masks_inside_the_kernel_and_refuses_attention_dropout(monkeypatch):
    """The flex kernel never calls the explicit kernel's masking nor SDPA (the masks and the segment term are read
    inside the kernel); with dropout in training, or compiled on the CPU, it says why it cannot run instead of
    dropping nothing or running the CPU's compiled flex kernels."""
    import xlnet_lite.modeling_xlnet_lite as modeling

    hf, lite = twins(mem_len=4)
    perm_mask, target_mapping = xlnet_masks(B, T, 3)

    def refuse(*args, **kwargs):
        raise AssertionError("the explicit or SDPA kernel called")

    monkeypatch.setattr(modeling, "fill_blocked", refuse)
    monkeypatch.setattr(modeling.F, "scaled_dot_product_attention", refuse)
    a, b = run_both(hf, lite, "flex_attention", input_ids=ids(), perm_mask=perm_mask, target_mapping=target_mapping)
    close(a.logits, b.logits)
    _, lite = twins(dropout=0.1)
    lite.config._attn_implementation = "flex_attention"
    with pytest.raises(ValueError, match="no attention dropout.*dropout 0.*'sdpa'"):
        lite.train()(input_ids=ids())
    compiled = torch.compile(lite.eval(), fullgraph=True, dynamic=False)  # the CPU's compiled flex kernels: refused
    with pytest.raises(Exception, match="under torch.compile needs CUDA"), torch.no_grad():
        compiled(input_ids=ids())


def test_hidden_states_and_attentions_match():
    hf, lite = twins()
    perm_mask, target_mapping = xlnet_masks(B, T, P, seed=5)
    with torch.no_grad():
        a = hf(
            ids(), perm_mask=perm_mask, target_mapping=target_mapping, output_hidden_states=True, output_attentions=True
        )
        b = lite(
            ids(), perm_mask=perm_mask, target_mapping=target_mapping, output_hidden_states=True, output_attentions=True
        )
    assert len(a.hidden_states) == len(b.hidden_states)
    for x, y in zip(a.hidden_states, b.hidden_states):
        close(x, y)
    rows = target_mapping.argmax(-1)  # transformers' query-stream attentions cover all T rows
    for (ah, ag), (bh, bg) in zip(a.attentions, b.attentions):
        close(ah, bh)
        close(ag.gather(2, rows[:, None, :, None].expand(-1, ag.shape[1], -1, ag.shape[3])), bg)


def test_untie_r_false_roundtrip_through_transformers(forward_impl):
    config = xlnet_lite.XLNetLiteConfig(**{**__import__("model_helpers").TINY, "untie_r": False})
    lite = __import__("model_helpers").randomise(xlnet_lite.XLNetLiteLMHeadModel(config)).eval()
    assert lite.transformer.r_w_bias is lite.transformer.layer_biases()[0]
    hf = xlnet_lite.to_hf_xlnet(lite).eval()
    perm_mask, target_mapping = xlnet_masks(B, T, P)
    a, b = run_both(hf, lite, forward_impl, input_ids=ids(), perm_mask=perm_mask, target_mapping=target_mapping)
    close(a.logits, b.logits)


@pytest.mark.parametrize("cls_name", ["XLNetModel", "XLNetLMHeadModel", "XLNetForSequenceClassification"])
def test_round_trip_to_hf(cls_name):
    hf, lite = twins(cls_name)
    back = xlnet_lite.to_hf_xlnet(lite).eval()
    assert type(back) is type(hf)
    for (name, p), (name2, q) in zip(hf.state_dict().items(), back.state_dict().items()):
        assert name == name2
        assert torch.equal(p, q)
    with torch.no_grad():
        torch.testing.assert_close(hf(ids())[0], back(ids())[0], atol=0, rtol=0)


@pytest.mark.parametrize(
    "overrides",
    [dict(), dict(bi_data=True), dict(attn_type="uni"), dict(attn_type="uni", same_length=True)],
    ids=["bi", "bi_data", "uni", "uni_same_length"],
)
def test_training_gradients_of_every_parameter(impl, overrides):
    """One training step's gradients (fp32, train mode, dropout 0) equal transformers' XLNet's, parameter by parameter,
    on a pretraining batch: memory, two segments and <cls>, perm_mask, target_mapping, labels ("uni": causal, every
    position predicted; transformers' XLNet cannot combine it with perm_mask)."""
    hf, lite = twins(**overrides)
    lite.config._attn_implementation = impl
    perm_mask, target_mapping = xlnet_masks(B, T, P, seed=3)
    tt = torch.zeros(B, T, dtype=torch.long)
    tt[:, 6:-1], tt[:, -1] = 1, 2
    mems = [torch.randn(5, B, 32, generator=torch.Generator().manual_seed(layer)) for layer in range(2)]
    inputs = dict(
        input_ids=ids(),
        token_type_ids=tt,
        perm_mask=perm_mask,
        target_mapping=target_mapping,
        labels=ids(4, length=P),
        use_mems=True,
    )
    if overrides.get("attn_type") == "uni":
        inputs.update(perm_mask=None, target_mapping=None, labels=ids(4))
    for model, m in ((hf, mems), (lite, [x.transpose(0, 1) for x in mems])):
        model.train()
        model(**inputs, mems=m).loss.backward()
    lite_params = dict(lite.named_parameters())
    for name, p in hf.named_parameters():
        torch.testing.assert_close(lite_params[name].grad, p.grad, atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize(
    "cls_name,summary_type",
    [
        ("XLNetForSequenceClassification", "last"),
        ("XLNetForSequenceClassification", "first"),
        ("XLNetForSequenceClassification", "cls_index"),
        ("XLNetForSequenceClassification", "mean"),
        ("XLNetForMultipleChoice", "last"),
    ],
)
def test_sequence_heads_compute_the_last_layer_at_the_pooled_position_only(impl, cls_name, summary_type):
    """The sequence heads run the last layer's content stream at the position they pool (<cls> last, or the first
    token) and nothing else: logits, loss and every parameter's gradient (train mode, dropout 0) still equal
    transformers' XLNet's on a batch with memory, two segments and <cls>, left padding and (one choice per sequence)
    a perm_mask."""
    hf, lite = twins(cls_name, num_labels=3, summary_type=summary_type, summary_last_dropout=0.0)
    lite.config._attn_implementation = impl
    shape = (2, 2, T) if cls_name == "XLNetForMultipleChoice" else (B, T)
    rows = B  # sequences the model sees (batch x choices)
    tt = torch.zeros(shape, dtype=torch.long)
    tt[..., 6:-1], tt[..., -1] = 1, 2
    attention_mask = torch.ones(shape, dtype=torch.long)
    if summary_type != "mean":  # mean pooling leaves padding out, transformers' averages it in
        attention_mask.view(-1, T)[1, :3] = 0
    perm_mask = xlnet_masks(rows, T, P, seed=5)[0]
    mems = [torch.randn(5, rows, 32, generator=torch.Generator().manual_seed(layer)) for layer in range(2)]
    labels = torch.tensor([1, 0]) if cls_name == "XLNetForMultipleChoice" else torch.tensor([0, 2, 1, 2])
    inputs = dict(
        input_ids=ids(7, length=T).view(*shape), token_type_ids=tt, attention_mask=attention_mask, labels=labels
    )
    if cls_name == "XLNetForSequenceClassification":  # transformers' multiple-choice head does not flatten perm_mask
        inputs["perm_mask"] = perm_mask
    last_ff_rows = []
    lite.transformer.layer[-1].ff.register_forward_hook(lambda module, args, out: last_ff_rows.append(out.shape[1]))
    outputs = []
    for model, m in ((hf, mems), (lite, [x.transpose(0, 1) for x in mems])):
        model.train()
        out = model(**inputs, mems=m)
        out.loss.backward()
        outputs.append(out)
    close(outputs[0].logits, outputs[1].logits)
    close(outputs[0].loss, outputs[1].loss)
    lite_params = dict(lite.named_parameters())
    for name, p in hf.named_parameters():
        torch.testing.assert_close(lite_params[name].grad, p.grad, atol=1e-5, rtol=1e-4, msg=name)
    assert last_ff_rows == [T if summary_type == "mean" else 1]
    with torch.no_grad():  # hidden states asked for: every position again, the same logits
        full = lite(**inputs, mems=[x.transpose(0, 1) for x in mems], output_hidden_states=True)
    assert last_ff_rows[-1] == T
    close(full.logits, outputs[1].logits)


def test_positions_to_keep_is_for_the_content_stream_only():
    _, lite = twins("XLNetModel")
    out = lite(ids(), positions_to_keep=slice(-2, None))
    close(out.last_hidden_state, lite(ids()).last_hidden_state[:, -2:])
    perm_mask, target_mapping = xlnet_masks(B, T, P)
    with pytest.raises(ValueError, match="positions_to_keep"):
        lite(ids(), perm_mask=perm_mask, target_mapping=target_mapping, positions_to_keep=slice(-1, None))


def test_segment_dims_padded_to_a_multiple_of_8_change_nothing(impl, monkeypatch):
    """On CUDA the q.k product carries zero segment dims until D + C is a multiple of 8 (SDPA's fused kernels take no
    other head size). Padded here on the CPU as on CUDA: the loss and every gradient still equal transformers'."""
    from xlnet_lite import modeling_xlnet_lite as modeling

    real = modeling.segment_dims
    for d_head in range(1, 129):
        for classes in range(1, 5):
            seg = torch.arange(classes)[None]
            assert real(seg, d_head) == classes  # on the CPU: one dim per segment id, nothing added
            width = real(seg, d_head, pad=True)
            assert (d_head + width) % 8 == 0 and classes <= width < classes + 8, (d_head, classes, width)
    widths = []

    def as_on_cuda(seg_keys, d_head):
        widths.append(real(seg_keys, d_head, pad=True))
        return widths[-1]

    monkeypatch.setattr(modeling, "segment_dims", as_on_cuda)
    segment_step_matches_transformers(impl)
    assert widths and set(widths) == {8}  # d_head 8 and 3 segment ids: 5 zero dims


def test_segment_term_as_a_bias_in_eager_mode_changes_nothing(impl, monkeypatch):
    """With no one-hot segment dims (seg_classes 0, as under torch.compile) the segment term joins the positional
    bias instead, and the head size stays D: benchmarks/bench_gpu.py's lite_sdpa_segbias_bf16 row times that on
    CUDA. The loss and every gradient still equal transformers'."""
    from xlnet_lite import modeling_xlnet_lite as modeling

    calls = []
    monkeypatch.setattr(modeling, "segment_dims", lambda seg_keys, d_head: calls.append(d_head) or 0)
    segment_step_matches_transformers(impl)
    assert calls


def segment_step_matches_transformers(impl):
    """A training step with 3 segment ids, perm_mask and targets: XLNet-Lite's loss and gradients against
    transformers'."""
    hf, lite = twins()
    lite.config._attn_implementation = impl
    perm_mask, target_mapping = xlnet_masks(B, T, P, seed=5)
    tt = torch.zeros(B, T, dtype=torch.long)
    tt[:, 6:-1], tt[:, -1] = 1, 2
    inputs = dict(
        input_ids=ids(), token_type_ids=tt, perm_mask=perm_mask, target_mapping=target_mapping, labels=ids(4, length=P)
    )
    losses = []
    for model in (hf, lite):
        model.train()
        losses.append(model(**inputs).loss)
        losses[-1].backward()
    close(losses[1], losses[0])
    lite_params = dict(lite.named_parameters())
    for name, p in hf.named_parameters():
        torch.testing.assert_close(lite_params[name].grad, p.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_bench_gpu_segment_bias_row_is_its_twin_with_no_segment_dims(monkeypatch):
    """benchmarks/bench_gpu.py's lite_sdpa_segbias_bf16 is lite_sdpa_bf16 (same weights, batch and memory) with the
    segment term as a bias: the same loss, and no one-hot dims while it runs. Checked on the CPU in fp32."""
    from benchmarks import bench_gpu
    from xlnet_lite import modeling_xlnet_lite as modeling

    cfg = dict(BENCH_TINY, dropout=0.0)
    variants = bench_gpu.build(cfg, ["lite_sdpa_bf16", "lite_sdpa_segbias_bf16"])
    widths = []
    real = modeling.segment_dims
    monkeypatch.setattr(
        modeling, "segment_dims", lambda seg_keys, d_head: widths.append(real(seg_keys, d_head)) or widths[-1]
    )
    losses = {}
    for name, variant in variants.items():
        variant.autocast_dtype = None
        losses[name] = variant.forward(**variant.inputs).loss
        widths.append(name)
    assert widths[0] > 0 and widths[1] == "lite_sdpa_bf16" and widths[2] == "lite_sdpa_segbias_bf16"
    close(losses["lite_sdpa_segbias_bf16"], losses["lite_sdpa_bf16"])


def test_bench_gpu_cudnn_row_is_the_dropout_0_sdpa_row_held_to_cudnn(monkeypatch):
    """benchmarks/bench_gpu.py's lite_sdpa_cudnn_nodrop_bf16 runs the dropout-0 SDPA row's weights, batch and memory,
    its forward inside sdpa_kernel([CUDNN_ATTENTION]) (recorded here: the CPU has no cuDNN attention), and gives its
    loss."""
    import contextlib

    import torch.nn.attention
    from torch.nn.attention import SDPBackend

    from benchmarks import bench_gpu

    held = []

    @contextlib.contextmanager
    def recording(backends):
        held.append(list(backends))
        yield

    monkeypatch.setattr(torch.nn.attention, "sdpa_kernel", recording)
    cfg = BENCH_TINY
    variants = bench_gpu.build(cfg, ["lite_sdpa_nodrop_bf16", "lite_sdpa_cudnn_nodrop_bf16"])
    losses = {}
    for name, variant in variants.items():
        variant.autocast_dtype = None
        with torch.no_grad():
            losses[name] = variant.forward(**variant.inputs).loss
    assert held == [[SDPBackend.CUDNN_ATTENTION]]
    close(losses["lite_sdpa_cudnn_nodrop_bf16"], losses["lite_sdpa_nodrop_bf16"])
    assert bench_gpu.FLOP_TWIN["lite_sdpa_cudnn_nodrop_bf16"] == "lite_sdpa_bf16"


def test_bench_gpu_bits_dropout_row_is_the_sdpa_row_with_the_cpus_mask_on_every_device(monkeypatch):
    """benchmarks/bench_gpu.py's lite_sdpa_bitsdrop_bf16 runs the SDPA row's weights, batch, memory and dropout 0.1, its
    Dropout drawing the mask from random integers on every device (on a GPU the SDPA row's is F.dropout's): on the CPU,
    where both draw it so, the same seed gives the same loss."""
    from benchmarks import bench_gpu
    from xlnet_lite import modeling_xlnet_lite as modeling

    seen = []
    forward = modeling.Dropout.forward

    def recording(self, x):
        seen.append(frozenset(modeling.CHEAP_MASK_DEVICES))
        return forward(self, x)

    monkeypatch.setattr(modeling.Dropout, "forward", recording)
    variants = bench_gpu.build(BENCH_TINY, ["lite_sdpa_bf16", "lite_sdpa_bitsdrop_bf16"])
    losses, devices = {}, {}
    for name, variant in variants.items():
        variant.autocast_dtype = None
        seen.clear()
        torch.manual_seed(0)
        with torch.no_grad():
            losses[name] = variant.forward(**variant.inputs).loss
        devices[name] = set(seen)
    assert devices == {"lite_sdpa_bf16": {frozenset({"cpu"})}, "lite_sdpa_bitsdrop_bf16": {frozenset({"cpu", "cuda"})}}
    assert variants["lite_sdpa_bitsdrop_bf16"].model.config.dropout == 0.1
    torch.testing.assert_close(losses["lite_sdpa_bitsdrop_bf16"], losses["lite_sdpa_bf16"], rtol=0, atol=0)
    assert bench_gpu.FLOP_TWIN["lite_sdpa_bitsdrop_bf16"] == "lite_sdpa_bf16"


def test_bench_gpu_flex_rows_are_their_sdpa_twin_without_dropout():
    """benchmarks/bench_gpu.py's flex rows run the same weights, batch and memory as its SDPA rows, every dropout at
    0 (flex_attention takes none), as does their like-for-like SDPA row, and so does the Triton kernels' row at
    dropout 0 (their other row keeps 0.1); the loss is the same (forward on the CPU, fp32; the flex backward runs only
    on a GPU, the Triton kernels here in Triton's interpreter)."""
    from benchmarks import bench_gpu
    from xlnet_lite.modeling_xlnet_lite import Dropout

    cfg = BENCH_TINY
    variants = bench_gpu.build(
        cfg,
        ["lite_sdpa_bf16", "lite_sdpa_nodrop_bf16", "lite_flex_bf16", "lite_triton_bf16", "lite_triton_nodrop_bf16"],
    )
    rates = {n: {m.p for m in v.model.modules() if isinstance(m, Dropout)} for n, v in variants.items()}
    assert rates == {
        "lite_sdpa_bf16": {0.1},
        "lite_sdpa_nodrop_bf16": {0.0},
        "lite_flex_bf16": {0.0},
        "lite_triton_bf16": {0.1},
        "lite_triton_nodrop_bf16": {0.0},
    }
    assert variants["lite_flex_bf16"].model.config._attn_implementation == "flex_attention"
    assert variants["lite_triton_bf16"].model.config._attn_implementation == "xlnet_lite_triton"
    losses = {}
    for name in ("lite_sdpa_nodrop_bf16", "lite_flex_bf16", "lite_triton_nodrop_bf16"):
        variant = variants[name]
        variant.autocast_dtype = None
        with torch.no_grad():
            losses[name] = variant.forward(**variant.inputs).loss
    close(losses["lite_flex_bf16"], losses["lite_sdpa_nodrop_bf16"])
    close(losses["lite_triton_nodrop_bf16"], losses["lite_sdpa_nodrop_bf16"])
    for name in bench_gpu.NAMES:  # every row's FLOPs come from a row that is counted, and kept by --no-compile
        twin = bench_gpu.FLOP_TWIN.get(name, name)
        assert twin in bench_gpu.NAMES and twin not in bench_gpu.FLOP_TWIN and not bench_gpu.compiled(twin), name
