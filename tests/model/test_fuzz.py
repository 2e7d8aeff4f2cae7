"""Property-based fuzzing of the model forward: any input gives either a correct-shaped finite result or a
ValueError with a message, never another exception, a hang or a wrong shape."""

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from model_helpers import TINY

from xlnet_lite import XLNetLiteConfig, XLNetLiteForSequenceClassification, XLNetLiteLMHeadModel

MODELS = {}


def model_for(cls, **config):
    key = (cls, tuple(sorted(config.items())))
    if key not in MODELS:
        torch.manual_seed(0)
        MODELS[key] = cls(XLNetLiteConfig(**{**TINY, "num_labels": 3, **config})).eval()
    return MODELS[key]


MASK_DTYPES = [torch.float32, torch.float64, torch.long, torch.int32, torch.bool, torch.bfloat16]


@st.composite
def forward_inputs(draw):
    B = draw(st.integers(1, 3))
    T = draw(st.integers(1, 7))

    def wrong(n):  # mostly right, sometimes off by one
        return draw(st.sampled_from([n, n, n, n + 1, max(n - 1, 0)]))

    inputs = {}
    if draw(st.booleans()):
        inputs["input_ids"] = torch.randint(
            -1 if draw(st.booleans()) else 0, 97 + draw(st.integers(0, 1)), (B, wrong(T))
        )
    else:
        inputs["inputs_embeds"] = torch.randn(
            B,
            wrong(T),
            draw(st.sampled_from([32, 32, 16])),
            dtype=draw(st.sampled_from([torch.float32, torch.float64])),
        )
    dtype = st.sampled_from(MASK_DTYPES)
    if draw(st.booleans()):
        inputs["perm_mask"] = (torch.rand(wrong(B), wrong(T), wrong(T)) > 0.5).to(draw(dtype))
    if draw(st.booleans()):
        P = draw(st.integers(0, 4))
        rows = torch.randint(0, T, (B, P))
        tm = torch.nn.functional.one_hot(rows, T).to(draw(dtype))
        if draw(st.booleans()) and P:
            tm[0, 0] = 0  # a padding row
        if draw(st.integers(0, 5)) == 0:
            tm = torch.rand(B, P, wrong(T))  # not one-hot / wrong width
        inputs["target_mapping"] = tm
        if draw(st.booleans()):
            inputs["labels"] = torch.randint(-100 if draw(st.booleans()) else 0, 97, (B, wrong(P)))
    if draw(st.booleans()):
        mask = torch.ones(B, wrong(T))
        mask[:, : draw(st.integers(0, T))] = 0
        inputs["attention_mask"] = mask.to(draw(dtype))
    if draw(st.booleans()):
        inputs["token_type_ids"] = torch.randint(0, 3, (B, wrong(T))).to(
            draw(st.sampled_from([torch.long, torch.int32, torch.float32]))
        )
    if draw(st.booleans()):
        M = draw(st.integers(0, 4))
        inputs["mems"] = [torch.randn(wrong(B), M, draw(st.sampled_from([32, 32, 8]))) for _ in range(wrong(2))]
    inputs["use_mems"] = draw(st.booleans())
    return inputs


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    forward_inputs(),
    st.sampled_from(["eager", "sdpa", "flex_attention"]),
    st.sampled_from(["bi", "uni"]),
    st.booleans(),
)
def test_lm_forward_fuzz(inputs, impl, attn_type, bi_data):
    model = model_for(XLNetLiteLMHeadModel, attn_type=attn_type, bi_data=bi_data, mem_len=5)
    model.config._attn_implementation = impl
    try:
        with torch.no_grad():
            out = model(**inputs)
    except ValueError as error:
        assert str(error)
        return
    first = inputs.get("input_ids", inputs.get("inputs_embeds"))
    B, T = first.shape[:2]
    rows = inputs["target_mapping"].shape[1] if "target_mapping" in inputs else T
    assert out.logits.shape == (B, rows, 97)
    assert torch.isfinite(out.logits).all()
    if inputs["use_mems"]:
        M = inputs["mems"][0].shape[1] if inputs.get("mems") else 0
        assert len(out.mems) == 2 and out.mems[0].shape == (B, min(M + T, 5), 32)
    if "labels" in inputs:
        assert out.loss is not None and out.loss.dim() == 0


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 3), st.integers(1, 6), st.integers(0, 3), st.sampled_from(MASK_DTYPES))
def test_classification_forward_fuzz(B, T, pad, dtype):
    model = model_for(XLNetLiteForSequenceClassification)
    mask = torch.ones(B, T)
    mask[:, : min(pad, T - 1)] = 0
    out = model(torch.randint(0, 97, (B, T)), attention_mask=mask.to(dtype), labels=torch.randint(0, 3, (B,)))
    assert out.logits.shape == (B, 3) and torch.isfinite(out.loss)


@st.composite
def collator_examples(draw):
    n = draw(st.integers(0, 4))
    examples = []
    for _ in range(n):
        T = draw(st.integers(0, 12))
        example = {"input_ids": draw(st.lists(st.integers(-2, 90), min_size=T, max_size=T))}
        if draw(st.booleans()):
            example["token_type_ids"] = [0] * max(T - 1, 0) + [2] * min(T, 1)
        examples.append(example)
    return examples


@settings(max_examples=150, deadline=None)
@given(
    collator_examples(),
    st.sampled_from([None, 2, 4]),
    st.sampled_from([None, 1, 2]),
    st.floats(0.05, 0.9),
    st.integers(1, 5),
    st.integers(0, 100),
)
def test_collator_fuzz(examples, reuse_len, perm_size, plm_probability, max_span_length, seed):
    from tokenizers import Tokenizer, models

    from xlnet_lite.collator import DataCollatorForXLNetPretraining
    from xlnet_lite.tokenization_xlnet_lite import SPECIAL_TOKENS, wrap_tokenizer

    vocab = (
        [(t, 0.0) for t in SPECIAL_TOKENS]
        + [(f"▁w{i}", -1.0) for i in range(40)]
        + [(f"x{i}", -2.0) for i in range(40)]
    )
    tokenizer = wrap_tokenizer(Tokenizer(models.Unigram(vocab, unk_id=0)))
    try:
        collator = DataCollatorForXLNetPretraining(
            tokenizer,
            plm_probability=plm_probability,
            reuse_len=reuse_len,
            perm_size=perm_size,
            max_span_length=max_span_length,
            seed=seed,
        )
        out = collator(examples)
    except ValueError as error:
        assert str(error)
        return
    B, T = out["input_ids"].shape
    P = out["target_mapping"].shape[1]
    assert B == len(examples) and T == max(len(e["input_ids"]) for e in examples)
    assert out["perm_mask"].shape == (B, T, T) and out["labels"].shape == (B, P)
    assert out["target_mapping"].shape == (B, P, T)
    assert ((out["labels"] == -100) == (out["target_mapping"].sum(-1) == 0)).all()
