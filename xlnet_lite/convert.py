"""Conversion between transformers' XLNet and XLNet-Lite. Parameter names and shapes are shared, so
conversion is a config translation plus a state-dict copy (strict: every tensor must find its place)."""

import dataclasses

import torch
import transformers

from .configuration_xlnet_lite import XLNetLiteConfig
from .modeling_xlnet_lite import (
    XLNetLiteForMultipleChoice,
    XLNetLiteForQuestionAnswering,
    XLNetLiteForQuestionAnsweringSimple,
    XLNetLiteForSequenceClassification,
    XLNetLiteForTokenClassification,
    XLNetLiteLMHeadModel,
    XLNetLiteModel,
)

_PAIRS = {
    "XLNetModel": XLNetLiteModel,
    "XLNetLMHeadModel": XLNetLiteLMHeadModel,
    "XLNetForSequenceClassification": XLNetLiteForSequenceClassification,
    "XLNetForTokenClassification": XLNetLiteForTokenClassification,
    "XLNetForMultipleChoice": XLNetLiteForMultipleChoice,
    "XLNetForQuestionAnsweringSimple": XLNetLiteForQuestionAnsweringSimple,
    "XLNetForQuestionAnswering": XLNetLiteForQuestionAnswering,
}


def hf_class(lite_class):
    """transformers' XLNet class twinned with an XLNet-Lite class (XLNetLiteForX -> transformers.XLNetForX)."""
    for hf_name, lite in _PAIRS.items():
        if lite is lite_class:
            return getattr(transformers, hf_name)
    raise ValueError(f"expected one of {sorted(c.__name__ for c in _PAIRS.values())}, got {lite_class.__name__}")


def _shared_fields(config, target_class):
    """Every field of `config` that `target_class` also declares (plus labels and problem type)."""
    names = {f.name for f in dataclasses.fields(target_class)} | {"num_labels"}
    values = {
        k: v for k, v in config.to_dict().items() if k in names and k not in ("model_type", "architectures", "auto_map")
    }
    values["num_labels"] = config.num_labels
    return values


def from_hf_xlnet(model):
    """Any of transformers' seven XLNet classes (XLNetModel, XLNetLMHeadModel, XLNetForSequenceClassification,
    XLNetForTokenClassification, XLNetForMultipleChoice, XLNetForQuestionAnsweringSimple, XLNetForQuestionAnswering)
    -> the XLNet-Lite twin with identical weights (same dtype, device, train/eval mode)."""
    name = type(model).__name__
    if name not in _PAIRS:
        raise ValueError(f"from_hf_xlnet expects one of {sorted(_PAIRS)}, got {name}")
    config = XLNetLiteConfig(**_shared_fields(model.config, XLNetLiteConfig))
    if getattr(model.config, "untie_r", True) is False:
        config.untie_r = True  # transformers keeps one u/v/b per layer whatever untie_r says
    lite = _PAIRS[name](config)
    lite.load_state_dict(model.state_dict(), strict=True)
    return lite.to(device=model.device, dtype=model.dtype).train(model.training)


def to_hf_xlnet(model):
    """The inverse of `from_hf_xlnet`: an XLNet-Lite model as transformers' XLNet with identical weights.
    With untie_r=False the shared u/v/b are copied into every layer (transformers has no sharing)."""
    try:
        cls = hf_class(type(model))
    except ValueError as error:
        raise ValueError(f"to_hf_xlnet: {error}") from None
    config = transformers.XLNetConfig(**_shared_fields(model.config, transformers.XLNetConfig))
    hf = cls(config)
    state = dict(model.state_dict())
    if not model.config.untie_r:
        prefix = "" if isinstance(model, XLNetLiteModel) else "transformer."
        for bias in ("r_w_bias", "r_r_bias", "r_s_bias"):
            shared = state.pop(prefix + bias)
            for i in range(model.config.n_layer):
                state[f"{prefix}layer.{i}.rel_attn.{bias}"] = shared
    with torch.no_grad():
        hf.load_state_dict(state, strict=True)
    return hf.to(device=model.device, dtype=model.dtype).train(model.training)
