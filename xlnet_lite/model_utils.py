"""Model details the recipes share: size presets, one loader for every kind of checkpoint, re-initialising the top
layers, the unigram start of the LM head, and reading a long input as consecutive segments through the memory."""

from __future__ import annotations

import numpy as np
import torch
from transformers import AutoConfig

from .convert import from_hf_xlnet, hf_class

# Architecture presets (parameter counts with an 8,000-piece vocabulary and the tied LM head).
MODEL_PRESETS = {
    "tiny": dict(d_model=64, n_layer=2, n_head=2, d_inner=256),  # 0.63M
    "small": dict(d_model=256, n_layer=4, n_head=4, d_inner=1024),  # 5.5M
    "medium": dict(d_model=384, n_layer=6, n_head=6, d_inner=1536),  # 14.6M
    "base": dict(d_model=768, n_layer=12, n_head=12, d_inner=3072),  # 98M (XLNet-base layout)
}

# Config fields that only pretraining uses; a saved model gets their inference values (transformers' defaults).
PRETRAINING_ONLY_FIELDS = {"reuse_len": None, "bi_data": False, "use_mems_train": False, "sparse_prediction": False}


def load_model(name_or_path, model_class, *, trust_remote_code=False, **kwargs):
    """`model_class` (an XLNet-Lite class) from an XLNet-Lite folder or Hub id, or from a transformers XLNet
    checkpoint (folder or Hub id, e.g. "xlnet/xlnet-base-cased"), converted exactly. `kwargs` go to
    from_pretrained (config overrides such as num_labels, dropout)."""
    config = AutoConfig.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    if config.model_type == "xlnet":
        return from_hf_xlnet(hf_class(model_class).from_pretrained(name_or_path, **kwargs))
    return model_class.from_pretrained(name_or_path, trust_remote_code=trust_remote_code, **kwargs)


def model_from_config(name_or_path, model_class, *, trust_remote_code=False, **kwargs):
    """A randomly initialised `model_class` with the architecture of a config (XLNet-Lite or transformers XLNet)."""
    config = AutoConfig.from_pretrained(name_or_path, trust_remote_code=trust_remote_code, **kwargs)
    if config.model_type == "xlnet":
        return from_hf_xlnet(hf_class(model_class)(config))
    return model_class(config)


def reinit_top_layers(model, n: int):
    """Draw the top `n` Transformer layers of `model` (an XLNet-Lite model with `.transformer`) afresh from its
    initialiser, keeping the embeddings and the layers below: the re-initialisation of Zhang et al. (2021), "Revisiting
    Few-sample BERT Fine-tuning", for finetuning on few labels. n = n_layer keeps only the word embeddings (and, with
    untie_r False, the relative-attention biases shared by all layers)."""
    layers = model.transformer.layer
    if not 0 <= n <= len(layers):
        raise ValueError(f"n must be in [0, n_layer={len(layers)}], got {n}")
    for layer in layers[len(layers) - n :]:
        layer.apply(model._init_weights)


def unigram_log_probs(token_counts, vocab_size):
    """log p(token) from training-token counts, add-one smoothed: (vocab_size,) float64."""
    counts = np.asarray(token_counts, dtype=np.float64)[:vocab_size]
    counts = np.pad(counts, (0, vocab_size - len(counts))) + 1.0
    return np.log(counts / counts.sum())


def init_lm_bias_at_unigram(model, log_probs):
    """From scratch, the LM head's bias (`get_output_embeddings().bias`: XLNet's lm_loss, BERT's decoder) starts at
    the unigram log-probabilities (centred), so the first steps learn context instead of word frequencies."""
    with torch.no_grad():
        model.get_output_embeddings().bias.copy_(torch.from_numpy(log_probs - log_probs.mean()))


def unigram_cross_entropy(log_probs, labels):
    """Cross-entropy (nats) of the labelled targets (-100 ignored) under the unigram distribution: the loss of a
    model that ignores all context."""
    labels = labels.flatten().cpu().numpy()
    return float(-log_probs[labels[labels >= 0]].mean())


def read_segments(transformer, input_ids, token_type_ids=None, *, mem_len=None, keep_graph=False, mems=None):
    """Read a long input as consecutive segments, left to right, and return the Transformer-XL memory after the
    last one: one (B, M, H) tensor per layer, M <= mem_len (None: everything).

    input_ids / token_type_ids: (B, S, T), S segments of T tokens, all real (no padding). Each layer's memory is its
    input on every token of the segments read so far, as Transformer-XL caches it; `config.reuse_len` (a pretraining
    setting) does not apply. keep_graph=False detaches the memory (gradient through the last segment only, as
    Transformer-XL trains; run it under torch.no_grad() to save the work); keep_graph=True keeps it (gradient
    through every segment).
    """
    for k in range(input_ids.shape[1]):
        types = None if token_type_ids is None else token_type_ids[:, k]
        out = transformer(
            input_ids=input_ids[:, k], token_type_ids=types, mems=mems, use_mems=False, output_hidden_states=True
        )
        inputs = out.hidden_states[: transformer.config.n_layer]  # each layer's input, (B, T, H)
        mems = list(inputs) if mems is None else [torch.cat([m, h], dim=1) for m, h in zip(mems, inputs)]  # (B, M, H)
        if mem_len:
            mems = [m[:, -mem_len:] for m in mems]
        if not keep_graph:
            mems = [m.detach() for m in mems]
    return mems
