"""Shared builders for the model tests: tiny configs, twin models with re-randomised weights, XLNet-style masks."""

import textwrap

import torch
import transformers

import xlnet_lite
from xlnet_lite.modeling_xlnet_lite import rel_shift

TINY = dict(vocab_size=97, d_model=32, n_layer=2, n_head=4, d_inner=48, dropout=0.0, mem_len=None)
# benchmarks/bench_gpu.py's configs' form (CONFIGS), tiny: a batch of 2 x 12 tokens, 3 predicted, a 6-token memory
BENCH_TINY = dict(
    vocab_size=97,
    d_model=16,
    n_layer=2,
    n_head=2,
    d_inner=32,
    batch=2,
    seq_len=12,
    num_predict=3,
    mem_len=6,
    reuse_len=6,
    dropout=0.1,
)


def randomise(model, scale=0.3, seed=0):
    """Re-draw every weight at a scale where each term (u, v, b, segments, positions) moves the output."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name and name.endswith("weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(scale * torch.randn(p.shape, generator=gen))
    return model


def twins(cls_name="XLNetLMHeadModel", seed=0, **overrides):
    """A transformers XLNet model and its XLNet-Lite twin with identical, re-randomised weights, in eval mode."""
    torch.manual_seed(seed)
    config = transformers.XLNetConfig(**{**TINY, **overrides})
    hf = randomise(getattr(transformers, cls_name)(config), seed=seed).eval()
    lite = xlnet_lite.from_hf_xlnet(hf).eval()
    return hf, lite


def run_both(hf, lite, impl, **inputs):
    """transformers' model and its XLNet-Lite twin on the same inputs, the twin with attention kernel `impl`."""
    lite.config._attn_implementation = impl
    with torch.no_grad():
        return hf(**inputs), lite(**inputs)


def segments_and_left_padding(shape):
    """Token types A (first half), B, <cls> last, and left padding on the second row, for inputs of `shape`."""
    token_type_ids = torch.zeros(shape, dtype=torch.long)
    token_type_ids[..., shape[-1] // 2 :] = 1
    token_type_ids[..., -1] = 2
    attention_mask = torch.ones(shape, dtype=torch.long)
    attention_mask.view(-1, shape[-1])[1, :3] = 0
    return dict(token_type_ids=token_type_ids, attention_mask=attention_mask)


# The start of a `python -c` script that must run where xlnet_lite cannot be imported (remote-code tests).
BLOCK_XLNET_LITE = textwrap.dedent(
    """
    import importlib.abc, sys
    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "xlnet_lite" or name.startswith("xlnet_lite."):
                raise ImportError("xlnet_lite is deliberately not importable here")
    sys.meta_path.insert(0, Block())
    """
)


def blind_first_prediction(perm_mask, target_mapping):
    """perm_mask changed in place so that the first prediction of the first row may see no key (of its segment)."""
    perm_mask[0, target_mapping[0, 0].argmax()] = 1


def nan_at_training_forward(monkeypatch, model_class, n):
    """Make the n-th training-mode forward of `model_class` return a NaN loss (evaluation forwards are not
    counted). Returns the call counter, so a test can reset it."""
    original = model_class.forward
    calls = {"train": 0}

    def forward(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        if self.training:
            calls["train"] += 1
            if calls["train"] == n:
                out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(model_class, "forward", forward)
    return calls


def plain_relative_attention(qw, qr, k, v, kr, pos, gain, seg_q, seg_k, blocked, qlen):
    """xlnet_lite.triton_attention.relative_attention written plainly: every score materialised, rel_shift for the
    banded term, a row with every key blocked attending to nothing. Returns (B, Q, N, D)."""
    score = qw @ k.transpose(-1, -2)  # (B, N, Q, K)
    score = score + (rel_shift(qr @ kr, qlen=qlen, klen=k.shape[2]) if kr is not None else pos)
    if gain is not None:
        score = score + gain[..., None] * (seg_q[:, None, :, None] == seg_k[:, None, None, :])
    if blocked is not None:
        score = score.masked_fill(blocked[:, None], float("-inf"))
    prob = torch.nan_to_num(score.softmax(-1), nan=0.0)  # a row with every key blocked attends to nothing
    return (prob @ v).transpose(1, 2)  # (B, Q, N, D)
