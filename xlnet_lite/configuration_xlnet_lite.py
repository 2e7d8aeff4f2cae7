"""XLNetLiteConfig: the architecture of an XLNet-Lite model, with transformers' XLNetConfig field names.

One dict of fields builds both this config and `transformers.XLNetConfig`; `xlnet_lite.from_hf_xlnet` /
`to_hf_xlnet` rely on that. Only architecture lives here; training flags belong to the recipes.
"""

from transformers import PreTrainedConfig

ATTN_TYPES = ("bi", "uni")
FF_ACTIVATIONS = ("gelu", "relu", "silu", "swish", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "tanh")
SUMMARY_TYPES = ("last", "first", "mean", "cls_index")


class XLNetLiteConfig(PreTrainedConfig):
    r"""Configuration of XLNet-Lite models (two-stream relative attention with a Transformer-XL memory).

    Fields and defaults follow `transformers.XLNetConfig`, so a config dict converts both ways unchanged:

    - `vocab_size`, `d_model` (H), `n_layer`, `n_head` (N), `d_inner`, `ff_activation`, `dropout`,
      `layer_norm_eps`, `initializer_range`, `untie_r` (kept for compatibility: every layer has its own
      u/v/b biases, as in transformers).
    - `attn_type`: "bi" (XLNet) or "uni" (Transformer-XL, causal).
    - `mem_len`: tokens of memory kept per layer (None or 0 keeps everything, like transformers);
      `reuse_len`: how many leading tokens of the current segment are cached into the memory.
    - `bi_data`: first half of the batch uses forward, second half backward relative positions.
    - `clamp_len`: clamp relative distances to this (-1: no clamping); `same_length`: every token of a
      "uni" model sees the same number of keys.
    - `use_mems_train` / `use_mems_eval`: return new mems in train / eval mode.
    - `sparse_prediction`: the LM head scores only the labelled positions of (B, T) labels (ModernBERT's field; set
      by masked and causal LM pretraining, reset when the model is saved).
    - `summary_*`: the sequence-summary head of the classification model.
    """

    model_type = "xlnet_lite"
    keys_to_ignore_at_inference = ["mems"]
    attribute_map = {
        "n_token": "vocab_size",
        "hidden_size": "d_model",
        "num_attention_heads": "n_head",
        "num_hidden_layers": "n_layer",
    }

    vocab_size: int = 32000
    d_model: int = 1024
    n_layer: int = 24
    n_head: int = 16
    d_inner: int = 4096
    d_head: int | None = None
    ff_activation: str = "gelu"
    untie_r: bool = True
    attn_type: str = "bi"
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    dropout: float | int = 0.1
    mem_len: int | None = 512
    reuse_len: int | None = None
    use_mems_eval: bool = True
    use_mems_train: bool = False
    bi_data: bool = False
    clamp_len: int = -1
    same_length: bool = False
    sparse_prediction: bool = False
    summary_type: str = "last"
    summary_use_proj: bool = True
    summary_activation: str | None = "tanh"
    summary_last_dropout: float | int = 0.1
    start_n_top: int = 5
    end_n_top: int = 5
    pad_token_id: int | None = 5
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    tie_word_embeddings: bool = True

    def __post_init__(self, **kwargs):
        self.d_head = self.d_head or (self.d_model // self.n_head if self.n_head else None)
        super().__post_init__(**kwargs)
        self.check_fields()

    def check_fields(self):
        """Raise ValueError naming the first invalid field and what would be valid."""
        for name in ("vocab_size", "d_model", "n_layer", "n_head", "d_inner"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"XLNetLiteConfig.{name} must be a positive integer, got {value!r}")
        if self.d_model % self.n_head:
            raise ValueError(
                f"XLNetLiteConfig.d_model ({self.d_model}) must be divisible by n_head ({self.n_head}); "
                f"choose n_head among the divisors of d_model, e.g. {_divisors(self.d_model)}"
            )
        if self.d_head != self.d_model // self.n_head:
            raise ValueError(
                f"XLNetLiteConfig.d_head ({self.d_head}) must equal d_model // n_head ({self.d_model // self.n_head})"
            )
        _check_choice("attn_type", self.attn_type, ATTN_TYPES)
        _check_choice("ff_activation", self.ff_activation, FF_ACTIVATIONS)
        _check_choice("summary_type", self.summary_type, SUMMARY_TYPES)
        for name in ("mem_len", "reuse_len"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"XLNetLiteConfig.{name} must be None or an integer >= 0, got {value!r}")
        if not isinstance(self.clamp_len, int) or self.clamp_len < -1:
            raise ValueError(
                f"XLNetLiteConfig.clamp_len must be -1 (no clamping) or an integer >= 0, got {self.clamp_len!r}"
            )
        for name in ("dropout", "summary_last_dropout"):
            value = getattr(self, name)
            if not 0 <= value < 1:
                raise ValueError(f"XLNetLiteConfig.{name} must be in [0, 1), got {value!r}")
        if not self.layer_norm_eps > 0:
            raise ValueError(f"XLNetLiteConfig.layer_norm_eps must be > 0, got {self.layer_norm_eps!r}")

    @property
    def max_position_embeddings(self):
        return None  # relative positions: no length limit (generate() warns past a number; there is none)


def _check_choice(name, value, choices):
    if value not in choices:
        raise ValueError(f"XLNetLiteConfig.{name} must be one of {list(choices)}, got {value!r}")


def _divisors(n):
    return [d for d in range(1, min(n, 64) + 1) if n % d == 0]


__all__ = ["XLNetLiteConfig"]
