"""torch.compile(fullgraph=True): a training step on pretraining and classification inputs compiles as one graph, with
no recompilation between steps of equal shapes, and computes what eager mode computes."""

import importlib

import pytest
import torch
import torch._dynamo
from accelerate.state import AcceleratorState
from model_helpers import TINY, randomise

from xlnet_lite import XLNetLiteConfig, XLNetLiteForSequenceClassification, XLNetLiteLMHeadModel, training
from xlnet_lite.collator import random_factorization_masks as xlnet_masks

B, T, P = 4, 10, 3


def twin_models(cls, impl, **overrides):
    """The same re-randomised model twice: one to compile, one to run eagerly."""
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        model = randomise(cls(XLNetLiteConfig(**{**TINY, **overrides}))).train()
        model.config._attn_implementation = impl
        models.append(model)
    return models


def left_padding(batch, length, seed):
    gen = torch.Generator().manual_seed(seed)
    mask = torch.ones(batch, length, dtype=torch.long)
    for b, n in enumerate(torch.randint(0, length // 2, (batch,), generator=gen).tolist()):
        mask[b, :n] = 0
    mask[-1] = 1  # a row without padding next to padded ones
    return mask


def assert_same_step(out, ref, compiled, eager):
    torch.testing.assert_close(out.loss, ref.loss, rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(compiled.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")


@pytest.mark.slow
def test_pretraining_step_compiles_whole_and_matches_eager(impl):
    """perm_mask, target_mapping, token_type_ids (three segment ids), padding and Transformer-XL memory: the memory
    grows for two steps (a new shape each), then every step has the same shapes and must reuse the graph."""
    model, eager = twin_models(XLNetLiteLMHeadModel, impl, mem_len=6, reuse_len=4)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=False)
    mems = eager_mems = None
    for step in range(5):
        gen = torch.Generator().manual_seed(step)
        perm_mask, target_mapping = xlnet_masks(B, T, P, seed=step)
        batch = dict(
            input_ids=torch.randint(0, 97, (B, T), generator=gen),
            token_type_ids=torch.randint(0, 3, (B, T), generator=gen),
            attention_mask=left_padding(B, T, step),
            perm_mask=perm_mask,
            target_mapping=target_mapping,
            labels=torch.randint(0, 97, (B, P), generator=gen),
        )
        model.zero_grad()
        eager.zero_grad()
        with torch._dynamo.config.patch(error_on_recompile=step >= 3):
            out = compiled(**batch, mems=mems, use_mems=True)
        ref = eager(**batch, mems=eager_mems, use_mems=True)
        out.loss.backward()
        ref.loss.backward()
        assert_same_step(out, ref, model, eager)
        for m, r in zip(out.mems, ref.mems):
            torch.testing.assert_close(m, r, rtol=1e-5, atol=1e-5)
        mems, eager_mems = out.mems, ref.mems


@pytest.mark.slow
def test_classification_step_and_evaluation_compile_whole_and_match_eager(impl):
    """Left-padded pairs with segment ids: a training step, then eval-mode forwards on new batches of equal shape."""
    model, eager = twin_models(XLNetLiteForSequenceClassification, impl, num_labels=3, summary_last_dropout=0.0)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=False)

    def batch(seed):
        gen = torch.Generator().manual_seed(seed)
        return dict(
            input_ids=torch.randint(0, 97, (B, T), generator=gen),
            token_type_ids=torch.cat(
                [torch.zeros(B, T // 2), torch.ones(B, T // 2 - 1), torch.full((B, 1), 2)], 1
            ).long(),
            attention_mask=left_padding(B, T, seed),
            labels=torch.randint(0, 3, (B,), generator=gen),
        )

    out, ref = compiled(**batch(0)), eager(**batch(0))
    out.loss.backward()
    ref.loss.backward()
    assert_same_step(out, ref, model, eager)
    model.eval()
    eager.eval()
    for seed in (1, 2, 3):
        with torch.no_grad(), torch._dynamo.config.patch(error_on_recompile=seed > 1):
            torch.testing.assert_close(
                compiled(**batch(seed)).logits, eager(**batch(seed)).logits, rtol=1e-5, atol=1e-5
            )


def test_compiled_model_reads_no_data_for_shortcuts():
    """What the data-dependent checks and shortcuts do in eager mode is skipped under compile, and nothing else: a
    batch without padding or blocked keys still compiles whole (the masks are applied, all-False)."""
    model, eager = twin_models(XLNetLiteLMHeadModel, "sdpa")
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=False)
    input_ids = torch.randint(0, 97, (B, T), generator=torch.Generator().manual_seed(0))
    target_mapping = torch.zeros(B, P, T)
    target_mapping[:, torch.arange(P), torch.arange(P)] = 1.0
    model.eval()
    eager.eval()
    with torch.no_grad():
        out = compiled(input_ids, attention_mask=torch.ones(B, T), target_mapping=target_mapping)
        ref = eager(input_ids, attention_mask=torch.ones(B, T), target_mapping=target_mapping)
    torch.testing.assert_close(out.logits, ref.logits, rtol=1e-5, atol=1e-5)


def test_eager_checks_still_refuse_bad_data():
    model, _ = twin_models(XLNetLiteLMHeadModel, "sdpa")
    with pytest.raises(ValueError, match="token_type_ids must be segment ids >= 0"):
        model(torch.zeros(1, 4, dtype=torch.long), token_type_ids=torch.full((1, 4), -1))


@pytest.mark.parametrize(
    "recipe, dynamic",
    [("pretrain.run_pretraining.PretrainingArguments", False), ("finetune.run_glue.FinetuneArguments", None)],
)
def test_torch_compile_flag_compiles_static_shapes_where_every_batch_has_one_shape(recipe, dynamic):
    """--torch_compile: the pretraining recipe's batches all have one shape (a memory from the second step on), so it
    compiles static graphs; finetuning pads each batch to its longest text, so it lets torch.compile go dynamic."""
    module, cls = recipe.rsplit(".", 1)
    args = getattr(importlib.import_module(module), cls)(torch_compile=True, mixed_precision="no")
    AcceleratorState._reset_state(True)
    try:
        plugin = training.make_accelerator(args).state.dynamo_plugin
        assert plugin.backend.value.lower() == "inductor" and plugin.dynamic is dynamic
    finally:
        AcceleratorState._reset_state(True)
