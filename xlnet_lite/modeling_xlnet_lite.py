"""XLNet-Lite: two-stream relative attention with permutation masks, partial prediction, relative segment
encodings and a Transformer-XL memory, as transformers `PreTrainedModel`s.

Parameter names and shapes are those of transformers' XLNet, so weights move both ways unchanged
(`xlnet_lite.from_hf_xlnet` / `to_hf_xlnet`); the computation is batch-first, uses boolean masks, runs
the query stream on the P predicted rows only and can use scaled_dot_product_attention.

Notation (shape comments):
    B batch, T query length (current segment), M memory length, K = M + T key length,
    P predicted tokens (rows of target_mapping), R relative positions (K + T for "bi", K + 1 for "uni"),
    N heads, D head size, H d_model, V vocabulary, L layers.

Public conventions (transformers' XLNet):
    perm_mask[b, i, j] = 1   token i may NOT attend to token j (query stream; the content stream re-opens i == j)
    target_mapping[b, p, t]  one-hot: the p-th prediction is the token at position t (all-zero rows are padding)
    attention_mask[b, t] = 0 padding (or input_mask[b, t] = 1); memory is always visible
Unlike transformers' XLNet, `mems` are batch-first: one (B, M, H) tensor per layer.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.activations import ACT2FN, get_activation
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.utils import ModelOutput

from .configuration_xlnet_lite import XLNetLiteConfig


# ----------------------------------------------------------------------------------------------------------
# Outputs


@dataclass
class XLNetLiteModelOutput(ModelOutput):
    """`last_hidden_state` is (B, P, H) with a target_mapping (query stream), else (B, T, H)."""

    last_hidden_state: torch.Tensor | None = None
    mems: list[torch.Tensor] | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple | None = None


@dataclass
class XLNetLiteLMHeadModelOutput(ModelOutput):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    mems: list[torch.Tensor] | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple | None = None


@dataclass
class XLNetLiteForSequenceClassificationOutput(ModelOutput):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    mems: list[torch.Tensor] | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple | None = None


# ----------------------------------------------------------------------------------------------------------
# Masks and relative positions: built once per forward, shared by every layer


@dataclass
class AttentionInputs:
    """Everything a layer's attention needs besides the hidden states; built once per forward."""

    pos_emb: torch.Tensor  # (1 or 2, R, H) sinusoid of relative distance (2 with bi_data)
    blocked_h: torch.Tensor | None  # (B or 1, 1, T, K) bool, True = may not attend (content stream); None = none
    blocked_g: torch.Tensor | None  # (B, 1, P, K) bool, the predicted tokens' rows (query stream)
    no_key_g: torch.Tensor | None  # (B, 1, P, 1) bool, query rows that may see no key at all; None = there are none
    seg_query_h: torch.Tensor | None  # (B, T) long segment ids of the content-stream queries; None = no segments
    seg_query_g: torch.Tensor | None  # (B, P) long segment ids of the predicted tokens
    seg_keys: torch.Tensor | None  # (B, K) long segment ids of the keys, memory as segment 0
    seg_classes: int  # number of segment ids (max id + 1)
    query_pos: torch.Tensor | None  # (B, P) long, position of each predicted token
    query_valid: torch.Tensor | None  # (B, P, 1) bool, False for all-zero target_mapping rows; None = all valid


def blocked_positions(*, perm_mask, pad_mask, attn_type, same_length, qlen, mlen, device):
    """The one place where public masks become the internal "may NOT attend" mask (True = blocked).

    Returns (B or 1, T, K) bool or None when nothing is blocked. pad_mask: (B, T) bool, True = padding.
    """
    blocked = None
    if attn_type == "uni":
        ones = torch.ones(qlen, qlen + mlen, dtype=torch.bool, device=device)
        blocked = ones.triu(mlen + 1)  # (T, K) future keys
        if same_length:
            blocked[:, :qlen] |= ones[:, :qlen].tril(-1)
        blocked = blocked[None]  # (1, T, K)
    data = None
    if perm_mask is not None:
        data = perm_mask > 0  # (B, T, T)
    if pad_mask is not None:
        data = pad_mask[:, None, :] if data is None else data | pad_mask[:, None, :]  # (B, T or 1, T)
    if data is not None:
        data = F.pad(data, (mlen, 0), value=False)  # (B, T or 1, K): memory always visible
        blocked = data if blocked is None else blocked | data
    if blocked is not None and blocked.shape[1] != qlen:
        blocked = blocked.expand(-1, qlen, -1)
    return blocked


def content_stream_mask(blocked, *, qlen, mlen):
    """The content stream sees what the query stream sees plus itself (the diagonal re-opened)."""
    if blocked is None:
        return None
    diagonal = F.pad(torch.eye(qlen, dtype=torch.bool, device=blocked.device), (mlen, 0))  # (T, K): key mlen + i
    return blocked & ~diagonal  # (B or 1, T, K) still blocked


def sinusoid(pos_seq, d_model):
    """(R,) float positions -> (R, H) [sin | cos] embedding, as in Transformer-XL."""
    freq_seq = torch.arange(0, d_model, 2, device=pos_seq.device).float()
    inv_freq = 1 / torch.pow(10000, freq_seq / d_model)  # (H/2,)
    angles = pos_seq[:, None] * inv_freq[None]  # (R, H/2)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)  # (R, H)


def relative_position_embedding(config, *, qlen, klen, device):
    """(1, R, H), or (2, R, H) with bi_data: forward positions for the first half of the batch, backward for the second."""
    beg, end = klen, (-qlen if config.attn_type == "bi" else -1)
    fwd = torch.arange(beg, end, -1, device=device).float()  # (R,) klen ... end+1
    seqs = [fwd, -fwd] if config.bi_data else [fwd]
    if config.clamp_len > 0:
        seqs = [s.clamp(-config.clamp_len, config.clamp_len) for s in seqs]
    return torch.stack([sinusoid(s, config.d_model) for s in seqs])  # (1 or 2, R, H)


def gather_rows(x, rows):
    """x (B or 1, T, K), rows (B, P) -> (B, P, K): the rows of the predicted tokens."""
    if x is None:
        return None
    x = x.expand(rows.shape[0], -1, -1)
    return x.gather(1, rows[:, :, None].expand(-1, -1, x.shape[-1]))


def rel_shift(x, *, qlen, klen, query_pos=None):
    """Relative scores over positions -> scores over keys: out[..., i, j] = x[..., i, qlen - pos_i + j].

    x: (B, N, Q, R) scores against the relative positions klen, klen-1, ...; pos_i is the query's position
    (i itself for the content stream, query_pos for the query stream). Returns (B, N, Q, K); entry (i, j)
    holds distance (mlen + pos_i) - j. Positions beyond R only occur at keys a "uni" model masks.
    """
    B, N, Q, R = x.shape
    if query_pos is None:  # content stream: a strided view, no copy
        x = x.contiguous()
        return torch.as_strided(x, (B, N, Q, klen), (N * Q * R, Q * R, R - 1, 1), x.storage_offset() + qlen)
    index = (qlen - query_pos)[:, None, :, None] + torch.arange(klen, device=x.device)  # (B, 1, P, K)
    index = index.clamp_(max=R - 1).expand(B, N, -1, -1)  # (B, N, P, K)
    return x.gather(3, index)


# ----------------------------------------------------------------------------------------------------------
# Dropout with a cheap mask


class _DropAndScale(torch.autograd.Function):
    """y = 0 where dropped, x / (1 - p) elsewhere; saves only the boolean mask for backward."""

    @staticmethod
    def forward(ctx, x, drop, scale):
        ctx.save_for_backward(drop)
        ctx.scale = scale
        return x.masked_fill(drop, 0.0).mul_(scale)

    @staticmethod
    def backward(ctx, grad):
        (drop,) = ctx.saved_tensors
        return grad.masked_fill(drop, 0.0).mul_(ctx.scale), None, None


class Dropout(nn.Module):
    """Inverted dropout whose mask comes from 15-bit random integers (p rounded to a multiple of 1/32768).

    Same distribution as nn.Dropout to within 2e-5 in p, but drawing the mask with `random_` on int32 and using both
    16-bit halves is 3-4x cheaper on CPU than `bernoulli_`, which is a fifth of a CPU training step otherwise.
    """

    def __init__(self, p):
        super().__init__()
        self.p = float(p)

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        n = x.numel()
        bits = torch.empty((n + 1) // 2, dtype=torch.int32, device=x.device).random_()  # 31 random bits each
        bits = bits.view(torch.int16)[:n].view(x.shape) & 0x7FFF  # 15 uniform bits per element
        drop = bits < round(self.p * 32768)
        return _DropAndScale.apply(x, drop, 1.0 / (1.0 - self.p))

    def extra_repr(self):
        return f"p={self.p}"


# ----------------------------------------------------------------------------------------------------------
# Layers


class XLNetLiteRelativeAttention(nn.Module):
    """Relative multi-head attention; one core serves the content stream and the query stream."""

    def __init__(self, config):
        super().__init__()
        H, N, D = config.d_model, config.n_head, config.d_head
        self.n_head, self.d_head, self.scale = N, D, 1 / D**0.5
        for name in ("q", "k", "v", "o", "r"):  # transformers' layout: (H, N, D)
            setattr(self, name, nn.Parameter(torch.empty(H, N, D)))
        if config.untie_r:
            self.r_w_bias = nn.Parameter(torch.empty(N, D))  # u
            self.r_r_bias = nn.Parameter(torch.empty(N, D))  # v
            self.r_s_bias = nn.Parameter(torch.empty(N, D))  # b
        self.seg_embed = nn.Parameter(torch.empty(2, N, D))  # s+ (same segment), s- (different)
        self.layer_norm = nn.LayerNorm(H, eps=config.layer_norm_eps)
        self.dropout = Dropout(config.dropout)

    def project(self, x, weight):
        """(B, S, H) @ (H, N, D) -> (B, S, N, D)."""
        return (x @ weight.flatten(1)).unflatten(-1, (self.n_head, self.d_head))

    def keys(self, cat, pos_emb, *, seg_k, seg_classes, batch):
        """Keys and values of one layer, shared by both streams.

        Returns k (B, N, K, D + C) with the C one-hot segment dims of the keys appended (C = 0 without
        segments), v (B, N, K, D) and the transposed positional keys kr (B or 1, N, D, R).
        """
        k = self.project(cat, self.k).transpose(1, 2)  # (B, N, K, D)
        v = self.project(cat, self.v).transpose(1, 2)  # (B, N, K, D)
        kr = self.project(pos_emb, self.r)  # (1 or 2, R, N, D)
        if kr.shape[0] == 2:  # bi_data: first half forward, second half backward positions
            kr = kr.repeat_interleave(batch // 2, dim=0)  # (B, R, N, D)
        if seg_k is not None:
            same_k = F.one_hot(seg_k, seg_classes).to(k.dtype)[:, None].expand(-1, k.shape[1], -1, -1)  # (B, N, K, C)
            k = torch.cat([k, same_k], dim=-1)  # (B, N, K, D + C)
        return k, v, kr.permute(0, 2, 3, 1)

    def attend(self, q, keys, *, biases, seg_q, seg_classes, blocked, no_key, query_pos, qlen, eager):
        """Core: softmax over keys of [(q+u)k + shift((q+v)R) + (q+b)s] / sqrt(D), masked.

        q (B, Q, N, D) with Q = T (content stream) or P (query stream, rows at query_pos). The segment term
        (q+b)s_same/diff is computed exactly as extra dims of the q.k product: with same_ij = onehot(seg_i) .
        onehot(seg_j), (q+b)s = (q+b)s_diff + [(q+b)(s_same - s_diff)] same_ij, and the first part is the same for
        every key of a row, so softmax drops it. Returns (B, Q, N*D) and the probabilities (explicit path only).
        A query that may see no key attends to nothing.
        """
        k, v, kr = keys
        u, v_bias, b = biases
        q = q.transpose(1, 2)  # (B, N, Q, D)
        pos = ((q + v_bias[:, None]) * self.scale) @ kr  # (B, N, Q, R)
        pos = rel_shift(pos, qlen=qlen, klen=k.shape[2], query_pos=query_pos)  # (B, N, Q, K)
        q_aug = q + u[:, None]
        if seg_q is not None:
            seg = (q + b[:, None]) @ self.seg_embed.permute(1, 2, 0)  # (B, N, Q, 2): same, different segment
            same_q = F.one_hot(seg_q, seg_classes).to(q.dtype)[:, None]  # (B, 1, Q, C)
            q_aug = torch.cat([q_aug, (seg[..., :1] - seg[..., 1:]) * same_q], dim=-1)  # (B, N, Q, D + C)
        if eager:
            score = (q_aug * self.scale) @ k.transpose(-1, -2) + pos  # (B, N, Q, K)
            if blocked is not None:
                score.masked_fill_(blocked, torch.finfo(score.dtype).min)
            prob = score.softmax(-1)
            if no_key is not None:
                prob = prob.masked_fill(no_key, 0.0)
            out = self.dropout(prob) @ v  # (B, N, Q, D)
        else:
            bias = pos if blocked is None else pos.masked_fill(blocked, float("-inf"))
            p = self.dropout.p if self.training else 0.0
            out = F.scaled_dot_product_attention(q_aug, k, v, attn_mask=bias, dropout_p=p, scale=self.scale)
            prob = None
        return out.transpose(1, 2).flatten(2), prob  # (B, Q, N*D)

    def post_attention(self, x, attn_vec):
        """Output projection, dropout, residual, LayerNorm. attn_vec (B, Q, N*D) -> (B, Q, H)."""
        out = attn_vec @ self.o.flatten(1).t()  # (B, Q, H)
        return self.layer_norm(self.dropout(out) + x)

    def forward(self, h, g, mem, ai, *, biases, eager):
        """h (B, T, H), g (B, P, H) or None, mem (B, M, H) or None. Returns h, g, (prob_h, prob_g)."""
        cat = h if mem is None else torch.cat([mem, h], dim=1)  # (B, K, H)
        keys = self.keys(cat, ai.pos_emb, seg_k=ai.seg_keys, seg_classes=ai.seg_classes, batch=h.shape[0])
        core = dict(biases=biases, seg_classes=ai.seg_classes, qlen=h.shape[1], eager=eager)
        vec_h, prob_h = self.attend(
            self.project(h, self.q), keys, seg_q=ai.seg_query_h, blocked=ai.blocked_h, no_key=None, query_pos=None, **core
        )
        out_h = self.post_attention(h, vec_h)
        if g is None:
            return out_h, None, (prob_h,)
        vec_g, prob_g = self.attend(
            self.project(g, self.q), keys, seg_q=ai.seg_query_g, blocked=ai.blocked_g, no_key=ai.no_key_g,
            query_pos=ai.query_pos, **core,
        )
        if ai.query_valid is not None:  # all-zero target_mapping rows get no attention output
            vec_g = vec_g * ai.query_valid
        return out_h, self.post_attention(g, vec_g), (prob_h, prob_g)


class XLNetLiteFeedForward(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.layer_1 = nn.Linear(config.d_model, config.d_inner)
        self.layer_2 = nn.Linear(config.d_inner, config.d_model)
        self.dropout = Dropout(config.dropout)
        self.activation_function = ACT2FN[config.ff_activation]

    def forward(self, x):
        y = self.dropout(self.activation_function(self.layer_1(x)))
        return self.layer_norm(self.dropout(self.layer_2(y)) + x)


class XLNetLiteLayer(GradientCheckpointingLayer):
    def __init__(self, config):
        super().__init__()
        self.rel_attn = XLNetLiteRelativeAttention(config)
        self.ff = XLNetLiteFeedForward(config)

    def forward(self, h, g, mem, ai, *, biases, eager):
        h, g, probs = self.rel_attn(h, g, mem, ai, biases=biases, eager=eager)
        return self.ff(h), (None if g is None else self.ff(g)), probs


# ----------------------------------------------------------------------------------------------------------
# Models


class XLNetLitePreTrainedModel(PreTrainedModel):
    config_class = XLNetLiteConfig
    config: XLNetLiteConfig
    base_model_prefix = "transformer"
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _no_split_modules = ["XLNetLiteLayer"]

    def get_correct_attn_implementation(self, requested_attention, is_init_check=False):
        """Default: SDPA where CUDA is available; elsewhere the explicit kernel ("eager"), because PyTorch's CPU SDPA
        runs its unfused math path with an additive bias that needs a gradient, and XLNet-Lite's explicit kernel is
        faster there (benchmarks/bench_model.py). An explicit `attn_implementation` is always honoured."""
        if requested_attention is None:
            requested_attention = "sdpa" if torch.cuda.is_available() else "eager"
        return super().get_correct_attn_implementation(requested_attention, is_init_check)

    @torch.no_grad()
    def _init_weights(self, module):
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            module.weight.normal_(0.0, std)
            if module.bias is not None:
                module.bias.zero_()
        elif isinstance(module, nn.Embedding):
            module.weight.normal_(0.0, std)
        elif isinstance(module, nn.LayerNorm):
            module.weight.fill_(1.0)
            module.bias.zero_()
        elif isinstance(module, XLNetLiteRelativeAttention):
            for param in module.parameters(recurse=False):
                param.normal_(0.0, std)
        elif isinstance(module, XLNetLiteModel):
            module.mask_emb.normal_(0.0, std)
            for param in module.shared_biases():
                param.normal_(0.0, std)


def check_inputs(config, *, input_ids, inputs_embeds, perm_mask, target_mapping, mems, attention_mask, input_mask,
                 token_type_ids):
    """ValueError naming the argument and the expected form; nothing is broadcast silently. Returns (B, T)."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("Pass exactly one of input_ids (B, T) or inputs_embeds (B, T, H)")
    if input_ids is not None:
        if input_ids.dim() != 2 or input_ids.dtype.is_floating_point:
            raise ValueError(f"input_ids must be an integer tensor of shape (B, T), got {input_ids.dtype} {tuple(input_ids.shape)}")
        B, T = input_ids.shape
        if input_ids.numel() and not torch.compiler.is_compiling():
            low, high = int(input_ids.min()), int(input_ids.max())
            if low < 0 or high >= config.vocab_size:
                raise ValueError(f"input_ids must lie in [0, vocab_size={config.vocab_size}), got values in [{low}, {high}]")
    else:
        if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != config.d_model:
            raise ValueError(f"inputs_embeds must have shape (B, T, d_model={config.d_model}), got {tuple(inputs_embeds.shape)}")
        B, T = inputs_embeds.shape[:2]
    if T == 0:
        raise ValueError("input_ids / inputs_embeds must hold at least one token (T >= 1)")
    if B == 0:
        raise ValueError("input_ids / inputs_embeds must hold at least one sequence (B >= 1)")
    for name, x in (("attention_mask", attention_mask), ("input_mask", input_mask), ("token_type_ids", token_type_ids)):
        if x is not None and tuple(x.shape) != (B, T):
            raise ValueError(f"{name} must have shape (B, T) = {(B, T)}, got {tuple(x.shape)}")
    if token_type_ids is not None and (token_type_ids.dtype.is_floating_point or token_type_ids.dtype == torch.bool):
        raise ValueError(f"token_type_ids must be an integer tensor (segment ids), got {token_type_ids.dtype}")
    if token_type_ids is not None and token_type_ids.numel() and int(token_type_ids.min()) < 0:
        raise ValueError(f"token_type_ids must be segment ids >= 0, got {int(token_type_ids.min())}")
    if attention_mask is not None and input_mask is not None:
        raise ValueError("Pass only one of attention_mask (0 = padding) or input_mask (1 = padding)")
    if perm_mask is not None and tuple(perm_mask.shape) != (B, T, T):
        raise ValueError(f"perm_mask must have shape (B, T, T) = {(B, T, T)}, got {tuple(perm_mask.shape)}")
    if target_mapping is not None:
        if target_mapping.dim() != 3 or target_mapping.shape[0] != B or target_mapping.shape[2] != T:
            raise ValueError(f"target_mapping must have shape (B, P, T) = ({B}, P, {T}), got {tuple(target_mapping.shape)}")
        if not torch.compiler.is_compiling():
            tm = target_mapping.float()
            if not (((tm == 0) | (tm == 1)).all() and (tm.sum(-1) <= 1).all()):
                raise ValueError("target_mapping rows must be one-hot (the predicted position) or all zero (padding)")
    if config.bi_data and B % 2:
        raise ValueError(f"bi_data needs an even batch (first half forward, second half backward), got B={B}")
    if mems is not None:
        if len(mems) != config.n_layer:
            raise ValueError(f"mems must hold one tensor per layer (n_layer={config.n_layer}), got {len(mems)}")
        M = mems[0].shape[1] if mems[0].dim() == 3 else -1
        for i, m in enumerate(mems):
            if m.dim() != 3 or tuple(m.shape) != (B, M, config.d_model):
                raise ValueError(
                    f"mems[{i}] must have shape (B, M, d_model) = ({B}, M, {config.d_model}) (batch-first, the same M "
                    f"for every layer), got {tuple(m.shape)}"
                )
    return B, T


class XLNetLiteModel(XLNetLitePreTrainedModel):
    def __init__(self, config: XLNetLiteConfig):
        super().__init__(config)
        self.word_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.mask_emb = nn.Parameter(torch.empty(1, 1, config.d_model))
        self.layer = nn.ModuleList([XLNetLiteLayer(config) for _ in range(config.n_layer)])
        if not config.untie_r:  # one u, v, b shared by every layer, as in the original with untie_r=False
            N, D = config.n_head, config.d_head
            self.r_w_bias = nn.Parameter(torch.empty(N, D))
            self.r_r_bias = nn.Parameter(torch.empty(N, D))
            self.r_s_bias = nn.Parameter(torch.empty(N, D))
        self.dropout = Dropout(config.dropout)
        self.post_init()

    def get_input_embeddings(self):
        return self.word_embedding

    def set_input_embeddings(self, new_embeddings):
        self.word_embedding = new_embeddings

    def shared_biases(self):
        return [] if self.config.untie_r else [self.r_w_bias, self.r_r_bias, self.r_s_bias]

    def layer_biases(self, layer):
        owner = layer.rel_attn if self.config.untie_r else self
        return owner.r_w_bias, owner.r_r_bias, owner.r_s_bias

    def cache_mem(self, h, prev_mem):
        """This layer's input, first reuse_len tokens, appended to the memory, last mem_len kept, no gradient."""
        reuse_len, mem_len = self.config.reuse_len, self.config.mem_len
        if reuse_len:
            h = h[:, :reuse_len]
        new = h if prev_mem is None else torch.cat([prev_mem, h], dim=1)  # (B, M', H)
        return (new[:, -mem_len:] if mem_len else new).detach()

    def attention_inputs(self, *, perm_mask, pad_mask, token_type_ids, target_mapping, qlen, mlen, device):
        cfg = self.config
        blocked = blocked_positions(
            perm_mask=perm_mask, pad_mask=pad_mask, attn_type=cfg.attn_type, same_length=cfg.same_length,
            qlen=qlen, mlen=mlen, device=device,
        )  # (B or 1, T, K)
        seg_keys = None if token_type_ids is None else F.pad(token_type_ids.long(), (mlen, 0), value=0)  # (B, K)
        query_pos = query_valid = blocked_g = no_key_g = None
        if target_mapping is not None:
            valid = (target_mapping != 0).any(-1)  # (B, P)
            query_pos = (target_mapping != 0).to(torch.uint8).argmax(-1)  # (B, P) position of the one-hot entry
            query_valid = None if bool(valid.all()) else valid[:, :, None]
            if blocked is not None:
                blocked_g = gather_rows(blocked, query_pos)[:, None]  # (B, 1, P, K)
                no_key_g = blocked_g.all(-1, keepdim=True)  # (B, 1, P, 1)
                no_key_g = no_key_g if bool(no_key_g.any()) else None
                blocked_g = blocked_g if bool(blocked_g.any()) else None
        blocked_h = content_stream_mask(blocked, qlen=qlen, mlen=mlen)
        pos_emb = relative_position_embedding(cfg, qlen=qlen, klen=qlen + mlen, device=device)
        return AttentionInputs(
            pos_emb=self.dropout(pos_emb.to(self.dtype)),
            blocked_h=None if blocked_h is None or not bool(blocked_h.any()) else blocked_h[:, None],
            blocked_g=blocked_g,
            no_key_g=no_key_g,
            seg_query_h=None if seg_keys is None else token_type_ids.long(),
            seg_query_g=None if seg_keys is None or query_pos is None else token_type_ids.long().gather(1, query_pos),
            seg_keys=seg_keys,
            seg_classes=0 if seg_keys is None else int(seg_keys.max()) + 1,
            query_pos=query_pos,
            query_valid=query_valid,
        )

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        mems=None,
        perm_mask=None,
        target_mapping=None,
        token_type_ids=None,
        input_mask=None,
        inputs_embeds=None,
        use_mems=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        **kwargs,
    ):
        cfg = self.config
        output_attentions = output_attentions if output_attentions is not None else cfg.output_attentions
        output_hidden_states = output_hidden_states if output_hidden_states is not None else cfg.output_hidden_states
        return_dict = return_dict if return_dict is not None else cfg.return_dict
        if use_mems is None:
            use_mems = cfg.use_mems_train if self.training else cfg.use_mems_eval
        if mems is not None and all(m is None for m in mems):
            mems = None
        B, T = check_inputs(
            cfg, input_ids=input_ids, inputs_embeds=inputs_embeds, perm_mask=perm_mask, target_mapping=target_mapping,
            mems=mems, attention_mask=attention_mask, input_mask=input_mask, token_type_ids=token_type_ids,
        )
        mlen = mems[0].shape[1] if mems is not None else 0
        h = self.word_embedding(input_ids) if inputs_embeds is None else inputs_embeds.to(self.dtype)  # (B, T, H)
        if mems is not None:
            mems = [m.to(device=h.device, dtype=h.dtype) for m in mems]
        pad_mask = input_mask > 0 if input_mask is not None else None
        if attention_mask is not None:
            pad_mask = attention_mask == 0  # (B, T)
        ai = self.attention_inputs(
            perm_mask=perm_mask, pad_mask=_padding_or_none(pad_mask), token_type_ids=token_type_ids,
            target_mapping=target_mapping, qlen=T, mlen=mlen, device=h.device,
        )
        h = self.dropout(h)
        g = None
        if target_mapping is not None:
            g = self.dropout(self.mask_emb.expand(B, target_mapping.shape[1], -1))  # (B, P, H)
        eager = output_attentions or cfg._attn_implementation not in ("sdpa",)
        new_mems, hidden_states, attentions = [], [], []
        for i, layer in enumerate(self.layer):
            mem = None if mems is None else mems[i]
            if use_mems:
                new_mems.append(self.cache_mem(h, mem))
            if output_hidden_states:
                hidden_states += [h] if g is None else [h, g]
            h, g, probs = layer(h, g, mem, ai, biases=self.layer_biases(layer), eager=eager)
            if output_attentions:
                attentions.append(probs[0] if g is None else probs)
        if output_hidden_states:
            hidden_states += [h] if g is None else [h, g]
        output = self.dropout(h if g is None else g)  # (B, T or P, H)
        out = XLNetLiteModelOutput(
            last_hidden_state=output,
            mems=new_mems if use_mems else None,
            hidden_states=tuple(hidden_states) if output_hidden_states else None,
            attentions=tuple(attentions) if output_attentions else None,
        )
        return out if return_dict else out.to_tuple()


def _padding_or_none(pad_mask):
    """The (B, T) padding mask, or None when it marks no padding (then nothing needs masking)."""
    return None if pad_mask is None or not bool(pad_mask.any()) else pad_mask


class XLNetLiteLMHeadModel(XLNetLitePreTrainedModel):
    """Permutation-LM head: logits for the P predicted tokens (target_mapping), tied to the word embeddings."""

    _tied_weights_keys = {"lm_loss.weight": "transformer.word_embedding.weight"}

    def __init__(self, config: XLNetLiteConfig):
        super().__init__(config)
        self.transformer = XLNetLiteModel(config)
        self.lm_loss = nn.Linear(config.d_model, config.vocab_size, bias=True)
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_loss

    def set_output_embeddings(self, new_embeddings):
        self.lm_loss = new_embeddings

    def forward(self, input_ids=None, attention_mask=None, mems=None, perm_mask=None, target_mapping=None,
                token_type_ids=None, input_mask=None, inputs_embeds=None, labels=None, use_mems=None,
                output_attentions=None, output_hidden_states=None, return_dict=None, **kwargs):
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        out = self.transformer(
            input_ids, attention_mask=attention_mask, mems=mems, perm_mask=perm_mask, target_mapping=target_mapping,
            token_type_ids=token_type_ids, input_mask=input_mask, inputs_embeds=inputs_embeds, use_mems=use_mems,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states, return_dict=True,
        )
        logits = self.lm_loss(out.last_hidden_state)  # (B, P or T, V)
        loss = None
        if labels is not None:
            check_lm_labels(labels, tuple(logits.shape[:2]), self.config.vocab_size, target_mapping is not None)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100)
        result = XLNetLiteLMHeadModelOutput(
            loss=loss, logits=logits, mems=out.mems, hidden_states=out.hidden_states, attentions=out.attentions
        )
        return result if return_dict else result.to_tuple()


def check_lm_labels(labels, shape, vocab_size, partial):
    if tuple(labels.shape) != shape:
        raise ValueError(f"labels must have shape (B, {'P' if partial else 'T'}) = {shape}, got {tuple(labels.shape)}")
    if labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise ValueError(f"labels must be integer token ids, got {labels.dtype}")
    if labels.numel() and not torch.compiler.is_compiling():
        bad = (labels != -100) & ((labels < 0) | (labels >= vocab_size))
        if bool(bad.any()):
            raise ValueError(f"labels must be token ids in [0, vocab_size={vocab_size}) or -100 (ignored), "
                             f"got {labels[bad][0].item()}")


class XLNetLiteSequenceSummary(nn.Module):
    """Pool one vector per sequence (the last token, XLNet's <cls>, by default), project, activate."""

    def __init__(self, config):
        super().__init__()
        self.summary_type = config.summary_type
        self.summary = nn.Linear(config.d_model, config.d_model) if config.summary_use_proj else nn.Identity()
        act = config.summary_activation
        self.activation = get_activation(act) if act else nn.Identity()
        self.last_dropout = Dropout(config.summary_last_dropout)

    def forward(self, hidden_states, cls_index=None):
        if self.summary_type == "last":
            x = hidden_states[:, -1]
        elif self.summary_type == "first":
            x = hidden_states[:, 0]
        elif self.summary_type == "mean":
            x = hidden_states.mean(dim=1)
        else:  # cls_index
            if cls_index is None:
                cls_index = torch.full(hidden_states.shape[:1], hidden_states.shape[1] - 1, device=hidden_states.device)
            x = hidden_states[torch.arange(hidden_states.shape[0], device=hidden_states.device), cls_index]
        return self.last_dropout(self.activation(self.summary(x)))


class XLNetLiteForSequenceClassification(XLNetLitePreTrainedModel):
    """Classification / regression from the last position (the <cls> token; pad on the left)."""

    def __init__(self, config: XLNetLiteConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.transformer = XLNetLiteModel(config)
        self.sequence_summary = XLNetLiteSequenceSummary(config)
        self.logits_proj = nn.Linear(config.d_model, config.num_labels)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, mems=None, perm_mask=None, target_mapping=None,
                token_type_ids=None, input_mask=None, inputs_embeds=None, labels=None, use_mems=None,
                output_attentions=None, output_hidden_states=None, return_dict=None, **kwargs):
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        if self.config.summary_type == "last":
            check_left_padding(attention_mask, input_mask)
        out = self.transformer(
            input_ids, attention_mask=attention_mask, mems=mems, perm_mask=perm_mask, target_mapping=target_mapping,
            token_type_ids=token_type_ids, input_mask=input_mask, inputs_embeds=inputs_embeds, use_mems=use_mems,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states, return_dict=True,
        )
        logits = self.logits_proj(self.sequence_summary(out.last_hidden_state))  # (B, num_labels)
        loss = None if labels is None else self.classification_loss(logits, labels)
        result = XLNetLiteForSequenceClassificationOutput(
            loss=loss, logits=logits, mems=out.mems, hidden_states=out.hidden_states, attentions=out.attentions
        )
        return result if return_dict else result.to_tuple()

    def classification_loss(self, logits, labels):
        cfg = self.config
        if cfg.problem_type is None:
            if self.num_labels == 1:
                cfg.problem_type = "regression"
            elif labels.dtype in (torch.long, torch.int):
                cfg.problem_type = "single_label_classification"
            else:
                cfg.problem_type = "multi_label_classification"
        if cfg.problem_type == "regression":
            if self.num_labels == 1:
                return F.mse_loss(logits.squeeze(-1).float(), labels.float().view(-1))
            return F.mse_loss(logits.float(), labels.float())
        if cfg.problem_type == "single_label_classification":
            labels = labels.view(-1)
            if labels.numel() != logits.shape[0]:
                raise ValueError(f"labels must have shape (B,) = ({logits.shape[0]},), got {tuple(labels.shape)}")
            return F.cross_entropy(logits.float(), labels)
        return F.binary_cross_entropy_with_logits(logits.float(), labels.float())


def check_left_padding(attention_mask, input_mask):
    """XLNet classifies from the last position: right padding would pool a pad token."""
    pad = None
    if attention_mask is not None:
        pad = attention_mask[:, -1] == 0
    elif input_mask is not None:
        pad = input_mask[:, -1] > 0
    if pad is not None and bool(pad.any()):
        raise ValueError(
            "attention_mask has padding at the last position, but XLNet classifies from the last token (<cls>): "
            "pad on the left (tokenizer.padding_side = 'left')"
        )


__all__ = [
    "XLNetLitePreTrainedModel",
    "XLNetLiteModel",
    "XLNetLiteLMHeadModel",
    "XLNetLiteForSequenceClassification",
]
