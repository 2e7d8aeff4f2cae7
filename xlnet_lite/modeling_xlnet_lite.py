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

Models: the base model, the LM head (with generate()), sequence classification, token classification, multiple
choice (C choices), question answering (simple, and XLNet's SQuAD 2.0 head with its beam search): transformers'
seven XLNet classes. Every forward takes transformers' XLNet arguments by name (no **kwargs: an unknown keyword is
a TypeError), plus the Trainer's num_items_in_batch where there is a loss.

generate() (XLNetLiteLMHeadModel.prepare_inputs_for_generation): the next token is read by a query-stream row at
position T (`predict_next`); the memory is an XLNetLiteCache of projected keys and values, so a step feeds two
tokens and attends over the cache instead of re-projecting it.
"""

from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable
from transformers import GenerationMixin, PreTrainedModel
from transformers.activations import ACT2FN, get_activation
from transformers.generation.utils import ALL_CACHE_NAMES
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.utils import ModelOutput

from .configuration_xlnet_lite import XLNetLiteConfig

# ----------------------------------------------------------------------------------------------------------
# Outputs

# The name generate() gives the cache, in the outputs it reads and the inputs it passes: `cache` from transformers
# 5.24, `past_key_values` before. The outputs carry it under that name; forward() takes either.
CACHE_NAME = "cache" if "cache" in ALL_CACHE_NAMES else "past_key_values"


def either_cache(cache, past_key_values):
    """The generation cache passed under either name (`past_key_values` before transformers 5.24); not both."""
    if past_key_values is None:
        return cache
    if cache is not None:
        raise ValueError("Pass the generation cache as cache or as past_key_values, not both")
    return past_key_values


def with_cache_field(cls):
    """Adds the generation cache as the output's last field, named CACHE_NAME (apply below @dataclass)."""
    cls.__annotations__[CACHE_NAME] = "XLNetLiteCache | None"
    setattr(cls, CACHE_NAME, None)
    return cls


@dataclass
@with_cache_field
class XLNetLiteModelOutput(ModelOutput):
    """`last_hidden_state` is (B, P, H) with a target_mapping (query stream), else (B, T, H)."""

    last_hidden_state: torch.Tensor | None = None
    mems: list[torch.Tensor] | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple | None = None


@dataclass
@with_cache_field
class XLNetLiteLMHeadModelOutput(ModelOutput):
    """The generation cache (use_cache=True; `cache` or `past_key_values`, see CACHE_NAME) comes last so that the
    other fields keep transformers' XLNet tuple positions."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    mems: list[torch.Tensor] | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple | None = None


@dataclass
class XLNetLiteForSequenceClassificationOutput(ModelOutput):
    """logits: (B, num_labels). The token-classification and multiple-choice outputs have the same fields."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    mems: list[torch.Tensor] | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple | None = None


@dataclass
class XLNetLiteForTokenClassificationOutput(XLNetLiteForSequenceClassificationOutput):
    """logits: (B, T, num_labels), or (B, P, num_labels) with a target_mapping."""


@dataclass
class XLNetLiteForMultipleChoiceOutput(XLNetLiteForSequenceClassificationOutput):
    """logits: (B, C), one score per choice; mems, hidden states and attentions have B * C rows."""


@dataclass
class XLNetLiteForQuestionAnsweringSimpleOutput(ModelOutput):
    """start_logits, end_logits: (B, T)."""

    loss: torch.Tensor | None = None
    start_logits: torch.Tensor | None = None
    end_logits: torch.Tensor | None = None
    mems: list[torch.Tensor] | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple | None = None


@dataclass
class XLNetLiteForQuestionAnsweringOutput(ModelOutput):
    """Training (start and end positions given): loss only. Inference: the beam over S = start_n_top starts and
    E = end_n_top ends per start. As in transformers' XLNet, the "log_probs" are softmax probabilities:
    start_top_log_probs / start_top_index (B, S); end_top_log_probs / end_top_index (B, E * S), entry e * S + s
    being the e-th best end for the s-th start; cls_logits (B,), the answer-class (is_impossible) logit."""

    loss: torch.Tensor | None = None
    start_top_log_probs: torch.Tensor | None = None
    start_top_index: torch.Tensor | None = None
    end_top_log_probs: torch.Tensor | None = None
    end_top_index: torch.Tensor | None = None
    cls_logits: torch.Tensor | None = None
    mems: list[torch.Tensor] | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple | None = None


# ----------------------------------------------------------------------------------------------------------
# Masks and relative positions: built once per forward, shared by every layer


@dataclass
class AttentionInputs:
    """Everything a layer's attention needs besides the hidden states; built once per forward."""

    pos_emb: torch.Tensor | None  # (1 or 2, R, H) sinusoid of relative distance (2 with bi_data); None = from the cache
    num_positions: int  # R: K + T for "bi", K + 1 for "uni"
    blocked_h: torch.Tensor | None  # (B or 1, 1, T, K) bool, True = may not attend (content stream); None = none
    blocked_g: torch.Tensor | None  # (B, 1, P, K) bool, the predicted tokens' rows (query stream)
    no_key_g: torch.Tensor | None  # (B, 1, P, 1) bool, query rows that may see no key at all; None = there are none
    seg_query_h: torch.Tensor | None  # (B, T) long segment ids of the content-stream queries; None = no segments
    seg_query_g: torch.Tensor | None  # (B, P) long segment ids of the predicted tokens
    seg_keys: torch.Tensor | None  # (B, K) long segment ids of the keys, memory as segment 0
    seg_classes: int  # one-hot width: max segment id + 1 (+ zero dims on CUDA); 0 = the segment term as a bias
    query_pos: torch.Tensor | None  # (B, P) long, position of each predicted token
    query_valid: torch.Tensor | None  # (B, P, 1) bool, False for all-zero target_mapping rows; None = all valid
    fused_query: bool = False  # predict_next: one query row at position T; blocked_h then has T + 1 rows (query last)
    no_key_fused: torch.Tensor | None = None  # (B or 1, 1, T + 1, 1) bool, the fused rows that may see no key
    forms_h: "KernelForms | None" = None  # for the Triton kernels: what the content stream's mask and ids allow
    forms_g: "KernelForms | None" = None  # and the query stream's


def segment_dims(seg_keys, d_head, pad=None):
    """The width C of the one-hot segment dims appended to q and k: one per segment id (max id + 1), and with `pad`
    (default: on CUDA) zero dims more until D + C is a multiple of 8. SDPA's fused kernels (memory-efficient, cuDNN)
    take only such head sizes and otherwise fall back to the math kernel (when D itself is a multiple of 8, as in
    every XLNet, the values' head size is one too). A zero dim adds nothing to a score."""
    classes = int(seg_keys.max()) + 1
    if pad is None:
        pad = seg_keys.is_cuda
    return classes + (-(d_head + classes) % 8 if pad else 0)


def blocked_positions(*, perm_mask, pad_mask, attn_type, same_length, qlen, mlen, device, mem_pad=None):
    """The one place where public masks become the internal "may NOT attend" mask (True = blocked).

    Returns (B or 1, T, K) bool or None when nothing is blocked. pad_mask: (B, T) bool, True = padding.
    mem_pad: (B, M) bool, padding inside the memory (generate()'s cache of a left-padded prompt); otherwise
    the memory is always visible.
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
    if data is None and mem_pad is not None:
        data = torch.zeros(mem_pad.shape[0], 1, qlen, dtype=torch.bool, device=device)  # (B, 1, T)
    if data is not None:
        if mem_pad is None:
            data = F.pad(data, (mlen, 0), value=False)  # (B, T or 1, K): memory always visible
        else:
            data = torch.cat([mem_pad[:, None].expand(-1, data.shape[1], -1), data], dim=-1)  # (B, T or 1, K)
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


NO_DIAGONAL = -(2**30)  # MaskRanks.diagonal when no key is re-opened


class MaskRanks(NamedTuple):
    """A mask of the form blocked[i, j] = key_rank[j] <= row_rank[i], except key i + diagonal (the content stream's
    own position, which it always sees; NO_DIAGONAL for none): ranks (B or 1, Q + K) int32, the Q rows' ranks then
    the K keys'. XLNet's factorization masks have this form (a key is hidden from the rows that come no later in the
    factorization order), and so do padding and memory added to them."""

    ranks: torch.Tensor
    diagonal: int = NO_DIAGONAL


def mask_ranks(blocked):
    """blocked (B or 1, Q, K) bool as row and key ranks (B or 1, Q + K) int32 such that blocked[i, j] exactly when
    key_rank[j] <= row_rank[i], or None where no such ranks exist. They exist when each row's blocked keys contain
    or are contained in every other row's (the rows nested, as a factorization order's are): then row i blocks the
    row_rank[i] = (keys it blocks) keys that most rows block, and key_rank[j] counts the keys blocked by at least as
    many rows as j. The ranks are checked against the mask, so any mask gets either exact ranks or None."""
    ranks, exact = ranks_and_check(blocked)
    return MaskRanks(ranks) if exact.item() else None


def ranks_and_check(blocked):
    """mask_ranks' candidate ranks (B or 1, Q + K) int32 and whether they reproduce the mask (a bool on the mask's
    device: no sync)."""
    blocked = blocked.bool()
    K = blocked.shape[-1]
    row_rank = blocked.sum(-1, dtype=torch.int32)  # (B, Q)
    rows_blocking = blocked.sum(-2, dtype=torch.int32)  # (B, K)
    ascending = rows_blocking.sort(-1).values
    key_rank = K - torch.searchsorted(ascending, rows_blocking, side="left").to(torch.int32)  # (B, K)
    exact = torch.eq(key_rank[:, None, :] <= row_rank[:, :, None], blocked).all()
    return torch.cat([row_rank, key_rank], dim=-1), exact


def sinusoid(pos_seq, d_model):
    """(R,) float positions -> (R, H) [sin | cos] embedding, as in Transformer-XL."""
    freq_seq = torch.arange(0, d_model, 2, device=pos_seq.device).float()
    inv_freq = 1 / torch.pow(10000, freq_seq / d_model)  # (H/2,)
    angles = pos_seq[:, None] * inv_freq[None]  # (R, H/2)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)  # (R, H)


def relative_position_embedding(config, *, qlen, klen, device):
    """(1, R, H), or (2, R, H) with bi_data: forward positions for the batch's first half, backward for its second."""
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
    if query_pos is None:  # content stream: a view, no copy (see shifted_rows)
        if x.stride(3) != 1 or x.stride(2) != R:
            x = x.contiguous()
        return shifted_rows(x.flatten(2), qlen=qlen, klen=klen, rows=Q, R=R)
    index = (qlen - query_pos)[:, None, :, None] + torch.arange(klen, device=x.device)  # (B, 1, P, K)
    index = index.clamp_(max=R - 1).expand(B, N, -1, -1)  # (B, N, P, K)
    return x.gather(3, index)


def shifted_rows(flat, *, qlen, klen, rows, R):
    """The content stream's relative shift as a view: flat (..., rows * R) holds each row's R scores contiguous;
    row i of the result starts qlen - i columns into row i, i.e. at flat offset qlen + i * (R - 1): rows of R - 1
    from offset qlen. rows may be T + 1 (predict_next's query row at position T continues the content rows).
    Returns (..., rows, klen)."""
    return flat[..., qlen : qlen + rows * (R - 1)].unflatten(-1, (rows, R - 1))[..., :klen]


class _ShiftedPositionalScores(torch.autograd.Function):
    """The content stream's positional term rel_shift(q @ kr) for a kr shared by the batch, with a backward that
    writes the shifted gradient straight into the matmul's layout: one buffer, one strided copy and the rest zeroed,
    where autograd's would take two slice_backwards and a transpose copy. q (B, N, Q, D), kr (N, D, R) ->
    (B, N, Q, K). Under autocast the matmuls run in its dtype, as the composite would."""

    @staticmethod
    def forward(ctx, q, kr, qlen, klen):
        B, N, Q, D = q.shape
        R = kr.shape[-1]
        dtype = torch.promote_types(q.dtype, kr.dtype)
        if torch.is_autocast_enabled(q.device.type):
            dtype = torch.get_autocast_dtype(q.device.type)
        a = q.transpose(0, 1).reshape(N, B * Q, D).to(dtype)  # (N, B * Q, D): the batch folds into the rows
        kr_mm = kr.to(dtype)
        full = torch.bmm(a, kr_mm)  # (N, B * Q, R)
        ctx.save_for_backward(a, kr_mm)
        ctx.dims = (B, N, Q, R, qlen, klen, q.dtype, kr.dtype)
        return shifted_rows(full.view(N, B, Q * R), qlen=qlen, klen=klen, rows=Q, R=R).transpose(0, 1)

    @staticmethod
    def backward(ctx, grad):
        a, kr = ctx.saved_tensors
        B, N, Q, R, qlen, klen, q_dtype, kr_dtype = ctx.dims
        full = torch.empty(N, B, Q * R, dtype=a.dtype, device=a.device)
        shifted = full[..., qlen : qlen + Q * (R - 1)].unflatten(-1, (Q, R - 1))  # as shifted_rows, (N, B, Q, R - 1)
        shifted[..., :klen].copy_(grad.transpose(0, 1))
        shifted[..., klen:].zero_()  # distances no key reads: R - K of a row's R (T / (M + 2T) with attn_type bi)
        full[..., :qlen].zero_()
        full[..., qlen + Q * (R - 1) :].zero_()  # Q - qlen entries
        full = full.view(N, B * Q, R)
        grad_q = grad_kr = None
        if ctx.needs_input_grad[0]:
            grad_q = (full @ kr.transpose(1, 2)).view(N, B, Q, -1).transpose(0, 1).to(q_dtype)  # (B, N, Q, D)
        if ctx.needs_input_grad[1]:
            grad_kr = (a.transpose(1, 2) @ full).to(kr_dtype)  # (N, D, R)
        return grad_q, grad_kr, None, None


class _FillBlocked(torch.autograd.Function):
    """score.masked_fill(blocked, finfo.min) (in place on a score of its own) whose backward passes the gradient
    through unmasked. The softmax that follows (the explicit kernel's, or SDPA's with the result as its additive
    bias) gives a blocked score's gradient as prob * (...) with prob exactly 0 (exp of finfo.min below the row's
    maximum); a row that may see no key is zeroed after attention (`no_key`), so its gradient is 0 as well. Masking
    the gradient again would be a wasted pass over (B, N, Q, K): on an H200 at `base` the SDPA bias's took 18.7 of the
    318 ms of GPU time of two eager steps (benchmarks/results/gpu/h200_profile_base_lite_sdpa_bf16.txt)."""

    @staticmethod
    def forward(ctx, score, blocked, inplace):
        if not inplace:  # one pass (an out-of-place masked_fill is a copy, then the fill), contiguous as its copy
            lowest = torch.full((), torch.finfo(score.dtype).min, dtype=score.dtype, device=score.device)
            return torch.where(
                blocked, lowest, score, out=torch.empty_like(score, memory_format=torch.contiguous_format)
            )
        ctx.mark_dirty(score)
        return score.masked_fill_(blocked, torch.finfo(score.dtype).min)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


def fill_blocked(score, blocked, *, inplace=True):
    """The masking of the explicit kernel's scores (in place) and of SDPA's bias (a new tensor: the positional term
    may be a view of a larger product); under torch.compile the plain masked_fill, which the compiler fuses anyway."""
    if torch.compiler.is_compiling():
        return score.masked_fill(blocked, torch.finfo(score.dtype).min)
    return _FillBlocked.apply(score, blocked, inplace)


# ----------------------------------------------------------------------------------------------------------
# Dropout with a cheap mask


class _DropAndScale(torch.autograd.Function):
    """y = 0 where dropped, x / (1 - p) elsewhere; saves only the boolean mask for backward."""

    @staticmethod
    def forward(ctx, x, drop, scale):
        ctx.save_for_backward(drop)
        ctx.scale = scale
        return x.mul(scale).masked_fill_(drop, 0.0)  # two passes (an out-of-place masked_fill would copy first)

    @staticmethod
    def backward(ctx, grad):
        (drop,) = ctx.saved_tensors
        return grad.mul(ctx.scale).masked_fill_(drop, 0.0), None, None


# The devices where Dropout draws its mask from random integers; elsewhere it is F.dropout: on a GPU one fused kernel
# draws the mask, scales and saves it (native_dropout), where the integers' way takes five, and two for the gradient
CHEAP_MASK_DEVICES = {"cpu"}


class Dropout(nn.Module):
    """Inverted dropout whose mask comes from 15-bit random integers on a CPU (p rounded to a multiple of 1/32768).

    Same distribution as nn.Dropout to within 2e-5 in p, but drawing the mask with `random_` on int32 and using both
    16-bit halves is 3-4x cheaper on CPU than `bernoulli_`, which is a fifth of a CPU training step otherwise.
    On other devices (CHEAP_MASK_DEVICES), and under torch.compile, it is F.dropout (compiled: its mask generated
    fused into the kernels around it).
    """

    def __init__(self, p):
        super().__init__()
        self.p = float(p)

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        if torch.compiler.is_compiling() or x.device.type not in CHEAP_MASK_DEVICES:
            return F.dropout(x, self.p, training=True)
        n = x.numel()
        bits = torch.empty((n + 1) // 2, dtype=torch.int32, device=x.device).random_()  # 31 random bits each
        bits = bits.view(torch.int16)[:n].view(x.shape) & 0x7FFF  # 15 uniform bits per element
        drop = bits < round(self.p * 32768)
        return _DropAndScale.apply(x, drop, 1.0 / (1.0 - self.p))

    def extra_repr(self):
        return f"p={self.p}"


# ----------------------------------------------------------------------------------------------------------
# Layers


def matmul_operand(x):
    """x as autocast would hand it to a matmul (its lower-precision dtype for an fp32 tensor; x itself otherwise).
    A tensor several matmuls read (a layer's input: queries, keys, values) is cast once, not once per matmul, and
    its gradient is cast back once."""
    device = x.device.type
    if x.dtype == torch.float32 and torch.is_autocast_enabled(device):
        return x.to(torch.get_autocast_dtype(device))
    return x


def biased(q, bias):
    """q + a per-head bias, the bias in q's dtype: under autocast q is bf16 and an fp32 bias would promote the sums
    to fp32. q (B, N, Q, D), bias (N, D)."""
    return q + bias.to(q.dtype)[:, None]


class XLNetLiteRelativeAttention(nn.Module):
    """Relative multi-head attention; one core serves the content stream and the query stream."""

    def __init__(self, config, layer_idx=0):
        super().__init__()
        H, N, D = config.d_model, config.n_head, config.d_head
        self.n_head, self.d_head, self.scale = N, D, 1 / D**0.5
        self.layer_idx = layer_idx  # which layer of a generation cache is this one's
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

    def positional_keys(self, pos_emb):
        """(1 or 2, R, H) sinusoids -> (1 or 2, N, D, R) projected positional keys."""
        return self.project(pos_emb, self.r).permute(0, 2, 3, 1)

    def keys(self, x, attention_inputs, *, cache):
        """Keys and values of one layer, shared by both streams.

        x: the layer's input as the matmuls read it (matmul_operand): (B, K, H) memory and current segment, or
        with a generation cache only the current segment's (B, T, H), the memory's keys and values having been
        projected when they were written. Returns k (B, N, K, D + C) with the C one-hot segment dims of the keys
        appended (C = 0 without segments), v (B, N, K, D) and the transposed positional keys kr (B or 1, N, D, R).
        """
        if cache is None:
            k = self.project(x, self.k).transpose(1, 2)  # (B, N, K, D)
            v = self.project(x, self.v).transpose(1, 2)  # (B, N, K, D)
            kr = self.positional_keys(attention_inputs.pos_emb)  # (1 or 2, N, D, R)
        else:
            k_new = self.project(x, self.k).transpose(1, 2)  # (B, N, T, D)
            k, v = cache.update(self.layer_idx, k_new, self.project(x, self.v).transpose(1, 2))  # (B, N, K, D)
            kr = cache.relative_keys(self.layer_idx, klen=k.shape[2], num_positions=attention_inputs.num_positions)
        if kr.shape[0] == 2:  # bi_data: first half forward, second half backward positions
            kr = kr.repeat_interleave(x.shape[0] // 2, dim=0)  # (B, N, D, R)
        if attention_inputs.seg_classes:
            same_k = (
                F.one_hot(attention_inputs.seg_keys, attention_inputs.seg_classes)
                .to(k.dtype)[:, None]
                .expand(-1, k.shape[1], -1, -1)
            )
            k = torch.cat([k, same_k], dim=-1)  # (B, N, K, D + C)
        return k, v, kr

    def attend(
        self, q, keys, *, biases, seg_q, seg_classes, seg_keys, blocked, no_key, query_pos, qlen, kernel, forms=None
    ):
        """Core: softmax over keys of [(q+u)k + shift((q+v)R) + (q+b)s] / sqrt(D), masked.

        q (B, Q, N, D) with Q = T (content stream) or P (query stream, rows at query_pos). The segment term
        (q+b)s_same/diff is computed exactly as extra dims of the q.k product: with same_ij = onehot(seg_i) .
        onehot(seg_j), (q+b)s = (q+b)s_diff + [(q+b)(s_same - s_diff)] same_ij, and the first part is the same for
        every key of a row, so softmax drops it. Under torch.compile (seg_classes 0: counting the segment ids would
        read the data) the same term is added to the positional scores as a (B, N, Q, K) bias instead. Returns
        (B, Q, N*D) and the probabilities (explicit path only). A query that may see no key attends to nothing.
        kernel: "eager" (explicit), "sdpa", "flex_attention" (flex_attend: the positional term added inside the
        kernel; the segment term and the masks read there, never written as (B, N, Q, K) tensors) or
        TRITON_ATTENTION (triton_attend: the content stream's positional term computed inside fused kernels too).
        """
        k, v, kr = keys
        u, v_bias, b = biases
        q = q.transpose(1, 2)  # (B, N, Q, D)
        if kernel == "flex_attention":
            return flex_attend(
                self,
                q,
                keys,
                biases=biases,
                seg_q=seg_q,
                seg_keys=seg_keys,
                blocked=blocked,
                query_pos=query_pos,
                qlen=qlen,
            ), None
        if kernel == TRITON_ATTENTION:
            return triton_attend(
                self,
                q,
                keys,
                biases=biases,
                seg_q=seg_q,
                seg_keys=seg_keys,
                blocked=blocked,
                query_pos=query_pos,
                qlen=qlen,
                forms=forms,
            ), None
        pos = positional_term(
            biased(q, v_bias) * self.scale, kr, qlen=qlen, klen=k.shape[2], query_pos=query_pos
        )  # (B, N, Q, K)
        q_aug = biased(q, u)
        if seg_q is not None:
            gain = segment_gain(self, q, b)[..., None]  # (B, N, Q, 1): what a same-segment key adds
            if seg_classes:
                same_q = F.one_hot(seg_q, seg_classes).to(q.dtype)[:, None]  # (B, 1, Q, C)
                q_aug = torch.cat([q_aug, gain * same_q], dim=-1)  # (B, N, Q, D + C)
            else:
                same = (seg_q[:, :, None] == seg_keys[:, None, :])[:, None]  # (B, 1, Q, K)
                pos = pos + (gain * self.scale) * same.to(q.dtype)  # (B, N, Q, K)
        if kernel == "eager":
            score = (q_aug * self.scale) @ k.transpose(-1, -2) + pos  # (B, N, Q, K)
            if blocked is not None:
                score = fill_blocked(score, blocked)
            prob = score.softmax(-1)
            if no_key is not None:
                prob = prob.masked_fill(no_key, 0.0)
            out = self.dropout(prob) @ v  # (B, N, Q, D)
        else:
            if no_key is not None:  # such rows see every key, then are zeroed: no backend meets a row all finfo.min
                blocked = blocked & ~no_key
            bias = pos if blocked is None else fill_blocked(pos, blocked, inplace=False)
            p = self.dropout.p if self.training else 0.0
            out = F.scaled_dot_product_attention(q_aug, k, v, attn_mask=bias, dropout_p=p, scale=self.scale)
            if no_key is not None:
                out = out.masked_fill(no_key, 0.0)
            prob = None
        return out.transpose(1, 2).flatten(2), prob  # (B, Q, N*D)

    def post_attention(self, x, attn_vec):
        """Output projection, dropout, residual, LayerNorm. attn_vec (B, Q, N*D) -> (B, Q, H)."""
        out = attn_vec @ self.o.flatten(1).t()  # (B, Q, H)
        return self.layer_norm(self.dropout(out) + x)

    def forward(self, h, g, mem, attention_inputs, *, biases, kernel, cache=None, content=True, rows=None):
        """h (B, T, H), g (B, P, H) or None, mem (B, M, H) or None (or the generation cache instead).
        Returns h, g, (prob_h, prob_g); with content=False the content stream is skipped (h returned unchanged),
        for the last layer of a model whose output is the query stream. rows (a slice of positions): the content
        stream's queries at those positions only, every position still a key; h comes back (B, len(rows), H)."""
        T = h.shape[1]
        x = matmul_operand(h if mem is None or cache is not None else torch.cat([mem, h], dim=1))  # (B, K or T, H)
        keys = self.keys(x, attention_inputs, cache=cache)
        core = dict(
            biases=biases,
            seg_classes=attention_inputs.seg_classes,
            seg_keys=attention_inputs.seg_keys,
            qlen=T,
            kernel=kernel,
        )
        if attention_inputs.fused_query and content:
            return self.fused_streams(h, g, keys, attention_inputs, core)
        out_h, prob_h = h, None
        if content:
            current = x if x.shape[1] == T else x.split([x.shape[1] - T, T], dim=1)[1]  # the current segment's
            seg_q, blocked, query_pos = attention_inputs.seg_query_h, attention_inputs.blocked_h, None
            forms = attention_inputs.forms_h
            if rows is not None:  # a few positions' queries, each at its own relative offset (as the query stream)
                h, current = h[:, rows], current[:, rows]  # (B, Q, H)
                query_pos = torch.arange(T, device=h.device)[rows].expand(h.shape[0], -1)  # (B, Q)
                seg_q = None if seg_q is None else seg_q[:, rows]
                blocked = None if blocked is None else blocked[:, :, rows]
                forms = None if forms is None else forms._replace(ranks=None)  # the ranks are all rows'
            vec_h, prob_h = self.attend(
                self.project(current, self.q),
                keys,
                seg_q=seg_q,
                blocked=blocked,
                no_key=None,
                query_pos=query_pos,
                forms=forms,
                **core,
            )
            out_h = self.post_attention(h, vec_h)
        if g is None:
            return out_h, None, (prob_h,)
        vec_g, prob_g = self.attend(
            self.project(g, self.q),
            keys,
            seg_q=attention_inputs.seg_query_g,
            blocked=attention_inputs.blocked_g,
            no_key=attention_inputs.no_key_g,
            query_pos=attention_inputs.query_pos,
            forms=attention_inputs.forms_g,
            **core,
        )
        if attention_inputs.query_valid is not None:  # all-zero target_mapping rows get no attention output
            vec_g = vec_g * attention_inputs.query_valid
        return out_h, self.post_attention(g, vec_g), (prob_h, prob_g)

    def fused_streams(self, h, g, keys, attention_inputs, core):
        """predict_next: the query row sits at position T, right after the T content rows, so both streams run as
        one attention over T + 1 rows in the content stream's relative layout, their masks stacked."""
        T = h.shape[1]
        hg = torch.cat([h, g], dim=1)  # (B, T + 1, H)
        vec, prob = self.attend(
            self.project(hg, self.q),
            keys,
            seg_q=None,
            blocked=attention_inputs.blocked_h,
            no_key=attention_inputs.no_key_fused,
            query_pos=None,
            forms=attention_inputs.forms_h,
            **core,
        )
        out = self.post_attention(hg, vec)  # (B, T + 1, H)
        probs = (None, None) if prob is None else (prob[:, :, :T], prob[:, :, T:])
        out_h, out_g = out.split([T, out.shape[1] - T], dim=1)  # split, not slices: one backward pass (a cat)
        return out_h, out_g, probs


def positional_term(q, kr, *, qlen, klen, query_pos):
    """(q + v) R / sqrt(D) over keys: q (B, N, Q, D) already biased and scaled, kr (B or 1, N, D, R) -> (B, N, Q, K)."""
    if query_pos is None and kr.shape[0] == 1 and q.shape[0] > 1 and not torch.compiler.is_compiling():
        return _ShiftedPositionalScores.apply(q, kr[0], qlen, klen)
    return rel_shift(positional_scores(q, kr), qlen=qlen, klen=klen, query_pos=query_pos)


def positional_scores(q, kr):
    """q (B, N, Q, D) @ kr (B or 1, N, D, R) -> (B, N, Q, R). A kr shared by the batch is not copied B times (as a
    broadcast matmul would): the batch folds into the rows of one (N, B * Q, D) @ (N, D, R) product."""
    if kr.shape[0] != 1 or q.shape[0] == 1:
        return q @ kr
    B, N, Q, D = q.shape
    out = q.transpose(0, 1).reshape(N, B * Q, D) @ kr[0]  # (N, B * Q, R)
    return out.view(N, B, Q, kr.shape[-1]).transpose(0, 1)  # (B, N, Q, R), rows contiguous


_compiled_flex_attention = None


def flex_attention_kernel(device):
    """torch's flex_attention compiled on CUDA (uncompiled it runs a slow reference that writes every score), one
    compiled kernel per shape: made for training at fixed shapes (the pretraining recipe's); past torch's recompile
    limit (8 shapes, e.g. generate()'s growing keys) torch runs the reference. Inside a graph torch.compile is already
    tracing, and on the CPU (forward under torch.no_grad() only: no CPU flex backward), the plain function."""
    global _compiled_flex_attention
    from torch.nn.attention.flex_attention import flex_attention

    if device.type != "cuda" or torch.compiler.is_compiling():
        return flex_attention
    if _compiled_flex_attention is None:
        _compiled_flex_attention = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex_attention


def flex_attend(attn, q, keys, *, biases, seg_q, seg_keys, blocked, query_pos, qlen):
    """The attention core through flex_attention. The kernel computes (q + u)k / sqrt(D); a score_mod adds the
    positional term, the segment term (q + b)(s_same - s_diff) where query and key share a segment, and -inf where
    the key is blocked, so no (B, N, Q, K) score, probability, segment or mask tensor is written. The positional term
    is positional_term's shifted (B, N, Q, K) scores, the same operand the SDPA kernel's bias starts from (for the
    content stream a strided view of the (B, N, Q, R) product; reading the
    unshifted (B, N, Q, R) scores at rel_shift's index inside the kernel instead measured 2.3x slower forward and
    backward on an H200: a gather per score, and its gradient scattered by atomic adds; see benchmarks/RESULTS.md,
    GPU). A row with every key blocked comes out 0, as the explicit kernel's no_key rows. flex_attention takes no
    dropout on the probabilities: training with dropout raises. q (B, N, Q, D) -> (B, Q, N*D)."""
    if attn.training and attn.dropout.p > 0:
        raise ValueError(
            f"attn_implementation='flex_attention' has no attention dropout: train with dropout 0 (the "
            f"pretraining recipe's default; this model has {attn.dropout.p}) or use 'sdpa'"
        )
    if q.is_cuda and attn.d_head < 16:
        raise ValueError(
            f"attn_implementation='flex_attention' needs a head size of at least 16 on CUDA (its "
            f"kernels' smallest); this model has d_model / n_head = {attn.d_head}: use 'sdpa'"
        )
    if not q.is_cuda and torch.compiler.is_compiling():
        raise ValueError(
            "attn_implementation='flex_attention' under torch.compile needs CUDA: PyTorch's compiled CPU "
            "flex kernels have no backward (and gave wrong outputs on lengths that are not multiples of "
            "128 here); use 'eager' or 'sdpa' on the CPU"
        )
    k, v, kr = keys
    u, v_bias, b = biases
    B, N, Q, _ = q.shape
    if Q == 0:  # no query rows (an empty target_mapping): flex_attention's reference path cannot index them
        return q.new_zeros(B, 0, N * v.shape[-1])
    pos = positional_term(
        biased(q, v_bias) * attn.scale, kr, qlen=qlen, klen=k.shape[2], query_pos=query_pos
    )  # (B, N, Q, K)
    gain = None if seg_q is None else (segment_gain(attn, q, b) * attn.scale).contiguous()  # (B, N, Q)
    if seg_q is not None:
        seg_q, seg_keys = seg_q.contiguous(), seg_keys.contiguous()  # (B, Q), (B, K)
    blocked = None if blocked is None else blocked[:, 0].expand(B, -1, -1)  # (B, Q, K)

    def score_mod(score, bi, h, i, j):
        score = score + pos[bi, h, i, j]
        if gain is not None:
            score = score + torch.where(seg_q[bi, i] == seg_keys[bi, j], gain[bi, h, i], 0.0)
        if blocked is not None:
            score = torch.where(blocked[bi, i, j], -float("inf"), score)
        return score

    q_aug = biased(q, u)
    out = flex_attention_kernel(q.device)(q_aug, k, v, score_mod=score_mod, scale=attn.scale)  # (B, N, Q, D)
    return out.transpose(1, 2).flatten(2)


def segment_gain(attn, q, b):
    """(q + b)(s_same - s_diff), before the 1 / sqrt(D): what a key in the query's own segment adds to its score
    (the first part, (q + b)s_diff, is the same for every key of a row). q (B, N, Q, D) -> (B, N, Q)."""
    seg = biased(q, b) @ attn.seg_embed.permute(1, 2, 0)  # (B, N, Q, 2): same, different
    return seg[..., 0] - seg[..., 1]


TRITON_ATTENTION = "xlnet_lite_triton"


def triton_attend(attn, q, keys, *, biases, seg_q, seg_keys, blocked, query_pos, qlen, forms=None):
    """The attention core through xlnet_lite.triton_attention's fused kernels (CUDA; on a CPU only in Triton's
    interpreter). The content stream's positional term is computed inside them from the positional keys, a band per
    tile; the query stream's (its P rows at any positions) goes in as positional_term's (B, N, P, K) scores. The
    segment term, the masks and the dropout on the probabilities (its mask drawn inside by Philox, from a seed taken
    from torch's generator) are applied inside; no (B, N, T, K) score, probability or mask tensor is written, forward
    or backward. forms: KernelForms, what the data allows the kernels, or None. q (B, N, Q, D) -> (B, Q, N*D)."""
    from .triton_attention import relative_attention

    k, v, kr = keys
    u, v_bias, b = biases
    qr = biased(q, v_bias) * attn.scale
    if query_pos is None:  # the content stream: query i at position i, the banded form
        positional = dict(qr=qr, kr=kr)
    else:
        positional = dict(pos=positional_term(qr, kr, qlen=qlen, klen=k.shape[2], query_pos=query_pos))
    out = relative_attention(
        biased(q, u) * attn.scale,
        k,
        v,
        **positional,
        qlen=qlen,
        gain=None if seg_q is None else segment_gain(attn, q, b) * attn.scale,
        seg_q=seg_q,
        seg_k=seg_keys,
        blocked=None if blocked is None else blocked[:, 0],
        forms=forms,
        dropout_p=attn.dropout.p if attn.training else 0.0,
    )  # (B, Q, N, D)
    return out.flatten(2)


class KernelForms(NamedTuple):
    """What one stream's mask and segment ids allow the Triton kernels, found in the data at run time by kernel_forms
    (so that a compiled graph holds no branch on the data). facts (4,) int64 on the CPU: [ranked, diagonal, classes,
    free]: ranked 1, the stream's mask is MaskRanks(ranks, diagonal) (else the kernels read the block); classes, the
    segment ids lie in [0, classes) (0: a negative id, or none); free, every row sees the first `free` keys (a memory:
    the kernels compare nothing in tiles of them). ranks (B or 1, Q + K) int32, or None: the block only."""

    ranks: torch.Tensor | None
    facts: torch.Tensor

    def mask_ranks(self):
        """The mask as MaskRanks, or None where it has no such form."""
        ranked, diagonal, _, _ = self.facts.tolist()
        return MaskRanks(self.ranks, diagonal) if ranked and self.ranks is not None else None


@torch.library.custom_op(
    "xlnet_lite::kernel_forms",
    mutates_args=(),
    schema="(Tensor? blocked, Tensor? query_pos, Tensor? seg_keys, int mlen) -> (Tensor, Tensor, Tensor, Tensor)",
)
def kernel_forms(blocked, query_pos, seg_keys, mlen):
    """Both streams' KernelForms read from the data with one sync: (content stream's ranks, facts, query stream's
    ranks, facts). blocked (B or 1, T, K) or None: what the query stream may not see; the content stream sees that
    and itself (key mlen + i): ranks of its own where its mask has them (a factorization order's does: a key hidden
    from the rows that come before it), else the query stream's with its own key re-opened (one more comparison a
    score in the kernels); and how many leading keys every row sees (all rows: the query stream's rows are some of
    them). query_pos (B, P) or None: the query stream's rows; seg_keys (B, K) or None. A mask absent gives empty ranks
    and no free keys, a query stream absent empty ranks and a fact of no form."""
    device = _forms_device(blocked, query_pos, seg_keys)
    ranks_h, ranks_g = (torch.empty(0, dtype=torch.int32, device=device) for _ in range(2))
    yes = torch.ones((), dtype=torch.long, device=device)
    checks = [0 * yes] * 4
    if blocked is not None:
        ranks, exact = ranks_and_check(blocked)
        T = blocked.shape[1]
        content = content_stream_mask(blocked, qlen=T, mlen=mlen)
        own, own_exact = ranks_and_check(content)
        checks = [exact, own_exact, leading_free_keys(content), leading_free_keys(blocked)]
    ids = torch.aminmax(seg_keys) if seg_keys is not None and seg_keys.numel() else (-yes, -yes)
    found = torch.stack([c.long() for c in (*checks, *ids)]).tolist()  # the one sync
    exact, own_exact, free_h, free_g, lowest, highest = found
    if blocked is not None:
        ranks_h = own if own_exact else ranks
        if query_pos is not None:
            rows, keys = ranks.expand(query_pos.shape[0], -1).split([T, ranks.shape[-1] - T], dim=-1)
            ranks_g = torch.cat([rows.gather(1, query_pos), keys], dim=-1)  # (B, P + K)
    classes = highest + 1 if lowest >= 0 else 0
    facts_h = [1, NO_DIAGONAL, classes, free_h] if own_exact else [exact, mlen, classes, free_h]
    facts_g = [int(bool(exact) and query_pos is not None), NO_DIAGONAL, classes, free_g]
    return ranks_h, torch.tensor(facts_h, device="cpu"), ranks_g, torch.tensor(facts_g, device="cpu")


@kernel_forms.register_fake
def _kernel_forms_shapes(blocked, query_pos, seg_keys, mlen):
    device = _forms_device(blocked, query_pos, seg_keys)
    ranks_h, ranks_g = (torch.empty(0, dtype=torch.int32, device=device) for _ in range(2))
    if blocked is not None:
        rows, T, K = blocked.shape
        ranks_h = blocked.new_empty(rows, T + K, dtype=torch.int32)
        if query_pos is not None:
            ranks_g = blocked.new_empty(query_pos.shape[0], query_pos.shape[1] + K, dtype=torch.int32)
    facts_h, facts_g = (torch.empty(4, dtype=torch.int64, device="cpu") for _ in range(2))
    return ranks_h, facts_h, ranks_g, facts_g


def leading_free_keys(blocked):
    """How many leading keys no row of blocked (B or 1, Q, K) blocks, in every batch row (a device scalar: no sync)."""
    free = (~blocked.any(1)).int().cumprod(-1).sum(-1)  # (B or 1,)
    return free.min() if free.numel() else free.new_zeros(())


def _forms_device(*tensors):
    """kernel_forms' device: its inputs'; it needs one."""
    for t in tensors:
        if t is not None:
            return t.device
    raise ValueError("kernel_forms needs a mask, query rows or segment ids (all three are None)")


def triton_mask_ranks(blocked, *, mlen, query_pos):
    """kernel_forms' masks as MaskRanks: (content stream's, query stream's), each None where it has no such form."""
    ranks_h, facts_h, ranks_g, facts_g = kernel_forms(blocked, query_pos, None, mlen)
    query = None if query_pos is None else KernelForms(ranks_g, facts_g).mask_ranks()
    return KernelForms(ranks_h, facts_h).mask_ranks(), query


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
    def __init__(self, config, layer_idx=0):
        super().__init__()
        self.rel_attn = XLNetLiteRelativeAttention(config, layer_idx)
        self.ff = XLNetLiteFeedForward(config)

    def forward(self, h, g, mem, attention_inputs, *, biases=None, kernel, cache=None, content=True, rows=None):
        """biases: (u, v, b) shared by every layer (untie_r False), or None for this layer's own, read here: a
        parameter read before the layer runs would be what FSDP holds outside its forward, a shard."""
        if biases is None:
            biases = self.rel_attn.r_w_bias, self.rel_attn.r_r_bias, self.rel_attn.r_s_bias
        h, g, probs = self.rel_attn(
            h, g, mem, attention_inputs, biases=biases, kernel=kernel, cache=cache, content=content, rows=rows
        )
        if g is None:
            return self.ff(h), None, probs
        if not content:
            return h, self.ff(g), probs
        both = self.ff(torch.cat([h, g], dim=1))  # (B, T + P, H): the position-wise FF reads its weights once
        out_h, out_g = both.split([h.shape[1], g.shape[1]], dim=1)  # split's backward is one cat, slices' two scatters
        return out_h, out_g, probs


# ----------------------------------------------------------------------------------------------------------
# Generation cache


class XLNetLiteCache:
    """generate()'s cache: the Transformer-XL memory of every layer, kept as projected keys and values.

    XLNet's memory for layer l is that layer's input h at earlier positions, and a query uses it only through
    h @ W_k and h @ W_v. The cache therefore stores those projections, each computed once when its position is
    fed, in (B, N, capacity, D) buffers; the memory is positions [start, end) of them. It also records which
    memory positions are padding (a left-padded prompt), and per layer the projected positional keys of every
    relative distance needed so far. A forward appends all of its T positions; then only the last `mem_len` are
    kept (None keeps all; reuse_len, a pretraining notion, does not apply). `crop(-n)` forgets the n most recent
    positions.
    """

    is_compileable = False
    is_croppable = True

    def __init__(self, config, *, mem_len=None):
        self.mem_len = mem_len  # None: keep every position
        self.n_head, self.d_head = config.n_head, config.d_head
        self.keys = [None] * config.n_layer  # (B, N, capacity, D) per layer
        self.values = [None] * config.n_layer
        self.padding = None  # (B, capacity) bool, True = padding
        self.has_padding = False
        self.start = self.end = self.seen_tokens = 0
        self.pos_keys = None  # per layer (1 or 2, N, D, R'): projected keys of distances pos_top, pos_top - 1, ...
        self.pos_top = self.pos_qlen = 0

    def get_seq_length(self, layer_idx=0):
        return self.end - self.start

    def crop(self, max_length):
        """Keep the oldest max_length memory positions; a negative value drops that many of the most recent."""
        if max_length < 0:
            max_length += self.get_seq_length()
        self.end = self.start + max(0, min(max_length, self.get_seq_length()))

    def reorder_cache(self, beam_idx):
        """Beam search: row b continues the sequence of row beam_idx[b]."""
        for store in (self.keys, self.values):
            for i, x in enumerate(store):
                store[i] = x.index_select(0, beam_idx.to(x.device))
        if self.padding is not None:
            self.padding = self.padding.index_select(0, beam_idx.to(self.padding.device))

    def begin(self, pad_mask, *, qlen, like):
        """Make room for qlen positions after the memory and record their padding (pad_mask (B, T) or None).
        Returns the memory's padding (B, M) bool, or None when the memory holds none."""
        batch = like.shape[0]
        if self.padding is None or self.end + qlen > self.padding.shape[1]:
            self._grow(batch, qlen, like)
        new = self.padding[:, self.end : self.end + qlen]  # (B, T)
        if pad_mask is None:
            new.zero_()
        else:
            new.copy_(pad_mask)
            self.has_padding = True
        return self.padding[:, self.start : self.end] if self.has_padding else None

    def _grow(self, batch, qlen, like):
        """New buffers with room for twice the memory plus qlen; the memory moves to the front."""
        length = self.end - self.start
        capacity = 2 * (length + qlen) + 16
        shape = (batch, self.n_head, capacity, self.d_head)
        for store in (self.keys, self.values):
            for i, old in enumerate(store):
                store[i] = like.new_empty(shape)
                if old is not None:
                    store[i][:, :, :length] = old[:, :, self.start : self.end]
        padding = torch.zeros(batch, capacity, dtype=torch.bool, device=like.device)
        if self.padding is not None:
            padding[:, :length] = self.padding[:, self.start : self.end]
        self.padding, self.start, self.end = padding, 0, length

    def update(self, layer_idx, k_new, v_new):
        """Write this forward's keys and values (B, N, T, D) after the memory; returns memory + new (B, N, M + T, D)."""
        stop = self.end + k_new.shape[2]
        k, v = self.keys[layer_idx], self.values[layer_idx]
        k[:, :, self.end : stop] = k_new
        v[:, :, self.end : stop] = v_new
        return k[:, :, self.start : stop], v[:, :, self.start : stop]

    def commit(self, qlen):
        """The forward's qlen positions join the memory; keep the last mem_len."""
        self.end += qlen
        self.seen_tokens += qlen
        if self.mem_len is not None:
            self.start = max(self.start, self.end - self.mem_len)

    def has_positions(self, *, qlen, klen):
        return self.pos_keys is not None and klen <= self.pos_top and qlen <= self.pos_qlen

    def set_positions(self, pos_keys, *, top, qlen):
        """pos_keys: per layer (1 or 2, N, D, R') for distances top, top - 1, ... (down to -qlen + 1 for "bi")."""
        self.pos_keys, self.pos_top, self.pos_qlen = pos_keys, top, qlen

    def relative_keys(self, layer_idx, *, klen, num_positions):
        """The projected positional keys of distances klen, klen - 1, ...: (1 or 2, N, D, num_positions)."""
        first = self.pos_top - klen
        return self.pos_keys[layer_idx][..., first : first + num_positions]


# ----------------------------------------------------------------------------------------------------------
# Models


class XLNetLitePreTrainedModel(PreTrainedModel):
    config_class = XLNetLiteConfig
    config: XLNetLiteConfig
    base_model_prefix = "transformer"
    # the heads take the Trainer's num_items_in_batch by name (no **kwargs for the Trainer to detect it by)
    accepts_loss_kwargs = True
    supports_gradient_checkpointing = True
    _supports_sdpa = True
    _supports_flex_attn = True
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


def check_inputs(
    config, *, input_ids, inputs_embeds, perm_mask, target_mapping, mems, attention_mask, input_mask, token_type_ids
):
    """ValueError naming the argument and the expected form; nothing is broadcast silently. Returns (B, T)."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError("Pass exactly one of input_ids (B, T) or inputs_embeds (B, T, H)")
    if input_ids is not None:
        if input_ids.dim() != 2 or input_ids.dtype.is_floating_point:
            raise ValueError(
                f"input_ids must be an integer tensor of shape (B, T), got {input_ids.dtype} {tuple(input_ids.shape)}"
            )
        B, T = input_ids.shape
        if input_ids.numel() and not torch.compiler.is_compiling():
            low, high = int(input_ids.min()), int(input_ids.max())
            if low < 0 or high >= config.vocab_size:
                raise ValueError(
                    f"input_ids must lie in [0, vocab_size={config.vocab_size}), got values in [{low}, {high}]"
                )
    else:
        if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != config.d_model:
            raise ValueError(
                f"inputs_embeds must have shape (B, T, d_model={config.d_model}), got {tuple(inputs_embeds.shape)}"
            )
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
    if (
        token_type_ids is not None
        and token_type_ids.numel()
        and not torch.compiler.is_compiling()
        and int(token_type_ids.min()) < 0
    ):
        raise ValueError(f"token_type_ids must be segment ids >= 0, got {int(token_type_ids.min())}")
    if attention_mask is not None and input_mask is not None:
        raise ValueError("Pass only one of attention_mask (0 = padding) or input_mask (1 = padding)")
    if perm_mask is not None and tuple(perm_mask.shape) != (B, T, T):
        raise ValueError(f"perm_mask must have shape (B, T, T) = {(B, T, T)}, got {tuple(perm_mask.shape)}")
    if target_mapping is not None:
        if target_mapping.dim() != 3 or target_mapping.shape[0] != B or target_mapping.shape[2] != T:
            raise ValueError(
                f"target_mapping must have shape (B, P, T) = ({B}, P, {T}), got {tuple(target_mapping.shape)}"
            )
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
    accepts_loss_kwargs = False  # no loss

    def __init__(self, config: XLNetLiteConfig):
        super().__init__(config)
        self.word_embedding = nn.Embedding(config.vocab_size, config.d_model)
        self.mask_emb = nn.Parameter(torch.empty(1, 1, config.d_model))
        self.layer = nn.ModuleList([XLNetLiteLayer(config, i) for i in range(config.n_layer)])
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

    def layer_biases(self):
        """The biases a layer is given: the shared ones (untie_r False), or None, the layer reading its own."""
        return tuple(self.shared_biases()) or None

    def cache_mem(self, h, prev_mem):
        """This layer's input, first reuse_len tokens, appended to the memory, last mem_len kept, no gradient."""
        reuse_len, mem_len = self.config.reuse_len, self.config.mem_len
        if reuse_len:
            h = h[:, :reuse_len]
        new = h if prev_mem is None else torch.cat([prev_mem, h], dim=1)  # (B, M', H)
        # contiguous: a view would keep the whole concatenation alive, and its strides (which change while the memory
        # fills) would make torch.compile recompile for memories of equal shape
        return (new[:, -mem_len:] if mem_len else new).detach().contiguous()

    def attention_inputs(
        self,
        *,
        perm_mask,
        pad_mask,
        token_type_ids,
        target_mapping,
        qlen,
        mlen,
        device,
        predict_next=False,
        mem_pad=None,
        cache=None,
    ):
        cfg = self.config
        # Shortcuts that read the data ("is anything blocked?", "how many segment ids?") skip work in eager mode; under
        # torch.compile they would break the graph, so there the masks are always applied (the Triton kernels' forms
        # are read inside an operator, kernel_forms, in both modes).
        shortcuts = not torch.compiler.is_compiling()

        def any_or_none(mask):
            return mask if mask is None or not shortcuts or bool(mask.any()) else None

        if predict_next:  # the masks of a dummy token at position T (row and key T), as transformers' XLNet appends one
            pad_mask = None if pad_mask is None else F.pad(pad_mask, (0, 1), value=False)  # (B, T + 1)
        blocked = blocked_positions(
            perm_mask=perm_mask,
            pad_mask=pad_mask,
            attn_type=cfg.attn_type,
            same_length=cfg.same_length,
            qlen=qlen + predict_next,
            mlen=mlen,
            device=device,
            mem_pad=mem_pad,
        )  # (B or 1, T, K), or (B or 1, T + 1, K + 1) with predict_next
        seg_keys = None if token_type_ids is None else F.pad(token_type_ids.long(), (mlen, 0), value=0)  # (B, K)
        query_pos = query_valid = blocked_g = None
        if predict_next:  # the dummy's row is the query row; nobody sees the dummy, so its key (and content) goes
            query_pos = torch.full((1, 1), qlen, device=device)  # (1, 1), the same for every row of the batch
            blocked = content_stream_mask(blocked, qlen=qlen + 1, mlen=mlen)
            if blocked is not None:
                blocked = blocked[:, :, :-1]  # (B or 1, T + 1, K): the T content rows, then the query row
                blocked_g = blocked[:, None, qlen:]  # (B or 1, 1, 1, K)
        elif target_mapping is not None:
            valid = (target_mapping != 0).any(-1)  # (B, P)
            query_pos = (target_mapping != 0).to(torch.uint8).argmax(-1)  # (B, P) position of the one-hot entry
            query_valid = None if shortcuts and bool(valid.all()) else valid[:, :, None]
            if blocked is not None:
                blocked_g = gather_rows(blocked, query_pos)[:, None]  # (B, 1, P, K)
        no_key_g = None
        if blocked_g is not None:
            no_key_g = any_or_none(blocked_g.all(-1, keepdim=True))  # (B, 1, P, 1)
            blocked_g = any_or_none(blocked_g)
        blocked_h = blocked if predict_next else content_stream_mask(blocked, qlen=qlen, mlen=mlen)
        blocked_h = any_or_none(blocked_h)
        forms_h = forms_g = None
        if cfg._attn_implementation == TRITON_ATTENTION:  # what the data allows the kernels, read at run time
            mask = None if predict_next or (blocked_h is None and blocked_g is None) else blocked
            if mask is not None or seg_keys is not None:
                found = kernel_forms(mask, None if blocked_g is None else query_pos, seg_keys, mlen)
                forms_h = KernelForms(None if mask is None or blocked_h is None else found[0], found[1])
                forms_g = KernelForms(None if mask is None or blocked_g is None else found[2], found[3])
        pos_emb = None
        if cache is None:
            pos_emb = self.dropout(
                relative_position_embedding(cfg, qlen=qlen, klen=qlen + mlen, device=device).to(self.dtype)
            )
        else:
            self.cache_positions(cache, qlen=qlen, klen=qlen + mlen, device=device)
        return AttentionInputs(
            pos_emb=pos_emb,
            num_positions=qlen + mlen + (qlen if cfg.attn_type == "bi" else 1),
            blocked_h=None if blocked_h is None else blocked_h[:, None],
            blocked_g=blocked_g,
            no_key_g=no_key_g,
            fused_query=predict_next,
            no_key_fused=None
            if no_key_g is None or not predict_next
            else F.pad(no_key_g, (0, 0, qlen, 0), value=False),
            seg_query_h=None if seg_keys is None else token_type_ids.long(),
            seg_query_g=None if seg_keys is None or query_pos is None else token_type_ids.long().gather(1, query_pos),
            seg_keys=seg_keys,
            # flex_attention and the Triton kernels add the segment term inside: no one-hot dims on the keys
            seg_classes=(
                segment_dims(seg_keys, cfg.d_head)
                if seg_keys is not None
                and shortcuts
                and cfg._attn_implementation not in ("flex_attention", TRITON_ATTENTION)
                else 0
            ),
            query_pos=query_pos,
            query_valid=query_valid,
            forms_h=forms_h,
            forms_g=forms_g,
        )

    def cache_positions(self, cache, *, qlen, klen, device):
        """Give the cache every layer's projected positional keys, for distances up to twice klen: generation
        grows klen by one a step, so they are projected O(log) times, not once a token."""
        if cache.has_positions(qlen=qlen, klen=klen):
            return
        top = 2 * klen + 16
        pos_emb = self.dropout(
            relative_position_embedding(self.config, qlen=qlen, klen=top, device=device).to(self.dtype)
        )
        cache.set_positions([layer.rel_attn.positional_keys(pos_emb) for layer in self.layer], top=top, qlen=qlen)

    def generation_cache(self, cache, past_key_values, use_cache, *, mems, token_type_ids):
        """The XLNetLiteCache to read and extend, or None. generate() passes it as `cache` (transformers >= 5.24) or
        `past_key_values` (before); a caller may use either name."""
        cache = either_cache(cache, past_key_values)
        if cache is None and not use_cache:
            return None
        if cache is None:
            cache = XLNetLiteCache(self.config, mem_len=self.config.mem_len or None)
        if not isinstance(cache, XLNetLiteCache):
            raise ValueError(
                f"the generation cache must be an XLNetLiteCache (generate() makes one), got {type(cache).__name__}"
            )
        if mems is not None:
            raise ValueError("Pass either mems (Transformer-XL memory) or a generation cache, not both")
        if token_type_ids is not None:
            raise ValueError("token_type_ids cannot be combined with the generation cache: it has no segments")
        return cache

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
        predict_next=False,
        cache=None,
        use_cache=None,
        past_key_values=None,
        positions_to_keep=None,
    ):
        """transformers' XLNetModel inputs, plus:
        predict_next: one query-stream row at position T, after the last token, that sees every position (and the
            memory): XLNet's next-token prediction. transformers' XLNet gets it by appending a dummy token that
            perm_mask hides from every position and target_mapping reads; this is the same computation without the
            dummy's content stream, which nothing sees. The output is then (B, 1, H).
        cache (or past_key_values) / use_cache: the generation cache (XLNetLiteCache) instead of mems; see generate().
        positions_to_keep: a slice of positions, e.g. slice(-1, None) for the <cls> token that the sequence heads
            pool: the last layer computes its output at those positions only (every position is still a key; the
            other layers and the mems are unchanged), and last_hidden_state is (B, len, H). Content stream only: not
            with target_mapping, predict_next or the generation cache.
        """
        cfg = self.config
        output_attentions = output_attentions if output_attentions is not None else cfg.output_attentions
        output_hidden_states = output_hidden_states if output_hidden_states is not None else cfg.output_hidden_states
        return_dict = return_dict if return_dict is not None else cfg.return_dict
        if use_mems is None:
            use_mems = cfg.use_mems_train if self.training else cfg.use_mems_eval
        if mems is not None and all(m is None for m in mems):
            mems = None
        cache = self.generation_cache(cache, past_key_values, use_cache, mems=mems, token_type_ids=token_type_ids)
        if positions_to_keep is not None and (target_mapping is not None or predict_next or cache is not None):
            raise ValueError(
                "positions_to_keep selects content-stream positions: pass no target_mapping, predict_next "
                "or generation cache with it"
            )
        if predict_next and not (perm_mask is None and target_mapping is None and token_type_ids is None):
            raise ValueError(
                "predict_next=True places the query stream itself: pass no perm_mask, target_mapping "
                "or token_type_ids with it"
            )
        B, T = check_inputs(
            cfg,
            input_ids=input_ids,
            inputs_embeds=inputs_embeds,
            perm_mask=perm_mask,
            target_mapping=target_mapping,
            mems=mems,
            attention_mask=attention_mask,
            input_mask=input_mask,
            token_type_ids=token_type_ids,
        )
        mlen = cache.get_seq_length() if cache is not None else mems[0].shape[1] if mems is not None else 0
        h = self.word_embedding(input_ids) if inputs_embeds is None else inputs_embeds.to(self.dtype)  # (B, T, H)
        if mems is not None:
            mems = [m.to(device=h.device, dtype=h.dtype) for m in mems]
        pad_mask = input_mask > 0 if input_mask is not None else None
        if attention_mask is not None:
            pad_mask = attention_mask == 0  # (B, T)
        pad_mask = _padding_or_none(pad_mask)
        attention_inputs = self.attention_inputs(
            perm_mask=perm_mask,
            pad_mask=pad_mask,
            token_type_ids=token_type_ids,
            target_mapping=target_mapping,
            qlen=T,
            mlen=mlen,
            device=h.device,
            predict_next=predict_next,
            cache=cache,
            mem_pad=None if cache is None else cache.begin(pad_mask, qlen=T, like=h),
        )
        h = self.dropout(h)
        g = None
        if target_mapping is not None or predict_next:
            P = 1 if predict_next else target_mapping.shape[1]
            g = self.dropout(self.mask_emb.expand(B, P, -1))  # (B, P, H)
        output, new_mems, hidden_states, attentions = self.run_layers(
            h,
            g,
            mems,
            attention_inputs,
            cache=cache,
            use_mems=use_mems,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            last_rows=positions_to_keep,
        )
        if cache is not None:
            cache.commit(T)
        out = XLNetLiteModelOutput(
            last_hidden_state=self.dropout(output),  # (B, T or P, H)
            mems=new_mems if use_mems else None,
            hidden_states=tuple(hidden_states) if output_hidden_states else None,
            attentions=tuple(attentions) if output_attentions else None,
            **{CACHE_NAME: cache},
        )
        return out if return_dict else out.to_tuple()

    def run_layers(
        self, h, g, mems, attention_inputs, *, cache, use_mems, output_attentions, output_hidden_states, last_rows=None
    ):
        """The layer stack. Returns the output stream (h, or g with a target_mapping), the new mems, hidden states
        and attentions. When the output is the query stream, the last layer's content stream feeds nothing and
        is skipped (unless its hidden states or attentions are asked for); last_rows (a slice) keeps only those
        positions of the last layer's content stream."""
        kernel = self.config._attn_implementation
        if output_attentions or kernel not in ("sdpa", "flex_attention", TRITON_ATTENTION):
            kernel = "eager"  # only the explicit kernel returns the probabilities
        skip_last_content = g is not None and not (output_attentions or output_hidden_states)
        new_mems, hidden_states, attentions = [], [], []
        for i, layer in enumerate(self.layer):
            mem = None if mems is None else mems[i]
            if use_mems:
                new_mems.append(self.cache_mem(h, mem))
            if output_hidden_states:
                hidden_states += [h] if g is None else [h, g]
            last = i == len(self.layer) - 1
            h, g, probs = layer(
                h,
                g,
                mem,
                attention_inputs,
                biases=self.layer_biases(),
                kernel=kernel,
                cache=cache,
                content=not (skip_last_content and last),
                rows=last_rows if last else None,
            )
            if output_attentions:
                attentions.append(probs[0] if g is None else probs)
        if output_hidden_states:
            hidden_states += [h] if g is None else [h, g]
        return (h if g is None else g), new_mems, hidden_states, attentions


def _padding_or_none(pad_mask):
    """The (B, T) padding mask, or None when it marks no padding (then nothing needs masking). Under torch.compile
    the mask is kept as it is: a shortcut that reads the data would break the graph."""
    if pad_mask is None or torch.compiler.is_compiling():
        return pad_mask
    return pad_mask if bool(pad_mask.any()) else None


class XLNetLiteLMHeadModel(XLNetLitePreTrainedModel, GenerationMixin):
    """Permutation-LM head: logits for the P predicted tokens (target_mapping), tied to the word embeddings.
    `generate()` predicts each next token as transformers' XLNetLMHeadModel does (prepare_inputs_for_generation),
    with the memory kept as an XLNetLiteCache of projected keys and values."""

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

    @classmethod
    def _supports_default_dynamic_cache(cls):
        return False  # the cache is an XLNetLiteCache, made by prepare_inputs_for_generation

    def prepare_inputs_for_generation(
        self,
        input_ids,
        cache=None,
        attention_mask=None,
        use_cache=None,
        use_mems=None,
        inputs_embeds=None,
        token_type_ids=None,
        past_key_values=None,
        **kwargs,
    ):
        """One step of XLNet's next-token prediction, as transformers' XLNetLMHeadModel does it.

        transformers appends a dummy token that perm_mask hides from every position and reads it with target_mapping
        through the query stream; here `predict_next=True` runs that query row at position T without the dummy (the
        same numbers: nothing sees the dummy). With the cache (the default) the memory holds the content stream of
        the earlier positions and each step feeds the last two tokens: the newest one, and the one before it, whose
        state is computed once more with its successor in view before it joins the memory. transformers' XLNet does
        the same (it feeds the last two tokens and the dummy, and drops the last two of its returned mems); this cache
        first forgets its newest position, and keeps mem_len - 1 positions where transformers' mems keep mem_len
        including the dummy. use_cache=False (or use_mems=False) feeds the whole sequence at every step.
        """
        if inputs_embeds is not None or token_type_ids is not None:
            raise ValueError(
                "XLNetLiteLMHeadModel.generate() takes input_ids and attention_mask only "
                "(no inputs_embeds, no token_type_ids)"
            )
        for name in ("next_sequence_length", "is_first_iteration", "cache_position"):
            kwargs.pop(name, None)
        cache = either_cache(cache, past_key_values)
        cached = use_cache is not False and use_mems is not False
        if not cached:
            cache = None
        elif cache is not None and cache.seen_tokens:
            cache.crop(-1)
            input_ids = input_ids[:, -2:]
            attention_mask = None if attention_mask is None else attention_mask[:, -2:]
        elif cache is None:
            mem_len = self.config.mem_len
            cache = XLNetLiteCache(self.config, mem_len=mem_len - 1 if mem_len else None)
        return dict(
            input_ids=input_ids,
            attention_mask=attention_mask,
            predict_next=True,
            cache=cache,
            use_cache=cached,
            use_mems=False,
            **kwargs,
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
        labels=None,
        use_mems=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        logits_to_keep=0,
        predict_next=False,
        cache=None,
        use_cache=None,
        cache_position=None,
        num_items_in_batch=None,
        past_key_values=None,
    ):
        """transformers' XLNetLMHeadModel inputs, plus predict_next (logits (B, 1, V) for the token after the last
        one; see XLNetLiteModel), the generation cache (cache or past_key_values / use_cache; generate() may also pass
        cache_position, unused: the cache knows its length) and the Trainer's num_items_in_batch. With
        `config.sparse_prediction` (a pretraining field, as ModernBERT's) and (B, T) labels, the logits are those of the
        labelled positions only, (1, N, V) in row-major order: masked and causal LM pretraining skip the LM head on the
        rows they do not score."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        out = self.transformer(
            input_ids,
            attention_mask=attention_mask,
            mems=mems,
            perm_mask=perm_mask,
            target_mapping=target_mapping,
            token_type_ids=token_type_ids,
            input_mask=input_mask,
            inputs_embeds=inputs_embeds,
            use_mems=use_mems,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            predict_next=predict_next,
            cache=cache,
            past_key_values=past_key_values,
            use_cache=use_cache,
        )
        hidden = keep_rows(out.last_hidden_state, logits_to_keep)  # (B, P or T or 1, H)
        loss = None
        if labels is not None:
            dims = "(B, 1)" if predict_next else "(B, P)" if target_mapping is not None else "(B, T)"
            check_class_labels(
                labels,
                shape=tuple(hidden.shape[:2]),
                dims=dims,
                what="token ids",
                bound_name="vocab_size",
                bound=self.config.vocab_size,
            )
            if getattr(self.config, "sparse_prediction", False) and target_mapping is None and not predict_next:
                labelled = labels != -100  # ModernBERT's sparse prediction: the LM head on the labelled rows only
                hidden, labels = hidden[labelled][None], labels[labelled][None]  # (1, N, H), (1, N)
        logits = self.lm_loss(hidden)  # (B, P or T or 1, V); (1, N, V) with sparse prediction
        if labels is not None:
            loss = cross_entropy(logits.flatten(0, 1), labels.flatten(), num_items_in_batch)
        result = XLNetLiteLMHeadModelOutput(
            loss=loss,
            logits=logits,
            mems=out.mems,
            hidden_states=out.hidden_states,
            attentions=out.attentions,
            **{CACHE_NAME: getattr(out, CACHE_NAME)},
        )
        return result if return_dict else result.to_tuple()


def keep_rows(hidden, logits_to_keep):
    """transformers' logits_to_keep: 0 keeps every row, n the last n, a tensor the rows it indexes."""
    if isinstance(logits_to_keep, int):
        return hidden if logits_to_keep == 0 else hidden[:, -logits_to_keep:]
    return hidden[:, logits_to_keep]


def cross_entropy(logits, labels, num_items_in_batch=None):
    """Mean cross-entropy over the labels that are not -100, in fp32; with the Trainer's num_items_in_batch (the
    labelled items of every micro-batch of a gradient-accumulation step) their sum divided by it, as transformers'
    losses do, so that accumulated micro-batches add up to the mean over the whole batch. logits (rows, classes),
    labels (rows,) of any integer dtype."""
    labels = labels.long()
    if logits.device.type == "cpu" and not torch.compiler.is_compiling():
        total = _ChunkedCrossEntropy.apply(logits, labels)
        if num_items_in_batch is None:
            return total / (labels != -100).sum()  # 0 / 0 = nan with no label, as F.cross_entropy's mean
        return per_item_sum(total, num_items_in_batch)
    if num_items_in_batch is None:
        return F.cross_entropy(logits.float(), labels, ignore_index=-100)
    return per_item_sum(F.cross_entropy(logits.float(), labels, ignore_index=-100, reduction="sum"), num_items_in_batch)


class _ChunkedCrossEntropy(torch.autograd.Function):
    """F.cross_entropy(logits.float(), labels, ignore_index=-100, reduction="sum") computed a few rows at a time, so
    that its fp32 temporaries stay in the CPU's cache: no fp32 copy of the logits, no log-probabilities kept for the
    backward, which recomputes softmax - one_hot in fp32 from the logits and each row's maximum and log-sum-exp and
    writes it in the logits' dtype. The log-probabilities are F.log_softmax's, (x - max) - log(sum(exp(x - max))), so a
    row of equal or huge scores (a fully masked row at finfo.min) comes out as F's. A CPU bf16 training step at the
    recipe's shapes takes 0.91-0.96x the time it takes with the plain loss (benchmarks/RESULTS.md, "Model speed and
    memory"). logits (rows, V), labels (rows,) long -> a 0-dim fp32 sum."""

    CHUNK_BYTES = 1 << 20  # fp32 scores of a chunk of rows: 1 MiB, about a core's L2

    @staticmethod
    def forward(ctx, logits, labels):
        out_of_bounds = (labels != -100) & ((labels < 0) | (labels >= logits.shape[-1]))
        if bool(out_of_bounds.any()):  # as F.cross_entropy, not a class 0 for a clamped label
            raise IndexError(f"Target {labels[out_of_bounds][0].item()} is out of bounds.")
        rows = max(1, _ChunkedCrossEntropy.CHUNK_BYTES // (4 * logits.shape[-1]))
        maxima, log_sums = [], []
        for chunk in logits.split(rows):
            scores = chunk.float()
            maxima.append(scores.amax(-1))
            log_sums.append((scores - maxima[-1][:, None]).exp_().sum(-1).log_())
        top, log_sum = torch.cat(maxima), torch.cat(log_sums)  # (rows,) each
        scored, ignored = labels.clamp(min=0), labels == -100  # an ignored row reads class 0, then counts for 0
        picked = logits.gather(1, scored[:, None])[:, 0].float()  # the label's score
        ctx.save_for_backward(logits, scored, ignored, top, log_sum)
        ctx.rows = rows
        return (log_sum - (picked - top)).masked_fill_(ignored, 0.0).sum()  # - log_softmax at the label

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        logits, scored, ignored, top, log_sum = ctx.saved_tensors
        weight = (~ignored).to(torch.float32) * grad  # (rows,): 0 on an ignored row
        out = torch.empty_like(logits)
        parts = (t.split(ctx.rows) for t in (logits, scored, top, log_sum, weight, out))
        for x, label, row_top, row_log_sum, row_weight, row_out in zip(*parts):
            prob = (x.float() - row_top[:, None]).sub_(row_log_sum[:, None]).exp_()  # softmax, (rows, V) fp32
            prob.scatter_add_(1, label[:, None], torch.full_like(row_top[:, None], -1.0))  # - one_hot
            row_out.copy_(prob.mul_(row_weight[:, None]))
        return out, None


def per_item_sum(total, num_items_in_batch):
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


def check_class_labels(labels, *, shape, dims, what, bound_name, bound):
    """labels of the given shape, integers in [0, bound) or -100 (ignored)."""
    if tuple(labels.shape) != shape:
        raise ValueError(f"labels must have shape {dims} = {shape}, got {tuple(labels.shape)}")
    if labels.dtype.is_floating_point or labels.dtype == torch.bool:
        raise ValueError(f"labels must be integer {what}, got {labels.dtype}")
    if labels.numel() and not torch.compiler.is_compiling():
        bad = (labels != -100) & ((labels < 0) | (labels >= bound))
        if bool(bad.any()):
            raise ValueError(
                f"labels must be {what} in [0, {bound_name}={bound}) or -100 (ignored), got {labels[bad][0].item()}"
            )


class XLNetLiteSequenceSummary(nn.Module):
    """Pool one vector per sequence (the last token, XLNet's <cls>, by default), project, activate."""

    def __init__(self, config):
        super().__init__()
        self.summary_type = config.summary_type
        self.summary = nn.Linear(config.d_model, config.d_model) if config.summary_use_proj else nn.Identity()
        act = config.summary_activation
        self.activation = get_activation(act) if act else nn.Identity()
        self.last_dropout = Dropout(config.summary_last_dropout)

    def forward(self, hidden_states, cls_index=None, keep=None):
        """hidden_states (B, T, H); `keep` (B, T), 1 for real tokens: "mean" averages those only (transformers'
        XLNet averages the padding too; without padding both are the same)."""
        if self.summary_type == "last":
            x = hidden_states[:, -1]
        elif self.summary_type == "first":
            x = hidden_states[:, 0]
        elif self.summary_type == "mean" and keep is not None:
            keep = keep.to(hidden_states.dtype).unsqueeze(-1)  # (B, T, 1)
            x = (hidden_states * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1)
        elif self.summary_type == "mean":
            x = hidden_states.mean(dim=1)
        else:  # cls_index
            if cls_index is None:
                cls_index = torch.full(hidden_states.shape[:1], hidden_states.shape[1] - 1, device=hidden_states.device)
            x = hidden_states[torch.arange(hidden_states.shape[0], device=hidden_states.device), cls_index]
        return self.last_dropout(self.activation(self.summary(x)))

    def positions(self, config, *, target_mapping, output_attentions, output_hidden_states):
        """The positions this summary reads, as the model's positions_to_keep: the last (<cls>; also "cls_index"
        without an index, as the sequence heads call it) or the first. None (all) for "mean", for the query stream
        (target_mapping) and when every position's output is asked for."""
        attentions = config.output_attentions if output_attentions is None else output_attentions
        hidden_states = config.output_hidden_states if output_hidden_states is None else output_hidden_states
        if target_mapping is not None or attentions or hidden_states:
            return None
        return {"last": slice(-1, None), "cls_index": slice(-1, None), "first": slice(0, 1)}.get(self.summary_type)


class XLNetLiteForSequenceClassification(XLNetLitePreTrainedModel):
    """Classification / regression from the last position (the <cls> token; pad on the left)."""

    def __init__(self, config: XLNetLiteConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.transformer = XLNetLiteModel(config)
        self.sequence_summary = XLNetLiteSequenceSummary(config)
        self.logits_proj = nn.Linear(config.d_model, config.num_labels)
        self.post_init()

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
        labels=None,
        use_mems=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        num_items_in_batch=None,
    ):
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        if self.config.summary_type == "last":
            check_left_padding(attention_mask, input_mask)
        out = self.transformer(
            input_ids,
            attention_mask=attention_mask,
            mems=mems,
            perm_mask=perm_mask,
            target_mapping=target_mapping,
            token_type_ids=token_type_ids,
            input_mask=input_mask,
            inputs_embeds=inputs_embeds,
            use_mems=use_mems,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            positions_to_keep=self.sequence_summary.positions(
                self.config,
                target_mapping=target_mapping,
                output_attentions=output_attentions,
                output_hidden_states=output_hidden_states,
            ),
        )
        keep = real_tokens(attention_mask, input_mask)  # (B, T) or None
        logits = self.logits_proj(self.sequence_summary(out.last_hidden_state, keep=keep))  # (B, num_labels)
        loss = None if labels is None else self.classification_loss(logits, labels, num_items_in_batch)
        result = XLNetLiteForSequenceClassificationOutput(
            loss=loss, logits=logits, mems=out.mems, hidden_states=out.hidden_states, attentions=out.attentions
        )
        return result if return_dict else result.to_tuple()

    def classification_loss(self, logits, labels, num_items_in_batch=None):
        """transformers' problem types; with num_items_in_batch (the Trainer's count of labels over the micro-batches
        of a step) the summed loss divided by it."""
        cfg = self.config
        reduction = "mean" if num_items_in_batch is None else "sum"
        if cfg.problem_type is None:
            if self.num_labels == 1:
                cfg.problem_type = "regression"
            elif labels.dtype in (torch.long, torch.int):
                cfg.problem_type = "single_label_classification"
            else:
                cfg.problem_type = "multi_label_classification"
        if cfg.problem_type == "regression":
            if self.num_labels == 1:
                loss = F.mse_loss(logits.squeeze(-1).float(), labels.float().view(-1), reduction=reduction)
            else:
                loss = F.mse_loss(logits.float(), labels.float(), reduction=reduction)
        elif cfg.problem_type == "single_label_classification":
            labels = labels.view(-1)
            check_class_labels(
                labels,
                shape=(logits.shape[0],),
                dims="(B,)",
                what="class ids",
                bound_name="num_labels",
                bound=self.num_labels,
            )
            return cross_entropy(logits, labels, num_items_in_batch)
        else:
            loss = F.binary_cross_entropy_with_logits(logits.float(), labels.float(), reduction=reduction)
        return loss if num_items_in_batch is None else per_item_sum(loss, num_items_in_batch)


def real_tokens(attention_mask, input_mask):
    """(B, T) with 1 for real tokens and 0 for padding, from either mask convention; None without a mask."""
    if attention_mask is not None:
        return attention_mask
    return None if input_mask is None else 1 - input_mask


def check_left_padding(attention_mask, input_mask):
    """XLNet classifies from the last position: right padding would pool a pad token."""
    pad = None
    if attention_mask is not None:
        pad = attention_mask[:, -1] == 0
    elif input_mask is not None:
        pad = input_mask[:, -1] > 0
    if pad is not None and not torch.compiler.is_compiling() and bool(pad.any()):
        raise ValueError(
            "attention_mask has padding at the last position, but XLNet classifies from the last token (<cls>): "
            "pad on the left (tokenizer.padding_side = 'left')"
        )


# ----------------------------------------------------------------------------------------------------------
# Token classification, multiple choice, question answering: transformers' XLNet heads, same parameter names


class XLNetLiteForTokenClassification(XLNetLitePreTrainedModel):
    """A label per token (NER, POS tagging): one linear layer on every position's output."""

    def __init__(self, config: XLNetLiteConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.transformer = XLNetLiteModel(config)
        self.classifier = nn.Linear(config.d_model, config.num_labels)
        self.post_init()

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
        labels=None,
        use_mems=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        num_items_in_batch=None,
    ):
        """labels (B, T): a class id per token, -100 where no loss is wanted (padding, later sub-word pieces)."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        out = self.transformer(
            input_ids,
            attention_mask=attention_mask,
            mems=mems,
            perm_mask=perm_mask,
            target_mapping=target_mapping,
            token_type_ids=token_type_ids,
            input_mask=input_mask,
            inputs_embeds=inputs_embeds,
            use_mems=use_mems,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        logits = self.classifier(out.last_hidden_state)  # (B, T or P, num_labels)
        loss = None
        if labels is not None:
            dims = "(B, P)" if target_mapping is not None else "(B, T)"
            check_class_labels(
                labels,
                shape=tuple(logits.shape[:2]),
                dims=dims,
                what="class ids",
                bound_name="num_labels",
                bound=self.num_labels,
            )
            loss = cross_entropy(logits.flatten(0, 1), labels.flatten(), num_items_in_batch)
        result = XLNetLiteForTokenClassificationOutput(
            loss=loss, logits=logits, mems=out.mems, hidden_states=out.hidden_states, attentions=out.attentions
        )
        return result if return_dict else result.to_tuple()


class XLNetLiteForMultipleChoice(XLNetLitePreTrainedModel):
    """One score per choice (RACE, SWAG): inputs (B, C, T) run as B * C sequences, each pooled like the sequence
    classifier (its last token, <cls>: pad on the left) and projected to one logit; softmax over the C choices."""

    def __init__(self, config: XLNetLiteConfig):
        super().__init__(config)
        self.transformer = XLNetLiteModel(config)
        self.sequence_summary = XLNetLiteSequenceSummary(config)
        self.logits_proj = nn.Linear(config.d_model, 1)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        token_type_ids=None,
        input_mask=None,
        attention_mask=None,
        mems=None,
        perm_mask=None,
        target_mapping=None,
        inputs_embeds=None,
        labels=None,
        use_mems=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        num_items_in_batch=None,
    ):
        """input_ids (B, C, T) or inputs_embeds (B, C, T, H); attention_mask, input_mask, token_type_ids (B, C, T);
        perm_mask (B, C, T, T); target_mapping (B, C, P, T); mems for B * C rows; labels (B,) choice indices."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        B, C = choices_shape(input_ids, inputs_embeds)
        flat = flatten_choices(
            batch=B,
            choices=C,
            input_ids=input_ids,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            input_mask=input_mask,
            token_type_ids=token_type_ids,
            perm_mask=perm_mask,
            target_mapping=target_mapping,
        )
        if self.config.summary_type == "last":
            check_left_padding(flat["attention_mask"], flat["input_mask"])
        out = self.transformer(
            **flat,
            mems=mems,
            use_mems=use_mems,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            positions_to_keep=self.sequence_summary.positions(
                self.config,
                target_mapping=flat["target_mapping"],
                output_attentions=output_attentions,
                output_hidden_states=output_hidden_states,
            ),
        )
        keep = real_tokens(flat["attention_mask"], flat["input_mask"])  # (B * C, T) or None
        logits = self.logits_proj(self.sequence_summary(out.last_hidden_state, keep=keep)).view(B, C)  # (B, C)
        loss = None
        if labels is not None:
            check_class_labels(
                labels, shape=(B,), dims="(B,)", what="choice indices", bound_name="num_choices", bound=C
            )
            loss = cross_entropy(logits, labels, num_items_in_batch)
        result = XLNetLiteForMultipleChoiceOutput(
            loss=loss, logits=logits, mems=out.mems, hidden_states=out.hidden_states, attentions=out.attentions
        )
        return result if return_dict else result.to_tuple()


def choices_shape(input_ids, inputs_embeds):
    """(B, C) from input_ids (B, C, T) or inputs_embeds (B, C, T, H); ValueError otherwise."""
    if input_ids is not None and input_ids.dim() != 3:
        raise ValueError(
            f"input_ids must have shape (B, C, T) = (batch, choices, tokens) for multiple choice, "
            f"got {tuple(input_ids.shape)}"
        )
    if input_ids is None and inputs_embeds is not None and inputs_embeds.dim() != 4:
        raise ValueError(
            f"inputs_embeds must have shape (B, C, T, H) = (batch, choices, tokens, d_model) for multiple "
            f"choice, got {tuple(inputs_embeds.shape)}"
        )
    first = input_ids if input_ids is not None else inputs_embeds
    if first is None:
        raise ValueError("Pass exactly one of input_ids (B, C, T) or inputs_embeds (B, C, T, H)")
    return first.shape[0], first.shape[1]


def flatten_choices(*, batch, choices, **inputs):
    """Every given per-choice input (B, C, ...) -> (B * C, ...); a ValueError names one whose dims aren't (B, C)."""
    flat = {}
    for name, x in inputs.items():
        if x is not None and (x.dim() < 3 or tuple(x.shape[:2]) != (batch, choices)):
            raise ValueError(
                f"{name} must start with the (B, C) = ({batch}, {choices}) dims of input_ids for "
                f"multiple choice, got {tuple(x.shape)}"
            )
        flat[name] = None if x is None else x.flatten(0, 1)
    return flat


class XLNetLiteForQuestionAnsweringSimple(XLNetLitePreTrainedModel):
    """Extractive question answering: a start and an end logit per position from one linear layer (what
    AutoModelForQuestionAnswering gives for XLNet)."""

    def __init__(self, config: XLNetLiteConfig):
        if config.num_labels != 2:
            raise ValueError(
                f"XLNetLiteForQuestionAnsweringSimple needs config.num_labels == 2 (start and end logits), "
                f"got {config.num_labels}"
            )
        super().__init__(config)
        self.num_labels = config.num_labels
        self.transformer = XLNetLiteModel(config)
        self.qa_outputs = nn.Linear(config.d_model, config.num_labels)
        self.post_init()

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
        start_positions=None,
        end_positions=None,
        use_mems=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        num_items_in_batch=None,
    ):
        """start_positions, end_positions (B,): the answer span, positions in [0, T); the loss is the mean of the
        start and end cross-entropies."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        out = self.transformer(
            input_ids,
            attention_mask=attention_mask,
            mems=mems,
            perm_mask=perm_mask,
            target_mapping=target_mapping,
            token_type_ids=token_type_ids,
            input_mask=input_mask,
            inputs_embeds=inputs_embeds,
            use_mems=use_mems,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        logits = self.qa_outputs(out.last_hidden_state)  # (B, T, 2)
        B, T = logits.shape[:2]
        start_logits, end_logits = logits[..., 0].contiguous(), logits[..., 1].contiguous()  # (B, T) each
        loss = None
        if start_positions is not None or end_positions is not None:
            starts, ends = check_span(start_positions, end_positions, batch=B, length=T)
            start_loss = cross_entropy(start_logits, starts, num_items_in_batch)
            loss = (start_loss + cross_entropy(end_logits, ends, num_items_in_batch)) / 2
        result = XLNetLiteForQuestionAnsweringSimpleOutput(
            loss=loss,
            start_logits=start_logits,
            end_logits=end_logits,
            mems=out.mems,
            hidden_states=out.hidden_states,
            attentions=out.attentions,
        )
        return result if return_dict else result.to_tuple()


def check_span(start_positions, end_positions, *, batch, length):
    if start_positions is None or end_positions is None:
        raise ValueError("Pass both start_positions and end_positions (B,) for the span loss, or neither")
    return (
        check_index(start_positions, "start_positions", batch=batch, length=length),
        check_index(end_positions, "end_positions", batch=batch, length=length),
    )


def check_index(x, name, *, batch, length):
    """(B,) or (B, 1) integer positions in [0, length) -> (B,) long; ValueError naming the argument otherwise."""
    if x.dim() == 2 and x.shape[1] == 1:
        x = x[:, 0]
    if tuple(x.shape) != (batch,):
        raise ValueError(f"{name} must have shape (B,) = ({batch},), got {tuple(x.shape)}")
    if x.dtype.is_floating_point or x.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer positions, got {x.dtype}")
    low, high = int(x.min()), int(x.max())
    if low < 0 or high >= length:
        raise ValueError(f"{name} must be positions in [0, T={length}), got values in [{low}, {high}]")
    return x.long()


def masked_positions(logits, p_mask):
    """p_mask = 1 marks positions that cannot be part of an answer (question, special tokens): lowest logit."""
    if p_mask is None:
        return logits
    return logits.masked_fill(p_mask.bool(), torch.finfo(logits.dtype).min)


class XLNetLitePoolerStartLogits(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.d_model, 1)

    def forward(self, hidden, p_mask=None):
        """(B, T, H) -> (B, T) start logits."""
        return masked_positions(self.dense(hidden).squeeze(-1), p_mask)


class XLNetLitePoolerEndLogits(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense_0 = nn.Linear(2 * config.d_model, config.d_model)
        self.activation = nn.Tanh()
        self.LayerNorm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dense_1 = nn.Linear(config.d_model, 1)

    def forward(self, hidden, start_states, p_mask=None):
        """hidden and start_states (..., T, H) -> end logits (..., T): every position as an end for that start."""
        x = self.activation(self.dense_0(torch.cat([hidden, start_states], dim=-1)))
        return masked_positions(self.dense_1(self.LayerNorm(x)).squeeze(-1), p_mask)


class XLNetLitePoolerAnswerClass(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense_0 = nn.Linear(2 * config.d_model, config.d_model)
        self.activation = nn.Tanh()
        self.dense_1 = nn.Linear(config.d_model, 1, bias=False)

    def forward(self, start_states, cls_states):
        """(B, H), (B, H) -> (B,) answer-class logit (is_impossible), from the start and <cls> representations."""
        return self.dense_1(self.activation(self.dense_0(torch.cat([start_states, cls_states], dim=-1)))).squeeze(-1)


class XLNetLiteForQuestionAnswering(XLNetLitePreTrainedModel):
    """XLNet's SQuAD 2.0 head. Training: the end is scored given the true start; loss = mean of the start and end
    cross-entropies, plus half the answer-class (is_impossible) loss when cls_index and is_impossible are given.
    Inference: the start_n_top best starts, for each the end_n_top best ends, and the answer-class logit from the
    probability-weighted start representation and <cls> (cls_index, default the last token)."""

    def __init__(self, config: XLNetLiteConfig):
        super().__init__(config)
        self.start_n_top, self.end_n_top = config.start_n_top, config.end_n_top
        self.transformer = XLNetLiteModel(config)
        self.start_logits = XLNetLitePoolerStartLogits(config)
        self.end_logits = XLNetLitePoolerEndLogits(config)
        self.answer_class = XLNetLitePoolerAnswerClass(config)
        self.post_init()

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
        start_positions=None,
        end_positions=None,
        is_impossible=None,
        cls_index=None,
        p_mask=None,
        use_mems=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        num_items_in_batch=None,
    ):
        """start_positions, end_positions, cls_index (B,) positions in [0, T); is_impossible (B,) 0/1;
        p_mask (B, T), 1 = may not be part of the answer."""
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        out = self.transformer(
            input_ids,
            attention_mask=attention_mask,
            mems=mems,
            perm_mask=perm_mask,
            target_mapping=target_mapping,
            token_type_ids=token_type_ids,
            input_mask=input_mask,
            inputs_embeds=inputs_embeds,
            use_mems=use_mems,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        hidden = out.last_hidden_state  # (B, T, H)
        B, T = hidden.shape[:2]
        p_mask = check_p_mask(p_mask, batch=B, length=T)
        cls_index = None if cls_index is None else check_index(cls_index, "cls_index", batch=B, length=T)
        if start_positions is not None or end_positions is not None:
            starts, ends = check_span(start_positions, end_positions, batch=B, length=T)
            fields = dict(
                loss=self.span_loss(hidden, starts, ends, p_mask, cls_index, is_impossible, num_items_in_batch)
            )
        else:
            fields = self.beam_search(hidden, p_mask, cls_index)
        result = XLNetLiteForQuestionAnsweringOutput(
            **fields, mems=out.mems, hidden_states=out.hidden_states, attentions=out.attentions
        )
        return result if return_dict else result.to_tuple()

    def span_loss(self, hidden, starts, ends, p_mask, cls_index, is_impossible, num_items_in_batch):
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        start_states = hidden[rows, starts][:, None].expand_as(hidden)  # (B, T, H): the true start, at every position
        start_loss = cross_entropy(self.start_logits(hidden, p_mask), starts, num_items_in_batch)
        end_loss = cross_entropy(self.end_logits(hidden, start_states, p_mask), ends, num_items_in_batch)
        loss = (start_loss + end_loss) / 2
        if cls_index is not None and is_impossible is not None:
            is_impossible = check_is_impossible(is_impossible, hidden.shape[0])
            cls_logits = self.answer_class(hidden[rows, starts], hidden[rows, cls_index])  # (B,)
            reduction = "mean" if num_items_in_batch is None else "sum"
            cls_loss = F.binary_cross_entropy_with_logits(cls_logits.float(), is_impossible, reduction=reduction)
            loss = loss + 0.5 * (cls_loss if num_items_in_batch is None else per_item_sum(cls_loss, num_items_in_batch))
        return loss

    def beam_search(self, hidden, p_mask, cls_index):
        B, T, H = hidden.shape
        S, E = self.start_n_top, self.end_n_top
        if max(S, E) > T:
            raise ValueError(
                f"config.start_n_top ({S}) and config.end_n_top ({E}) must not exceed the sequence length T={T}"
            )
        start_probs = self.start_logits(hidden, p_mask).softmax(-1)  # (B, T)
        start_top_probs, start_top_index = start_probs.topk(S, dim=-1)  # (B, S)
        start_states = hidden.gather(1, start_top_index[:, :, None].expand(-1, -1, H))  # (B, S, H)
        start_states = start_states[:, None].expand(-1, T, -1, -1)  # (B, T, S, H)
        end_mask = None if p_mask is None else p_mask[:, :, None]  # (B, T, 1)
        end_probs = self.end_logits(hidden[:, :, None].expand_as(start_states), start_states, end_mask).softmax(1)
        end_top_probs, end_top_index = end_probs.topk(E, dim=1)  # (B, E, S)
        expected_start = torch.einsum("bth,bt->bh", hidden, start_probs)  # (B, H)
        cls_states = hidden[:, -1] if cls_index is None else hidden[torch.arange(B, device=hidden.device), cls_index]
        return dict(
            start_top_log_probs=start_top_probs,
            start_top_index=start_top_index,
            end_top_log_probs=end_top_probs.reshape(B, E * S),
            end_top_index=end_top_index.reshape(B, E * S),
            cls_logits=self.answer_class(expected_start, cls_states),
        )


def check_p_mask(p_mask, *, batch, length):
    if p_mask is None:
        return None
    if tuple(p_mask.shape) != (batch, length):
        raise ValueError(f"p_mask must have shape (B, T) = {(batch, length)}, got {tuple(p_mask.shape)}")
    if not bool(((p_mask == 0) | (p_mask == 1)).all()):
        raise ValueError("p_mask must hold 0 (may be part of the answer) or 1 (may not)")
    return p_mask


def check_is_impossible(is_impossible, batch):
    if is_impossible.dim() == 2 and is_impossible.shape[1] == 1:
        is_impossible = is_impossible[:, 0]
    if tuple(is_impossible.shape) != (batch,):
        raise ValueError(f"is_impossible must have shape (B,) = ({batch},), got {tuple(is_impossible.shape)}")
    return is_impossible.float()


__all__ = [
    "XLNetLitePreTrainedModel",
    "XLNetLiteModel",
    "XLNetLiteLMHeadModel",
    "XLNetLiteForSequenceClassification",
    "XLNetLiteForTokenClassification",
    "XLNetLiteForMultipleChoice",
    "XLNetLiteForQuestionAnsweringSimple",
    "XLNetLiteForQuestionAnswering",
    "XLNetLiteCache",
]
