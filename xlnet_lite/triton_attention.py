"""XLNet's relative attention as fused Triton kernels, forward and backward (attn_implementation="xlnet_lite_triton").

For one batch row b and head n, with the queries already biased and scaled, qw = (q + u) / sqrt(D) and
qr = (q + v) / sqrt(D):

    score[i, j] = qw_i . k_j  +  qr_i . kr[:, r(i, j)]  +  gain_i [seg_i == seg_j]      (-inf where j is blocked)
    out_i       = softmax_j(score[i, :]) @ v                                           (0 if every key is blocked)

as in flash attention: the scores live one (BLOCK_M, BLOCK_N) tile at a time and only out and the log-sum-exp of
each row are written; the backward recomputes the tiles. The positional term r(i, j) = qlen - pos_i + j (rel_shift's
index) comes in one of two forms:

- banded (the content stream, pos_i = i): a (B, B) tile's distances run over two halves of B positions, so the
  kernel multiplies qr by each half's positional keys and reads each score at its shifted index (tl.gather); the
  loops over keys (the forward's, dq's) carry the second half's product to the next tile, whose first half it is
  (one (B, B) product a tile; dk/dv, whose rows change each turn, makes both). A tile of 2B rows by B keys reads
  three chunks of B distances, each half of its rows two of them as a square tile does (two carried, one made a
  tile); dk/dv may hold its tile keys by rows (more keys than rows, each warp whole keys). dq gathers the score
  gradient back into the halves' layout for dqr (a distance's two parts summed, then multiplied once); a third
  backward kernel gives dkr a block of distances at a time, over the slab of keys those distances reach from each
  block of queries (no atomics), or, with dkr's launch setting None, dq adds dkr up by atomic adds (the sum's order,
  and so its last bits, then vary from run to run; not while torch.use_deterministic_algorithms is on). No (Q, K) or
  (Q, R) tensor is written, forward or backward. Or, with POSITIONAL "matmul", the operator makes qr kr^T by one
  batched matmul, each block of query rows times the window of distances its rows read, and the kernels read it
  shifted, by strides, in the dense form below (no band, no dkr kernel), the gradient written into the product's
  layout and taken to qr and kr by two more matmuls.
- dense (the query stream, whose P rows sit at any positions, and a subset of content rows): the caller's shifted
  (B, N, Q, K) positional scores are an operand, and the backward writes their gradient.

Where the keys fill whole tiles and the head size is a power of two (`base`'s shapes), the forward, dk/dv and dq
kernels check no bounds in their loops (EVEN: their masks fold away), the same results with fewer instructions; rows
past the queries (a last block they do not fill, as the query stream's 85 rows) read the last query's operands again,
so that no bound of rows is checked a score either (nothing of theirs is stored; the backward gives them no
probability). Where the caller counts the leading keys every row sees (KernelForms' free: a memory), the tiles of them
skip the mask's comparisons.
The operator's own positional product (POSITIONAL "matmul") in 16 bits enters each tile's scores as a product with the
identity (tl.dot(pos, eye, s): exact for finite scores), so that it travels as the keys do, loaded ahead into shared
memory by Triton's software pipeline and read by the tensor cores, with no conversion or change of layout a score.
Where the caller counts the segment ids (seg_classes) and the tiles have SEG_PRODUCT_ROWS rows, the segment term is one
more such product, of one-hot dims, in place of a comparison a score.

Inputs are projected and biased by the caller (autograd takes the biases' gradients), so the kernels see plain
tensors. Dropout on the probabilities is drawn inside (Philox, from a seed and each score's index, so the backward
kernels redraw the forward's mask). On a CPU the kernels run only in Triton's interpreter (TRITON_INTERPRET=1 before
the first use: slow, for checking them).
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch

try:  # an import a saved model's remote code does not require (transformers skips imports inside try)
    import triton
    import triton.language as tl
except ImportError as error:
    raise ImportError(
        "attn_implementation='xlnet_lite_triton' needs Triton (it comes with torch's CUDA builds; on a "
        "CPU `pip install triton` runs the kernels in its interpreter)"
    ) from error

from .modeling_xlnet_lite import NO_DIAGONAL, MaskRanks

# ----------------------------------------------------------------------------------------------------------
# Kernels


LOG2E = tl.constexpr(1.4426950408889634)  # 1 / ln 2
DIAGONAL = tl.constexpr(2)  # RANKED: the mask as ranks with each row's own key re-opened (MaskRanks.diagonal)


@triton.jit
def _exp(s, m):
    """exp(s - m), elementwise, as 2^(s log2 e - m log2 e): one fused multiply-add and the hardware's approximate
    exp2 (ex2.approx.ftz on a GPU; tl.exp takes six instructions a value, handling subnormal results); m broadcasts."""
    return tl.exp2(tl.fma(s, LOG2E, -m * LOG2E))


@triton.jit
def _nonempty(Q, K):
    """Tell the compiler that the loops over queries and keys run at least once (the operator launches no kernel for
    no queries or no keys). Otherwise a loop's exit path for none of them sets the accumulators of its last
    warpgroup MMAs (their wait deferred past the loop), and ptxas, seeing that, issues every warpgroup MMA of the
    kernel synchronously, each waited for before the next (its info C7515)."""
    tl.assume(Q > 0)
    tl.assume(K > 0)


@triton.jit
def _below(offs, n, EVEN: tl.constexpr):
    """offs < n, elementwise; all true, with no comparison made, where the operands fill whole tiles (EVEN: Q and K
    multiples of the tile's rows and keys, D its BLOCK_D), so that the masks fold away."""
    if EVEN:
        return tl.full(offs.shape, 1, tl.int1)
    return offs < n


@triton.jit
def _rows_read(offs_m, Q, WHOLE_ROWS: tl.constexpr):
    """The rows a block of queries reads its operands at: its own, and past the last query (a block the queries do not
    fill, WHOLE_ROWS off) the last query's again, so that the loads need no bounds. Such rows' scores are the last
    row's; the kernels store nothing of them and give them no probability in the backward (their lse read as inf),
    so that no mask of rows is applied a score."""
    if WHOLE_ROWS:
        return offs_m
    return tl.minimum(offs_m, Q - 1)


@triton.jit
def _pos_rows(rows, sp_m, sp_blk, POS_ROWS: tl.constexpr):
    """Where these rows start in the dense form's positional scores: sp_m apart, and sp_blk more for each POS_ROWS
    rows (the positional product's windows, POSITIONAL "matmul"); POS_ROWS 0: rows sp_m apart (the caller's scores)."""
    if POS_ROWS:
        return rows * sp_m + (rows // POS_ROWS) * sp_blk
    return rows * sp_m


@triton.jit
def _pos_at(BASE, b, n, rows, keys, sp_b, sp_n, sp_m, sp_j, sp_blk, POS_ROWS: tl.constexpr):
    """Pointers into the dense form's positional scores (BASE: them or their gradient, laid out alike) of head (b, n) at
    these rows and keys, which broadcast against each other."""
    return BASE + b * sp_b + n * sp_n + _pos_rows(rows, sp_m, sp_blk, POS_ROWS) + keys * sp_j


@triton.jit
def _identity(POS, BLOCK: tl.constexpr):
    """The (BLOCK, BLOCK) identity in the dense form's positional scores' dtype, made once before a kernel's loop: a
    tile of the operator's own positional product (16-bit) enters the scores as a product with it, tl.dot(pos, eye,
    s), exact for finite scores (one term a sum, in the fp32 accumulator; an infinity times the identity's zeros would
    be NaN). The tile then goes from memory to the tensor cores as the keys do (loaded ahead by Triton's software
    pipeline into shared memory), where adding it took a conversion to fp32 a score and a pass through shared memory
    to the accumulator's layout."""
    return (tl.arange(0, BLOCK)[:, None] == tl.arange(0, BLOCK)[None, :]).to(POS.dtype.element_ty)


@triton.jit
def _add_positional(s, pos, eye, BY_PRODUCT: tl.constexpr):
    """s + the dense form's positional scores pos (loaded in s's shape): by the product with the identity (_identity)
    where BY_PRODUCT (the operator's product, POS_ROWS > 0: finite) and pos is 16-bit, else added in fp32 (the
    caller's scores may hold infinities)."""
    if BY_PRODUCT and pos.dtype != tl.float32:
        s = tl.dot(pos, eye, s)
    else:
        s += pos.to(tl.float32)
    return s


@triton.jit
def _segment_rows(gain, seg_q, SEG_DIMS: tl.constexpr, dtype: tl.constexpr):
    """(rows, SEG_DIMS): each row's gain at its segment id's column, 0 elsewhere, in dtype."""
    return tl.where(seg_q[:, None] == tl.arange(0, SEG_DIMS)[None, :], gain[:, None], 0.0).to(dtype)


@triton.jit
def _segment_keys(SEGK, b, ssk_b, keys, K, SEG_DIMS: tl.constexpr, EVEN: tl.constexpr):
    """The keys' segments (keys: a vector of key indices): their ids (B, K), or with SEG_DIMS their one-hot
    (SEG_DIMS, keys) from SEGK (B, SEG_DIMS, K) (relative_attention makes it: a tile of it travels as the keys do);
    keys outside [0, K) in no segment (id -1, or a zero column)."""
    if EVEN:
        ok = _below(keys, K, EVEN)
    else:
        ok = (keys >= 0) & (keys < K)
    if SEG_DIMS:
        dims = tl.arange(0, SEG_DIMS)[:, None]
        found = tl.load(SEGK + b * ssk_b + dims * K + keys[None, :], mask=ok[None, :], other=0.0)
    else:
        found = tl.load(SEGK + b * ssk_b + keys, mask=ok, other=-1)
    return found


@triton.jit
def _add_segment(s, gain, seg_q, seg_k, SEG_DIMS: tl.constexpr):
    """s (rows, keys) + gain_i where key j's segment is row i's (seg_k: _segment_keys'), and what dq needs for dgain.
    SEG_DIMS 0: compared a score, returning where they are the same (rows, keys). Else (the ids in [0, SEG_DIMS),
    16-bit operands) one more product on the tensor cores, the rows' gains one-hot by the keys' one-hot, as the SDPA
    path's extra head dims do (the gain rounded to the operands' dtype as there): returns the keys' one-hot."""
    if SEG_DIMS:
        s = tl.dot(_segment_rows(gain, seg_q, SEG_DIMS, seg_k.dtype), seg_k, s)
        found = seg_k
    else:
        found = seg_q[:, None] == seg_k[None, :]
        s += tl.where(found, gain[:, None], 0.0)
    return s, found


@triton.jit
def _tile_scores(
    qw,
    qr,
    kt,
    band_lo,
    band_mid,
    KR,
    POS,
    SEGK,
    BLK,
    gain,
    seg_q,
    b,
    n,
    m0,
    n0,
    offs_m,
    offs_n,
    offs_d,
    skr_b,
    skr_n,
    skr_d,
    skr_r,
    sp_b,
    sp_n,
    sp_m,
    sp_j,
    sp_blk,
    ssk_b,
    sbk_b,
    sbk_m,
    sbk_j,
    Q,
    K,
    R,
    D,
    qlen,
    diag,
    free,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BAND: tl.constexpr,
    HAS_SEG: tl.constexpr,
    HAS_MASK: tl.constexpr,
    RANKED: tl.constexpr,
    PREC: tl.constexpr,
    EVEN: tl.constexpr,
    eye,
    POS_ROWS: tl.constexpr,
    SEG_DIMS: tl.constexpr,
):
    """Scores of the (BLOCK_M, BLOCK_N) tile at rows m0.., keys n0.. in fp32, -inf where the key is blocked or past
    the keys; kt (BLOCK_D, BLOCK_N): its keys, transposed.

    BAND (BLOCK_M = W * BLOCK_N, W 1 or 2; B = BLOCK_N): the tile's distances run over base + c, c in [0, (W + 1) B),
    base = qlen - (m0 + BLOCK_M - 1) + n0: W + 1 chunks of B distances, chunk k at base + k B. A chunk is chunk k - 1
    of the tile B keys further on the same rows, so a loop over keys carries W chunks and multiplies one a tile.
    band_lo, band_mid: qr times the positional keys of chunks 0 and 1 (BLOCK_M, B) fp32 (band_mid unread when W is
    1). Rows a of the tile's row group g = a // B (row a' = a % B in it) read chunks W - 1 - g and W - g, at column
    c' = j - a' + B - 1 of the two side by side, as a square tile's rows read its two. Returns the scores, the chunk
    multiplied here (chunk W; in the dense form, a placeholder), its keys (BLOCK_D, B) (kt in the dense form) and
    where the row's and the key's segments are the same, or the keys' one-hot segments (_add_segment; HAS_SEG, else a
    placeholder). eye: the dense form's identity (_identity)."""
    krt_new = kt
    band_new = band_lo
    inside = _below(offs_n, K, EVEN)[None, :]  # the keys' bounds (offs_m: _rows_read's, all in bounds)
    s = tl.dot(qw, kt, input_precision=PREC)  # (BLOCK_M, BLOCK_N)
    if BAND:
        W: tl.constexpr = BLOCK_M // BLOCK_N
        tl.static_assert(BLOCK_M == W * BLOCK_N and W <= 2, "the banded form takes tiles of B or 2B rows by B keys")
        first = qlen - (m0 + BLOCK_M - 1) + n0 + W * BLOCK_N
        krt_new = _band_keys(KR + b * skr_b + n * skr_n, skr_d, skr_r, offs_d, first, R, D, BLOCK_N)
        band_new = tl.dot(qr, krt_new, input_precision=PREC)  # (BLOCK_M, B): row a, distance base + W B + j
        lo, hi = band_lo, band_new
        if W == 2:
            top = (tl.arange(0, BLOCK_M) < BLOCK_N)[:, None]  # row group 0: chunks 1 and 2; group 1: 0 and 1
            lo, hi = tl.where(top, band_mid, band_lo), tl.where(top, band_new, band_mid)
        row = tl.arange(0, BLOCK_M) % BLOCK_N  # a'
        c = tl.arange(0, BLOCK_N)[None, :] - row[:, None] + (BLOCK_N - 1)  # (a, j)'s column in the group's 2B
        s += tl.where(
            c < BLOCK_N, tl.gather(lo, tl.minimum(c, BLOCK_N - 1), 1), tl.gather(hi, tl.maximum(c - BLOCK_N, 0), 1)
        )
    else:
        pos = _pos_at(POS, b, n, offs_m[:, None], offs_n[None, :], sp_b, sp_n, sp_m, sp_j, sp_blk, POS_ROWS)
        s = _add_positional(s, tl.load(pos, mask=inside, other=0.0), eye, POS_ROWS > 0)
    same = 0
    if HAS_SEG:
        s, same = _add_segment(s, gain, seg_q, _segment_keys(SEGK, b, ssk_b, offs_n, K, SEG_DIMS, EVEN), SEG_DIMS)
    if HAS_MASK:
        s = _masked(
            s,
            BLK,
            b,
            offs_m[:, None],
            offs_n[None, :],
            inside,
            n0,
            free,
            sbk_b,
            sbk_m,
            sbk_j,
            Q,
            K,
            diag,
            RANKED,
            EVEN,
            BLOCK_N,
        )
    return tl.where(inside, s, float("-inf")), band_new, krt_new, same


@triton.jit
def _query_block(
    QW,
    QR,
    GAIN,
    SEGQ,
    b,
    n,
    bn,
    offs_m,
    offs_d,
    sq_b,
    sq_n,
    sq_m,
    ssq_b,
    Q,
    D,
    HAS_SEG: tl.constexpr,
    EVEN: tl.constexpr,
):
    """A block of queries: qw and qr (BLOCK_M, BLOCK_D), the segment gain and ids of its rows; and the block's mask
    and offsets in qw's layout (the queries' gradients are stored alike)."""
    q_ok = _below(offs_m, Q, EVEN)[:, None] & _below(offs_d, D, EVEN)[None, :]
    q_off = b * sq_b + n * sq_n + offs_m[:, None] * sq_m + offs_d[None, :]
    qw = tl.load(QW + q_off, mask=q_ok, other=0.0)
    qr = tl.load(QR + q_off, mask=q_ok, other=0.0)
    gain = tl.load(GAIN + bn * Q + offs_m, mask=_below(offs_m, Q, EVEN), other=0.0) if HAS_SEG else 0.0
    seg_q = tl.load(SEGQ + b * ssq_b + offs_m, mask=_below(offs_m, Q, EVEN), other=-2) if HAS_SEG else 0
    return qw, qr, gain, seg_q, q_ok, q_off


@triton.jit
def _output_grad(DO, LSE, DELTA, b, n, bn, rows, offs_d, so_b, so_n, so_m, q_ok, Q, live):
    """At a block of queries read at rows (_query_block's): the output's gradient (BLOCK_M, BLOCK_D), the rows'
    log-sum-exp (inf where not live, past the queries, so that their probabilities are 0) and delta = rowsum(dO * O)."""
    do = tl.load(DO + b * so_b + n * so_n + rows[:, None] * so_m + offs_d[None, :], mask=q_ok, other=0.0)
    lse = tl.load(LSE + bn * Q + rows, mask=live, other=float("inf"))
    delta = tl.load(DELTA + bn * Q + rows, mask=live, other=0.0)
    return do, lse, delta


@triton.jit
def _unmasked(BLK, b, rows, keys, ok, sbk_b, sbk_m, sbk_j, Q, K, diag, RANKED: tl.constexpr, EVEN: tl.constexpr):
    """Where the mask lets a row see a key (rows (BLOCK_M, 1), keys broadcasting against them; read only where ok).
    Dense (RANKED 0): BLK (B or 1, Q, K) uint8, 1 = blocked. RANKED 1: BLK (B or 1, Q + K) int32, the rows' ranks then
    the keys': a key is blocked where its rank is at most the row's; RANKED 2 (DIAGONAL): the same, except key
    row + diag (the content stream's own position, where its mask has no ranks of its own), one more comparison a
    score. Two vectors a tile instead of a (BLOCK_M, BLOCK_N) block of the mask."""
    first, second = _mask_read(BLK, b, rows, keys, ok, sbk_b, sbk_m, sbk_j, Q, K, RANKED, EVEN)
    return _seen(first, second, rows, keys, diag, RANKED)


@triton.jit
def _mask_read(BLK, b, rows, keys, ok, sbk_b, sbk_m, sbk_j, Q, K, RANKED: tl.constexpr, EVEN: tl.constexpr):
    """_unmasked's loads: the rows' and the keys' ranks (RANKED), or the block of the mask and a placeholder."""
    if RANKED:
        base = BLK + b * sbk_b
        first = tl.load(base + rows, mask=_below(rows, Q, EVEN), other=0)
        if EVEN:  # every key of the tile in [0, K)
            second = tl.load(base + Q + keys)
        else:
            second = tl.load(base + Q + keys, mask=(keys >= 0) & (keys < K), other=0)
    else:
        first, second = tl.load(BLK + b * sbk_b + rows * sbk_m + keys * sbk_j, mask=ok, other=1), 0
    return first, second


@triton.jit
def _seen(first, second, rows, keys, diag, RANKED: tl.constexpr):
    """_unmasked's comparison of what _mask_read loaded."""
    if RANKED == DIAGONAL:
        seen = (second > first) | (keys == rows + diag)
    elif RANKED:
        seen = second > first
    else:
        seen = first == 0
    return seen


@triton.jit
def _masked(
    s,
    BLK,
    b,
    rows,
    keys,
    ok,
    n0,
    free,
    sbk_b,
    sbk_m,
    sbk_j,
    Q,
    K,
    diag,
    RANKED: tl.constexpr,
    EVEN: tl.constexpr,
    KEYS: tl.constexpr,
):
    """s with -inf where the mask blocks the key, except in a tile of keys all before `free` (a number of leading
    keys, the memory's, that every row sees: the kernels skip the comparisons there). n0: the tile's first key; KEYS:
    its keys (the mask's loads are issued either way, so that the loop's pipeline holds them)."""
    first, second = _mask_read(BLK, b, rows, keys, ok, sbk_b, sbk_m, sbk_j, Q, K, RANKED, EVEN)
    if n0 + KEYS > free:
        s = tl.where(_seen(first, second, rows, keys, diag, RANKED), s, float("-inf"))
    return s


@triton.jit
def _band_keys(kr_base, skr_d, skr_r, offs_d, first, R, D, BLOCK: tl.constexpr):
    """The positional keys at distances first + j for j in [0, BLOCK), transposed (BLOCK_D, BLOCK); 0 past either end
    of R."""
    offs_r = first + tl.arange(0, BLOCK)
    ok = (offs_d[:, None] < D) & (offs_r[None, :] >= 0) & (offs_r[None, :] < R)
    return tl.load(kr_base + offs_d[:, None] * skr_d + offs_r[None, :] * skr_r, mask=ok, other=0.0)


@triton.jit
def _band_lo(
    qr,
    KR,
    b,
    n,
    m0,
    n0,
    offs_d,
    skr_b,
    skr_n,
    skr_d,
    skr_r,
    qlen,
    R,
    D,
    PREC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BAND: tl.constexpr,
):
    """Chunk 0 of the band of the tile at rows m0.., keys n0.. (_tile_scores; chunk k is chunk 0 of the tile k B keys
    on) and the positional keys it multiplies (BLOCK_D, B); in the dense form zeros (a placeholder)."""
    if BAND:
        first = qlen - (m0 + BLOCK_M - 1) + n0
        krt = _band_keys(KR + b * skr_b + n * skr_n, skr_d, skr_r, offs_d, first, R, D, BLOCK_N)
        return tl.dot(qr, krt, input_precision=PREC), krt
    return tl.zeros([BLOCK_M, BLOCK_N], tl.float32), tl.zeros([offs_d.shape[0], BLOCK_N], qr.dtype)


@triton.jit
def _band_chunks(
    qr,
    KR,
    b,
    n,
    m0,
    n0,
    offs_d,
    skr_b,
    skr_n,
    skr_d,
    skr_r,
    qlen,
    R,
    D,
    PREC: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BAND: tl.constexpr,
):
    """Chunks 0 and 1 of the band of the tile at rows m0.., keys n0.. and their positional keys (_band_lo's); with
    square tiles chunk 1 is chunk 0 (_tile_scores reads only chunk 0)."""
    band_lo, kr_lo = _band_lo(
        qr, KR, b, n, m0, n0, offs_d, skr_b, skr_n, skr_d, skr_r, qlen, R, D, PREC, BLOCK_M, BLOCK_N, BAND
    )
    band_mid, kr_mid = band_lo, kr_lo
    if BLOCK_M > BLOCK_N:
        band_mid, kr_mid = _band_lo(
            qr, KR, b, n, m0, n0 + BLOCK_N, offs_d, skr_b, skr_n, skr_d, skr_r, qlen, R, D, PREC, BLOCK_M, BLOCK_N, BAND
        )
    return band_lo, band_mid, kr_lo, kr_mid


@triton.jit
def _add_dkr(DKR, row, first, d, qr, offs_d, R, D, PREC: tl.constexpr):
    """DKR[row, first + j] += sum over a of d[a, j] qr[a] (atomic adds; distances outside [0, R) left out)."""
    part = tl.dot(tl.trans(d).to(qr.dtype), qr, input_precision=PREC)  # (B, BLOCK_D)
    offs_r = first + tl.arange(0, d.shape[1])
    ok = ((offs_r >= 0) & (offs_r < R))[:, None] & (offs_d < D)[None, :]
    tl.atomic_add(DKR + (row * R + offs_r[:, None]) * D + offs_d[None, :], part, mask=ok, sem="relaxed")


@triton.jit
def _kept(SEED, bn, rows, keys, Q, K, DROP_P):
    """Dropout on the probabilities: 1 / (1 - p) where the probability of (row, key) is kept, 0 where it is dropped.
    Philox numbers from the call's seed and the score's place in (B * N, Q, K), so every kernel draws the same."""
    return tl.where(tl.rand(tl.load(SEED), (bn * Q + rows) * K + keys) >= DROP_P, 1.0 / (1.0 - DROP_P), 0.0)


@triton.jit
def _attn_fwd(
    QW,
    QR,
    KEY,
    VAL,
    KR,
    POS,
    GAIN,
    SEGQ,
    SEGK,
    BLK,
    SEED,
    OUT,
    LSE,
    sq_b,
    sq_n,
    sq_m,
    sk_b,
    sk_n,
    sk_j,
    sv_b,
    sv_n,
    sv_j,
    skr_b,
    skr_n,
    skr_d,
    skr_r,
    sp_b,
    sp_n,
    sp_m,
    sp_j,
    sp_blk,
    ssq_b,
    ssk_b,
    sbk_b,
    sbk_m,
    sbk_j,
    so_b,
    so_n,
    so_m,
    N,
    Q,
    K,
    R,
    D,
    qlen,
    diag,
    free,
    DROP_P,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BAND: tl.constexpr,
    HAS_SEG: tl.constexpr,
    HAS_MASK: tl.constexpr,
    RANKED: tl.constexpr,
    PREC: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
    EVEN: tl.constexpr,
    WHOLE_ROWS: tl.constexpr,
    POS_ROWS: tl.constexpr,
    SEG_DIMS: tl.constexpr,
):
    _nonempty(Q, K)
    pid_m, bn = tl.program_id(0), tl.program_id(1)
    b, n = bn // N, bn % N
    m0 = pid_m * BLOCK_M
    offs_m, offs_d = m0 + tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_D)
    rows = _rows_read(offs_m, Q, WHOLE_ROWS)
    qw, qr, gain, seg_q, q_ok, _ = _query_block(
        QW, QR, GAIN, SEGQ, b, n, bn, rows, offs_d, sq_b, sq_n, sq_m, ssq_b, Q, D, HAS_SEG, EVEN
    )
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    band_lo, band_mid, _, _ = _band_chunks(  # tiles of 2B rows carry two chunks along the keys, square ones one
        qr, KR, b, n, m0, 0, offs_d, skr_b, skr_n, skr_d, skr_r, qlen, R, D, PREC, BLOCK_M, BLOCK_N, BAND
    )
    eye = _identity(POS, BLOCK_N)
    for n0 in range(0, K, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        kv_ok = _below(offs_n, K, EVEN)[None, :] & _below(offs_d, D, EVEN)[:, None]  # (BLOCK_D, BLOCK_N)
        kt = tl.load(KEY + b * sk_b + n * sk_n + offs_n[None, :] * sk_j + offs_d[:, None], mask=kv_ok, other=0.0)
        s, band_new, _, same = _tile_scores(
            qw,
            qr,
            kt,
            band_lo,
            band_mid,
            KR,
            POS,
            SEGK,
            BLK,
            gain,
            seg_q,
            b,
            n,
            m0,
            n0,
            rows,
            offs_n,
            offs_d,
            skr_b,
            skr_n,
            skr_d,
            skr_r,
            sp_b,
            sp_n,
            sp_m,
            sp_j,
            sp_blk,
            ssk_b,
            sbk_b,
            sbk_m,
            sbk_j,
            Q,
            K,
            R,
            D,
            qlen,
            diag,
            free,
            BLOCK_M,
            BLOCK_N,
            BAND,
            HAS_SEG,
            HAS_MASK,
            RANKED,
            PREC,
            EVEN,
            eye,
            POS_ROWS,
            SEG_DIMS,
        )
        if BLOCK_M > BLOCK_N:  # the next tile's chunks 0 and 1: this one's 1 and 2
            band_lo, band_mid = band_mid, band_new
        else:
            band_lo = band_new
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: exp(-inf - 0) = 0
        p = _exp(s, m_use[:, None])
        alpha = _exp(m_i, m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            VAL + b * sv_b + n * sv_n + offs_n[:, None] * sv_j + offs_d[None, :], mask=tl.trans(kv_ok), other=0.0
        )
        if HAS_DROPOUT:  # the normaliser l_i sums the probabilities before dropout, as softmax then dropout does
            p = p * _kept(SEED, bn, offs_m[:, None], offs_n[None, :], Q, K, DROP_P)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m_i = m_new
    has_key = l_i > 0
    out = acc / tl.where(has_key, l_i, 1.0)[:, None]
    tl.store(
        OUT + b * so_b + n * so_n + offs_m[:, None] * so_m + offs_d[None, :],
        out.to(OUT.dtype.element_ty),
        mask=_below(offs_m, Q, WHOLE_ROWS)[:, None] & q_ok,
    )
    lse = tl.where(has_key, m_i + tl.log(tl.where(has_key, l_i, 1.0)), float("inf"))
    tl.store(LSE + bn * Q + offs_m, lse, mask=offs_m < Q)


@triton.jit
def _attn_bwd_dkdv(
    QW,
    QR,
    KEY,
    VAL,
    KR,
    POS,
    GAIN,
    SEGQ,
    SEGK,
    BLK,
    SEED,
    DO,
    LSE,
    DELTA,
    DK,
    DV,
    sq_b,
    sq_n,
    sq_m,
    sk_b,
    sk_n,
    sk_j,
    sv_b,
    sv_n,
    sv_j,
    skr_b,
    skr_n,
    skr_d,
    skr_r,
    sp_b,
    sp_n,
    sp_m,
    sp_j,
    sp_blk,
    ssq_b,
    ssk_b,
    sbk_b,
    sbk_m,
    sbk_j,
    so_b,
    so_n,
    so_m,
    N,
    Q,
    K,
    R,
    D,
    qlen,
    diag,
    free,
    DROP_P,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BAND: tl.constexpr,
    HAS_SEG: tl.constexpr,
    HAS_MASK: tl.constexpr,
    RANKED: tl.constexpr,
    PREC: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
    EVEN: tl.constexpr,
    WHOLE_ROWS: tl.constexpr,
    POS_ROWS: tl.constexpr,
    SEG_DIMS: tl.constexpr,
):
    """dk and dv of one block of keys, over every block of queries. DK, DV: (B, N, K, D) contiguous.

    With more keys than rows a tile (BLOCK_N a multiple of BLOCK_M) the tile is held keys by rows, as FlashAttention
    2's dk/dv loop holds it: every product's rows are the block's keys, so the warps share the keys (each warp whole
    keys of dk and dv). The positional term of (key j, row a) is at distance base + j - a + BLOCK_M - 1 (base = qlen -
    (m0 + BLOCK_M - 1) + n0): the keys at distances base.. and base + BLOCK_M.. times qr give two (BLOCK_N, BLOCK_M)
    products that hold every distance of the tile; each score reads one of them at row j - a + BLOCK_M - 1 (or that
    less BLOCK_M)."""
    _nonempty(Q, K)
    pid_n, bn = tl.program_id(0), tl.program_id(1)
    b, n = bn // N, bn % N
    n0 = pid_n * BLOCK_N
    offs_n, offs_d = n0 + tl.arange(0, BLOCK_N), tl.arange(0, BLOCK_D)
    if BLOCK_N > BLOCK_M:
        kv_ok = _below(offs_n, K, EVEN)[:, None] & _below(offs_d, D, EVEN)[None, :]  # (BLOCK_N, BLOCK_D)
        k = tl.load(KEY + b * sk_b + n * sk_n + offs_n[:, None] * sk_j + offs_d[None, :], mask=kv_ok, other=0.0)
        v = tl.load(VAL + b * sv_b + n * sv_n + offs_n[:, None] * sv_j + offs_d[None, :], mask=kv_ok, other=0.0)
        dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        # (key j, row a): distance - base
        row_of = tl.arange(0, BLOCK_N)[:, None] - tl.arange(0, BLOCK_M)[None, :] + (BLOCK_M - 1)
        eye = _identity(POS, BLOCK_M)
        seg_k = _segment_keys(SEGK, b, ssk_b, offs_n, K, SEG_DIMS, EVEN) if HAS_SEG else 0
        for m0 in range(0, Q, BLOCK_M):
            offs_m = m0 + tl.arange(0, BLOCK_M)
            rows = _rows_read(offs_m, Q, WHOLE_ROWS)
            qw, qr, gain, seg_q, q_ok, _ = _query_block(
                QW, QR, GAIN, SEGQ, b, n, bn, rows, offs_d, sq_b, sq_n, sq_m, ssq_b, Q, D, HAS_SEG, EVEN
            )
            live = _below(offs_m, Q, WHOLE_ROWS)
            do, lse, delta = _output_grad(DO, LSE, DELTA, b, n, bn, rows, offs_d, so_b, so_n, so_m, q_ok, Q, live)
            inside = _below(offs_n, K, EVEN)[:, None]  # the keys in bounds (rows: _rows_read's)
            s = tl.dot(k, tl.trans(qw), input_precision=PREC)  # (BLOCK_N, BLOCK_M)
            if BAND:
                tl.static_assert(BLOCK_N % BLOCK_M == 0, "keys a multiple of the rows")
                base = qlen - (m0 + BLOCK_M - 1) + n0
                kr_base = KR + b * skr_b + n * skr_n
                krt = _band_keys(kr_base, skr_d, skr_r, offs_d, base, R, D, BLOCK_N)
                lo = tl.dot(tl.trans(krt), tl.trans(qr), input_precision=PREC)  # (BLOCK_N, BLOCK_M)
                krt = _band_keys(kr_base, skr_d, skr_r, offs_d, base + BLOCK_M, R, D, BLOCK_N)
                hi = tl.dot(tl.trans(krt), tl.trans(qr), input_precision=PREC)
                s += tl.where(
                    row_of < BLOCK_N,
                    tl.gather(lo, tl.minimum(row_of, BLOCK_N - 1), 0),
                    tl.gather(hi, tl.maximum(row_of - BLOCK_M, 0), 0),
                )
            else:
                pos = _pos_at(POS, b, n, rows[None, :], offs_n[:, None], sp_b, sp_n, sp_m, sp_j, sp_blk, POS_ROWS)
                s = _add_positional(s, tl.load(pos, mask=inside, other=0.0), eye, POS_ROWS > 0)
            if HAS_SEG and SEG_DIMS:  # (keys, rows): the keys' one-hot by the rows' gains
                s = tl.dot(tl.trans(seg_k), tl.trans(_segment_rows(gain, seg_q, SEG_DIMS, seg_k.dtype)), s)
            elif HAS_SEG:
                s += tl.where(seg_q[None, :] == seg_k[:, None], gain[None, :], 0.0)
            if HAS_MASK:
                s = _masked(
                    s,
                    BLK,
                    b,
                    rows[None, :],
                    offs_n[:, None],
                    inside,
                    n0,
                    free,
                    sbk_b,
                    sbk_m,
                    sbk_j,
                    Q,
                    K,
                    diag,
                    RANKED,
                    EVEN,
                    BLOCK_N,
                )
            p = _exp(tl.where(inside, s, float("-inf")), lse[None, :])  # (BLOCK_N, BLOCK_M)
            dp = tl.dot(v, tl.trans(do), input_precision=PREC)
            if HAS_DROPOUT:
                kept = _kept(SEED, bn, offs_m[None, :], offs_n[:, None], Q, K, DROP_P)
                dv += tl.dot((p * kept).to(do.dtype), do, input_precision=PREC)
                dp = dp * kept
            else:
                dv += tl.dot(p.to(do.dtype), do, input_precision=PREC)
            ds = p * (dp - delta[None, :])
            dk += tl.dot(ds.to(qw.dtype), qw, input_precision=PREC)
    else:
        kv_ok = _below(offs_n, K, EVEN)[None, :] & _below(offs_d, D, EVEN)[:, None]  # (BLOCK_D, BLOCK_N)
        kt = tl.load(KEY + b * sk_b + n * sk_n + offs_n[None, :] * sk_j + offs_d[:, None], mask=kv_ok, other=0.0)
        vt = tl.load(VAL + b * sv_b + n * sv_n + offs_n[None, :] * sv_j + offs_d[:, None], mask=kv_ok, other=0.0)
        dk = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
        eye = _identity(POS, BLOCK_N)
        for m0 in range(0, Q, BLOCK_M):
            offs_m = m0 + tl.arange(0, BLOCK_M)
            rows = _rows_read(offs_m, Q, WHOLE_ROWS)
            qw, qr, gain, seg_q, q_ok, _ = _query_block(
                QW, QR, GAIN, SEGQ, b, n, bn, rows, offs_d, sq_b, sq_n, sq_m, ssq_b, Q, D, HAS_SEG, EVEN
            )
            live = _below(offs_m, Q, WHOLE_ROWS)
            do, lse, delta = _output_grad(DO, LSE, DELTA, b, n, bn, rows, offs_d, so_b, so_n, so_m, q_ok, Q, live)
            band_lo, band_mid, _, _ = _band_chunks(  # other rows each turn: every chunk
                qr, KR, b, n, m0, n0, offs_d, skr_b, skr_n, skr_d, skr_r, qlen, R, D, PREC, BLOCK_M, BLOCK_N, BAND
            )
            s, _, _, same = _tile_scores(
                qw,
                qr,
                kt,
                band_lo,
                band_mid,
                KR,
                POS,
                SEGK,
                BLK,
                gain,
                seg_q,
                b,
                n,
                m0,
                n0,
                rows,
                offs_n,
                offs_d,
                skr_b,
                skr_n,
                skr_d,
                skr_r,
                sp_b,
                sp_n,
                sp_m,
                sp_j,
                sp_blk,
                ssk_b,
                sbk_b,
                sbk_m,
                sbk_j,
                Q,
                K,
                R,
                D,
                qlen,
                diag,
                free,
                BLOCK_M,
                BLOCK_N,
                BAND,
                HAS_SEG,
                HAS_MASK,
                RANKED,
                PREC,
                EVEN,
                eye,
                POS_ROWS,
                SEG_DIMS,
            )
            p = _exp(s, lse[:, None])  # (BLOCK_M, BLOCK_N); 0 in rows with no key (lse = inf)
            dp = tl.dot(do, vt, input_precision=PREC)
            if HAS_DROPOUT:
                kept = _kept(SEED, bn, offs_m[:, None], offs_n[None, :], Q, K, DROP_P)
                dv += tl.dot(tl.trans(p * kept).to(do.dtype), do, input_precision=PREC)
                dp = dp * kept
            else:
                dv += tl.dot(tl.trans(p).to(do.dtype), do, input_precision=PREC)
            ds = p * (dp - delta[:, None])
            dk += tl.dot(tl.trans(ds).to(qw.dtype), qw, input_precision=PREC)
    kv_off = (bn * K + offs_n[:, None]) * D + offs_d[None, :]
    kv_store = (offs_n[:, None] < K) & (offs_d[None, :] < D)
    tl.store(DK + kv_off, dk.to(DK.dtype.element_ty), mask=kv_store)
    tl.store(DV + kv_off, dv.to(DV.dtype.element_ty), mask=kv_store)


@triton.jit
def _attn_bwd_dq(
    QW,
    QR,
    KEY,
    VAL,
    KR,
    POS,
    GAIN,
    SEGQ,
    SEGK,
    BLK,
    SEED,
    DO,
    LSE,
    DELTA,
    DQW,
    DQR,
    DPOS,
    DGAIN,
    DKR,
    sq_b,
    sq_n,
    sq_m,
    sk_b,
    sk_n,
    sk_j,
    sv_b,
    sv_n,
    sv_j,
    skr_b,
    skr_n,
    skr_d,
    skr_r,
    sp_b,
    sp_n,
    sp_m,
    sp_j,
    sp_blk,
    ssq_b,
    ssk_b,
    sbk_b,
    sbk_m,
    sbk_j,
    so_b,
    so_n,
    so_m,
    N,
    Q,
    K,
    R,
    D,
    qlen,
    diag,
    free,
    DROP_P,
    kr_rows,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BAND: tl.constexpr,
    HAS_SEG: tl.constexpr,
    HAS_MASK: tl.constexpr,
    RANKED: tl.constexpr,
    PREC: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
    DKR_ATOMIC: tl.constexpr,
    EVEN: tl.constexpr,
    WHOLE_ROWS: tl.constexpr,
    POS_ROWS: tl.constexpr,
    SEG_DIMS: tl.constexpr,
):
    """dqw, dqr, dgain of one block of queries over every block of keys; in the dense form the (B, N, Q, K)
    positional scores' gradient DPOS too. The banded form's dkr is _attn_bwd_dkr's, or with DKR_ATOMIC added here
    into DKR (kr_rows, N, R, D) fp32 (zeros before) by atomic adds: for each distance, the score gradient's two parts
    (as for dqr) times qr."""
    _nonempty(Q, K)
    pid_m, bn = tl.program_id(0), tl.program_id(1)
    b, n = bn // N, bn % N
    m0 = pid_m * BLOCK_M
    offs_m, offs_d = m0 + tl.arange(0, BLOCK_M), tl.arange(0, BLOCK_D)
    rows = _rows_read(offs_m, Q, WHOLE_ROWS)
    qw, qr, gain, seg_q, q_ok, q_off = _query_block(
        QW, QR, GAIN, SEGQ, b, n, bn, rows, offs_d, sq_b, sq_n, sq_m, ssq_b, Q, D, HAS_SEG, EVEN
    )
    live = _below(offs_m, Q, WHOLE_ROWS)
    do, lse, delta = _output_grad(DO, LSE, DELTA, b, n, bn, rows, offs_d, so_b, so_n, so_m, q_ok, Q, live)
    dqw = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    dqr = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    dgain = tl.zeros([BLOCK_M], tl.float32)
    if SEG_DIMS:  # dgain by segment: the score gradient times the keys' one-hot, a product a tile
        dseg = tl.zeros([BLOCK_M, SEG_DIMS], tl.float32)
    # column j of a tile's first half of distances holds, in row a, key j + a - (B - 1) of the tile; of its second
    # half key j + a + 1. The scores' gradient read so gives dqr = sum over distances of dS times the positional key;
    # a distance is the second half of one tile and the first of the next, so its two parts are summed (carry) and
    # multiplied once
    # (with 2B rows, row a' = a % B of its row group: _tile_scores)
    j_plus_a = tl.arange(0, BLOCK_N)[None, :] + (tl.arange(0, BLOCK_M) % BLOCK_N)[:, None]
    in_lo, key_lo = j_plus_a >= BLOCK_N - 1, tl.maximum(j_plus_a - (BLOCK_N - 1), 0)
    in_hi, key_hi = j_plus_a + 1 < BLOCK_N, tl.minimum(j_plus_a + 1, BLOCK_N - 1)
    top = (tl.arange(0, BLOCK_M) < BLOCK_N)[:, None]  # with 2B rows, the row group reading chunks 1 and 2
    band_lo, band_mid, kr_lo, kr_mid = _band_chunks(
        qr, KR, b, n, m0, 0, offs_d, skr_b, skr_n, skr_d, skr_r, qlen, R, D, PREC, BLOCK_M, BLOCK_N, BAND
    )
    carry = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)  # dS's parts at the next tile's chunk 0 so far
    carry_mid = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)  # and at its chunk 1 (2B rows)
    dkr_row = b % kr_rows * N + n  # DKR's (kr_rows, N) row of this head (DKR_ATOMIC)
    eye = _identity(POS, BLOCK_N)
    for n0 in range(0, K, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        kv_ok = _below(offs_n, K, EVEN)[None, :] & _below(offs_d, D, EVEN)[:, None]  # (BLOCK_D, BLOCK_N)
        kt = tl.load(KEY + b * sk_b + n * sk_n + offs_n[None, :] * sk_j + offs_d[:, None], mask=kv_ok, other=0.0)
        vt = tl.load(VAL + b * sv_b + n * sv_n + offs_n[None, :] * sv_j + offs_d[:, None], mask=kv_ok, other=0.0)
        s, band_new, kr_new, same = _tile_scores(
            qw,
            qr,
            kt,
            band_lo,
            band_mid,
            KR,
            POS,
            SEGK,
            BLK,
            gain,
            seg_q,
            b,
            n,
            m0,
            n0,
            rows,
            offs_n,
            offs_d,
            skr_b,
            skr_n,
            skr_d,
            skr_r,
            sp_b,
            sp_n,
            sp_m,
            sp_j,
            sp_blk,
            ssk_b,
            sbk_b,
            sbk_m,
            sbk_j,
            Q,
            K,
            R,
            D,
            qlen,
            diag,
            free,
            BLOCK_M,
            BLOCK_N,
            BAND,
            HAS_SEG,
            HAS_MASK,
            RANKED,
            PREC,
            EVEN,
            eye,
            POS_ROWS,
            SEG_DIMS,
        )
        p = _exp(s, lse[:, None])
        dp = tl.dot(do, vt, input_precision=PREC)
        if HAS_DROPOUT:
            dp = dp * _kept(SEED, bn, offs_m[:, None], offs_n[None, :], Q, K, DROP_P)
        ds = p * (dp - delta[:, None])  # (BLOCK_M, BLOCK_N)
        dqw += tl.dot(ds.to(kt.dtype), tl.trans(kt), input_precision=PREC)
        if BAND:
            g_lo = tl.where(in_lo, tl.gather(ds, key_lo, 1), 0.0)  # at the row group's first chunk's distances
            g_hi = tl.where(in_hi, tl.gather(ds, key_hi, 1), 0.0)  # at its second's
            if BLOCK_M > BLOCK_N:
                d_lo = tl.where(top, 0.0, g_lo) + carry  # (BLOCK_M, B): chunk 0's distances, whole
                carry = tl.where(top, g_lo, g_hi) + carry_mid
                carry_mid = tl.where(top, g_hi, 0.0)
            else:
                d_lo = g_lo + carry
                carry = g_hi
            dqr += tl.dot(d_lo.to(kr_lo.dtype), tl.trans(kr_lo), input_precision=PREC)
            if DKR_ATOMIC:
                _add_dkr(DKR, dkr_row, qlen - (m0 + BLOCK_M - 1) + n0, d_lo, qr, offs_d, R, D, PREC)
            if BLOCK_M > BLOCK_N:
                band_lo, kr_lo, band_mid, kr_mid = band_mid, kr_mid, band_new, kr_new
            else:
                band_lo, kr_lo = band_new, kr_new
        else:
            tl.store(  # in the scores' layout: (B, N, Q, K), or the matmul's product read shifted
                _pos_at(DPOS, b, n, offs_m[:, None], offs_n[None, :], sp_b, sp_n, sp_m, sp_j, sp_blk, POS_ROWS),
                ds.to(DPOS.dtype.element_ty),
                mask=live[:, None] & _below(offs_n, K, EVEN)[None, :],
            )
        if HAS_SEG and SEG_DIMS:
            dseg += tl.dot(ds.to(kt.dtype), tl.trans(same), input_precision=PREC)
        elif HAS_SEG:
            dgain += tl.sum(tl.where(same, ds, 0.0), 1)
    if BAND:  # the last tile's chunks past its first
        dqr += tl.dot(carry.to(kr_lo.dtype), tl.trans(kr_lo), input_precision=PREC)
        last = qlen - (m0 + BLOCK_M - 1) + (tl.cdiv(K, BLOCK_N) - 1) * BLOCK_N  # its chunk 0's first distance
        if DKR_ATOMIC:
            _add_dkr(DKR, dkr_row, last + BLOCK_N, carry, qr, offs_d, R, D, PREC)
        if BLOCK_M > BLOCK_N:
            dqr += tl.dot(carry_mid.to(kr_mid.dtype), tl.trans(kr_mid), input_precision=PREC)
            if DKR_ATOMIC:
                _add_dkr(DKR, dkr_row, last + 2 * BLOCK_N, carry_mid, qr, offs_d, R, D, PREC)
    tl.store(DQW + q_off, dqw.to(DQW.dtype.element_ty), mask=live[:, None] & q_ok)
    tl.store(DQR + q_off, dqr.to(DQR.dtype.element_ty), mask=live[:, None] & q_ok)
    if HAS_SEG:
        if SEG_DIMS:  # each row's own segment's part
            dgain = tl.sum(tl.where(seg_q[:, None] == tl.arange(0, SEG_DIMS)[None, :], dseg, 0.0), 1)
        tl.store(DGAIN + bn * Q + offs_m, dgain, mask=offs_m < Q)


@triton.jit
def _attn_bwd_dkr(
    QW,
    QR,
    KEY,
    VAL,
    KR,
    GAIN,
    SEGQ,
    SEGK,
    BLK,
    SEED,
    DO,
    LSE,
    DELTA,
    DKR,
    sq_b,
    sq_n,
    sq_m,
    sk_b,
    sk_n,
    sk_j,
    sv_b,
    sv_n,
    sv_j,
    skr_b,
    skr_n,
    skr_d,
    skr_r,
    ssq_b,
    ssk_b,
    sbk_b,
    sbk_m,
    sbk_j,
    so_b,
    so_n,
    so_m,
    B,
    N,
    Q,
    K,
    R,
    D,
    qlen,
    diag,
    DROP_P,
    kr_rows,
    BLOCK: tl.constexpr,
    BLOCK_D: tl.constexpr,
    HAS_SEG: tl.constexpr,
    HAS_MASK: tl.constexpr,
    RANKED: tl.constexpr,
    PREC: tl.constexpr,
    HAS_DROPOUT: tl.constexpr,
    SEG_DIMS: tl.constexpr,
):
    """The banded form's dkr for one block of BLOCK distances r0.. of one head, summed over every query and the
    batch rows sharing these positional keys (all B when kr is shared, kr_rows = 1; its own row when kr_rows = B):
    dkr[r] = sum over (i, j) with qlen - i + j = r of dS[i, j] qr_i. For a block of queries m0.., those (i, j) lie in
    a slab of 2 BLOCK keys from j0 = r0 - qlen + m0; the scores and dP are computed over the slab and read at
    (row a, distance c) -> key j0 + a + c. No atomics: each program owns its rows of DKR (kr_rows, N, R, D) fp32."""
    pid_r, kn = tl.program_id(0), tl.program_id(1)
    kb, n = kn // N, kn % N
    r0 = pid_r * BLOCK
    offs_c, offs_a, offs_t = tl.arange(0, BLOCK), tl.arange(0, BLOCK), tl.arange(0, 2 * BLOCK)
    offs_d, offs_r = tl.arange(0, BLOCK_D), r0 + tl.arange(0, BLOCK)
    slab_of = offs_a[:, None] + offs_c[None, :]  # (BLOCK, BLOCK): the slab column of (a, c)
    dkr = tl.zeros([BLOCK, BLOCK_D], tl.float32)
    for b in range(kb, B, kr_rows):
        krb = tl.load(
            KR + b * skr_b + n * skr_n + offs_d[:, None] * skr_d + offs_r[None, :] * skr_r,
            mask=(offs_d[:, None] < D) & (offs_r[None, :] < R),
            other=0.0,
        )  # (BLOCK_D, BLOCK)
        # only the query blocks some of whose keys j = r - qlen + i fall in [0, K) for a distance r of the block
        for m0 in range(tl.maximum(qlen - r0 - BLOCK + 1, 0) // BLOCK * BLOCK, tl.minimum(Q, qlen - r0 + K), BLOCK):
            offs_m = m0 + offs_a
            qw, qr, gain, seg_q, q_ok, _ = _query_block(
                QW, QR, GAIN, SEGQ, b, n, b * N + n, offs_m, offs_d, sq_b, sq_n, sq_m, ssq_b, Q, D, HAS_SEG, False
            )
            do, lse, delta = _output_grad(
                DO, LSE, DELTA, b, n, b * N + n, offs_m, offs_d, so_b, so_n, so_m, q_ok, Q, offs_m < Q
            )
            j0 = r0 - qlen + m0
            slab_ok = ((j0 + offs_t)[None, :] >= 0) & ((j0 + offs_t)[None, :] < K) & (offs_d[:, None] < D)
            kt = tl.load(
                KEY + b * sk_b + n * sk_n + (j0 + offs_t)[None, :] * sk_j + offs_d[:, None], mask=slab_ok, other=0.0
            )  # (BLOCK_D, 2 BLOCK)
            vt = tl.load(
                VAL + b * sv_b + n * sv_n + (j0 + offs_t)[None, :] * sv_j + offs_d[:, None], mask=slab_ok, other=0.0
            )
            # the content and segment terms and the mask in the slab's layout (row a, slab column t: key j0 + t), where
            # the keys' segment ids and ranks are vectors; then read at each distance and the positional term added
            keys = j0 + offs_t
            qk = tl.dot(qw, kt, input_precision=PREC)  # (BLOCK, 2 BLOCK)
            if HAS_SEG:
                qk, _ = _add_segment(qk, gain, seg_q, _segment_keys(SEGK, b, ssk_b, keys, K, SEG_DIMS, False), SEG_DIMS)
            visible = ((keys >= 0) & (keys < K))[None, :] & (offs_m < Q)[:, None]
            if HAS_MASK:
                band = (offs_t[None, :] >= offs_a[:, None]) & (offs_t[None, :] < offs_a[:, None] + BLOCK)  # read
                visible &= _unmasked(
                    BLK,
                    b,
                    offs_m[:, None],
                    keys[None, :],
                    visible & band,
                    sbk_b,
                    sbk_m,
                    sbk_j,
                    Q,
                    K,
                    diag,
                    RANKED,
                    False,
                )
            s = tl.gather(tl.where(visible, qk, float("-inf")), slab_of, 1)  # (BLOCK, BLOCK): row a, distance c
            p = _exp(s + tl.dot(qr, krb, input_precision=PREC), lse[:, None])  # distances past R: never stored
            dp = tl.gather(tl.dot(do, vt, input_precision=PREC), slab_of, 1)
            if HAS_DROPOUT:
                dp = dp * _kept(SEED, b * N + n, offs_m[:, None], j0 + slab_of, Q, K, DROP_P)
            ds = p * (dp - delta[:, None])
            dkr += tl.dot(tl.trans(ds).to(qr.dtype), qr, input_precision=PREC)  # (BLOCK, BLOCK_D)
    tl.store(
        DKR + (kn * R + offs_r[:, None]) * D + offs_d[None, :], dkr, mask=(offs_r[:, None] < R) & (offs_d[None, :] < D)
    )


# ----------------------------------------------------------------------------------------------------------
# The operators


class Launch(NamedTuple):
    """How one kernel is launched: rows (and keys, or distances for dkr) per tile, warps per program, software-
    pipeline stages; keys, where a tile's keys are not its rows (None: square tiles): tile / 2 (the forward, dk/dv and
    dq) or, for dk/dv, a multiple of the rows (its tile then held keys by rows)."""

    tile: int
    warps: int
    stages: int
    keys: int | None = None


KERNELS = ("forward", "dk_dv", "dq", "dkr")

# Launch settings per kernel, by where the kernels run: on CUDA in bf16 or fp16, on CUDA in fp32, and in Triton's
# interpreter (16-row tiles: numpy runs small ones faster; it ignores warps and stages). Compiled for an H100 with
# every term on at `base`'s head size 64 (benchmarks/triton_resources.py, results/gpu/triton_resources_sm90_*.json):
# 64-row tiles spill 1.2-3.4 KB a thread to local memory with 4 warps, 0.5-1.4 KB with 8; 32-row tiles need at most
# 37 KiB of shared memory in bf16 (dkr at one stage) and spill nothing with 8 warps, up to 300 bytes (dq) with 4. Timed
# on an H200 in bf16 (benchmarks/bench_triton_attention.py, results/gpu/h200_triton_attention_base_*.json), 32-row
# tiles with 4 warps run one layer's attention forward and backward 1.5x faster than with 8 (10.9 against 16.5 ms at
# dropout 0, 14.9 against 21.7 at 0.1) and 1.4-1.7x faster than 64-row tiles, spills and all. fp32 keeps 8 warps and
# one stage, the setting its CUDA tests passed at, within 64 KiB of shared memory (at 64-row tiles three stages would
# need 330 KiB for dkr, past an H100's 227); dkr at one stage in any precision stays within the 99 KiB of sm_86/89
# cards. Each kernel's setting is its own (benchmarks/bench_triton_kernels.py times each kernel at each setting); dkr's
# None launches no dkr kernel: dq adds each tile's part of dkr by atomic adds (no recomputation of the scores for dkr,
# but the sum's order, and so its last bits, varies from run to run on a GPU; the dkr kernel runs instead while
# torch.use_deterministic_algorithms is on). How Triton lays the tensor-core work out (triton_resources' warps
# column): at 32 rows a tile the warps sit side by side along the keys (the P.V product, 32 x 64, is wider than
# tall), so each row's softmax is reduced across warps and P passes through shared memory, as in FlashAttention 1
# (and 8 warps on 32 keys repeat the score products); tiles of 64 rows by 32 keys (Launch(64, 4, s, keys=32)) give
# each of 4 warps 16 whole rows, as FlashAttention 2 does, on an H100 by warpgroup MMA, and spill at most 132 bytes
# (dq); dk/dv may take Launch(32, 4, s, keys=64), its tile held keys by rows (each warp 16 whole keys). Untimed so
# far: bench_triton_kernels times them.
LAUNCH = {
    "cuda": {"forward": Launch(32, 4, 3), "dk_dv": Launch(32, 4, 3), "dq": Launch(32, 4, 3), "dkr": Launch(32, 4, 1)},
    "cuda_fp32": dict.fromkeys(KERNELS, Launch(32, 8, 1)),
    "interpreter": dict.fromkeys(KERNELS, Launch(16, 1, 1)),
}


# How the content stream's positional term reaches the kernels, by where they run (LAUNCH's keys): "band", computed
# inside them a tile at a time from qr and kr (no (Q, K) or (Q, R) tensor); or "matmul", qr times kr by one batched
# torch matmul (cuBLAS on a GPU), each WINDOW_ROWS query rows times the K + WINDOW_ROWS distances they read
# (_positional_windows: about B * N * Q * (K + 65) values, where one product of every row with every distance would
# hold qlen + K a row), which the forward, dk/dv and dq kernels read shifted, by strides, as the query stream's
# scores (the dense form: no band to gather, no dkr kernel); dq writes its gradient in the same shifted layout and
# two matmuls give dqr's and dkr's parts. The product lives only inside the operator (made in the forward, made again
# in the backward), twice in the backward (its gradient), where the band keeps none. It is rounded to the inputs'
# dtype, as the SDPA path's bias is; the band adds the positional scores in fp32.
POSITIONAL = {"cuda": "band", "cuda_fp32": "band", "interpreter": "band"}


def _where(device, dtype):
    """LAUNCH's (and POSITIONAL's) key for kernels on this device in this precision."""
    if device.type != "cuda":
        return "interpreter"
    return "cuda_fp32" if dtype == torch.float32 else "cuda"


def launch_settings(device, dtype):
    """The LAUNCH table the kernels take on this device in this precision."""
    return LAUNCH[_where(device, dtype)]


def positional_form(device, dtype):
    """How the content stream's positional term reaches the kernels on this device in this precision: "band" or
    "matmul" (POSITIONAL)."""
    form = POSITIONAL[_where(device, dtype)]
    if form not in ("band", "matmul"):
        raise ValueError(f"triton_attention.POSITIONAL: {form!r} is not a form the kernels take ('band' or 'matmul')")
    return form


SEG_DIMS = 16  # one-hot dims of the segment term by a product (relative_attention's seg_classes): tl.dot's least K
# The product only where the forward, dk/dv and dq all take tiles of at least this many rows (on an H100 warpgroup
# MMA, each warp whole rows): compiled for sm_90 (benchmarks/triton_resources.py) it takes 0.70x the instructions of
# comparing the ids a score at 64 x 64 in dq, 0.85x in the forward, but at 32 x 32 (mma.sync, the warps side by side
# along the keys) 1.33x in dq, 1.08x over the four kernels.
SEG_PRODUCT_ROWS = 64

WINDOW_ROWS = 64  # rows of queries a window of the positional product (POSITIONAL "matmul") serves


class _Windows(NamedTuple):
    """The banded positional term as one batched matmul, window by window (POSITIONAL "matmul"): each block of
    WINDOW_ROWS query rows times the positional keys at the K + WINDOW_ROWS distances its rows read, so the product
    holds K + WINDOW_ROWS + 1 scores a row (padded) where one product of every row with every distance would hold
    qlen + K. full = left @ right: left (N, nb, B * rows, D), qr's blocks of rows, the last block first, the batch
    folded into a block's rows (kr shared by the batch), or (B, N, nb, rows, D) (kr per row); right (.., nb, D,
    width), kr's windows, a view of krp (kr between zero columns; window w at column (first + w) rows). The kernels
    read score (b, n, i, j), kr's distance qlen - i + j (0 outside [0, R)), at full's element b sp_b + n sp_n +
    offset + i sp_m + (i // rows) sp_blk + j: strides = (sp_b, sp_n, sp_m, 1, sp_blk); every row 16 bytes aligned in
    bf16."""

    full: torch.Tensor
    left: torch.Tensor
    right: torch.Tensor
    krp: torch.Tensor
    lead: int
    first: int
    rows: int
    strides: tuple
    offset: int

    def pointer(self, tensor):
        """The tensor (full, or its gradient) from the first score on, for the kernels' pointer."""
        return tensor.view(-1)[self.offset :]

    def zero_outside(self, grad, Q, K):
        """Zero, before dq writes each row's K scores into a gradient laid out as full, all it leaves unwritten: row a
        of a window holds them at columns rows - a .. rows - a + K - 1, so a row's others lie among the columns below
        rows and past K (zeroed whole, dq then writing over part of them), and the rows past Q (the last block's, the
        first window) hold none. The gradient's other 87% (`base`) need no clearing."""
        windows = grad.view(*grad.shape[:-2], -1, self.rows, grad.shape[-1])  # (.., nb, B or 1, rows, width)
        windows[..., : self.rows].zero_()
        windows[..., K + 1 :].zero_()
        windows.select(-4, 0)[..., Q - (windows.shape[-4] - 1) * self.rows :, :].zero_()


def _positional_windows(qr, kr, qlen, K):
    """_Windows of qr and kr for K keys: block m of queries (rows m * rows..) reads distances from qlen - (m + 1) rows
    + 1 to qlen - m rows + K - 1, so its window starts one before, at krp's column lead + qlen - (m + 1) rows, a
    multiple of rows (lead chosen so); row a of the block reads column rows - a + j of its window (never column 0, nor
    the last rows: the windows' width is at least K + rows + 1, with width - 1 a multiple of 16)."""
    B, N, Q, D = qr.shape
    kr_rows, R = kr.shape[0], kr.shape[-1]
    rows = WINDOW_ROWS
    nb = -(-Q // rows)
    width = K + rows + 1
    width += -(width - 1) % 16
    lead = max(0, nb * rows - qlen)
    lead += -(lead + qlen) % rows
    first = (lead + qlen) // rows - nb  # the window of the last block
    krp = kr.new_zeros(kr_rows, N, D, max(lead + R, (first + nb - 1) * rows + width))
    krp[..., lead : lead + R] = kr
    right = krp.unfold(-1, width, rows)[..., first : first + nb, :].transpose(2, 3)  # (kr_rows, N, nb, D, width)
    left = torch.nn.functional.pad(qr, (0, 0, 0, nb * rows - Q)).view(B, N, nb, rows, D).flip(2)
    if kr_rows == 1:  # the batch in a window's rows: one (B * rows, D) x (D, width) product a window and head
        left = left.permute(1, 2, 0, 3, 4).reshape(N, nb, B * rows, D)
        right = right[0]
        window, sp_b, sp_n = B * rows * width, rows * width, nb * B * rows * width
    else:
        window, sp_b, sp_n = rows * width, N * nb * rows * width, nb * rows * width
    full = left @ right
    strides = (sp_b, sp_n, width - 1, 1, -(window + rows * (width - 1)))
    return _Windows(full, left, right, krp, lead, first, rows, strides, (nb - 1) * window + rows)


def _launch(kernel, device, dtype, band=True):
    """(rows, keys, launch options) of one kernel's tile. dkr's setting None (dq adds dkr up) while deterministic
    algorithms are on: the dkr kernel at dk/dv's rows and warps, one stage. The band (band: the kernel computes the
    positional term inside) takes square tiles, tiles of twice as many rows as keys (the forward, dk/dv and dq) and,
    for dk/dv, keys a multiple of the rows; the dense form any tile of powers of two of at least 16 (tl.dot's
    smallest) rows and keys."""
    table = launch_settings(device, dtype)
    setting = table[kernel] or Launch(table["dk_dv"].tile, table["dk_dv"].warps, 1)
    keys = setting.tile if setting.keys is None else setting.keys
    if band:
        halved = kernel != "dkr" and setting.tile == 2 * keys
        taken = keys == setting.tile or halved or (kernel == "dk_dv" and keys % setting.tile == 0)
        rule = "keys None, half the rows for the forward, dk/dv and dq, or a multiple of the rows for dk/dv"
    else:
        taken = all(size >= 16 and size & (size - 1) == 0 for size in (setting.tile, keys))
        rule = "in the dense form rows and keys powers of two of at least 16"
    if not taken:
        raise ValueError(f"triton_attention.LAUNCH: {kernel}'s {setting} is not a tile the kernel takes ({rule})")
    return setting.tile, keys, dict(num_warps=setting.warps, num_stages=setting.stages)


def _block_d(d):
    """The head size padded to a power of two of at least 16 (tl.dot's smallest)."""
    return max(16, triton.next_power_of_2(d))


def _even(K, D, keys):
    """Whether the keys fill whole tiles, K a multiple of the tile's keys, and D is a power of two of at least 16 (its
    own block): then the forward, dk/dv and dq kernels check no bounds in their loops (EVEN; rows past the queries
    read the last query's operands, _rows_read)."""
    return K % keys == 0 and D == _block_d(D)


def _whole_rows(Q, rows):
    """Whether the queries fill whole tiles of rows (WHOLE_ROWS: no row is read twice, no store or lse masked)."""
    return Q % rows == 0


def _tiled(kernel, qw, K, flags):
    """(rows, keys, the keyword arguments of a launch of the forward, dk/dv or dq kernel): the tile of the kernel's
    setting, the head size's block, the operands' flags, whether they fill whole tiles and the launch options."""
    rows, keys, launch = _launch(kernel, qw.device, qw.dtype, flags["BAND"])
    _, _, Q, D = qw.shape
    even, whole = _even(K, D, keys), _whole_rows(Q, rows)
    return (
        rows,
        keys,
        dict(BLOCK_M=rows, BLOCK_N=keys, BLOCK_D=_block_d(D), **flags, EVEN=even, WHOLE_ROWS=whole, **launch),
    )


# The kernels as two custom operators (forward; backward) with autograd between them: torch.compile takes them whole
# (fullgraph), placing the launches in its graph, and fuses the work around them.
_FORWARD_SCHEMA = (
    "(Tensor qw, Tensor qr, Tensor k, Tensor v, Tensor? kr, Tensor? pos, Tensor? gain, Tensor? seg_q, "
    "Tensor? seg_k, Tensor? blocked, Tensor? ranks, Tensor? facts, Tensor? seed, float dropout_p, int qlen, "
    "int mask_diagonal, int seg_classes) -> (Tensor, Tensor)"
)
_BACKWARD_SCHEMA = (
    "(Tensor dout, Tensor qw, Tensor qr, Tensor k, Tensor v, Tensor? kr, Tensor? pos, Tensor? gain, "
    "Tensor? seg_q, Tensor? seg_k, Tensor? blocked, Tensor? ranks, Tensor? facts, Tensor? seed, float dropout_p, "
    "Tensor out, Tensor lse, int qlen, int mask_diagonal, int seg_classes) -> "
    "(Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)"
)


@torch.library.custom_op("xlnet_lite::relative_attention", mutates_args=(), schema=_FORWARD_SCHEMA)
def _forward(
    qw, qr, k, v, kr, pos, gain, seg_q, seg_k, blocked, ranks, facts, seed, dropout_p, qlen, mask_diagonal, seg_classes
):
    """qw, qr (B, N, Q, D); k, v (B, N, K, D); kr (B or 1, N, D, R) for the banded positional term, or pos
    (B, N, Q, K) for the dense one (the other None); gain (B, N, Q) fp32, seg_q (B, Q), seg_k (B, K) int32 or all
    three None, seg_classes as relative_attention's (0: compare the ids); blocked (B or 1, Q, K) bool, or the mask as
    ranks (B or 1, Q + K) int32 with mask_diagonal (MaskRanks), or None; ranks and facts: KernelForms' (or None),
    which decide the mask's form and seg_classes when the operator runs; seed (1,) int64, the dropout's, or None with
    dropout_p 0. Returns out (B, Q, N, D) and the rows' log-sum-exp (B, N, Q)."""
    B, N, Q, D = qw.shape
    blocked, mask_diagonal, free, gain, seg_k, seg_dims = _decided(
        qw, kr, gain, seg_k, blocked, ranks, facts, mask_diagonal, seg_classes
    )
    _check_layout(qw, qr, k, v, kr, pos, gain, blocked)
    out, lse = _forward_outputs(qw)
    if kr is not None and positional_form(qw.device, qw.dtype) == "matmul":  # the kernels' dense form, read shifted
        pos, kr = _positional_windows(qr, kr, qlen, k.shape[2]), None
    args = _operands(qw, qr, k, v, kr, pos, gain, seg_q, seg_k, blocked, seed, dropout_p, mask_diagonal, seg_dims)
    rows, _, tiled = _tiled("forward", qw, k.shape[2], args.flags)
    _attn_fwd[(triton.cdiv(Q, rows), B * N)](
        *args.pointers,
        out,
        lse,
        *args.strides,
        *_out_strides(out),
        N,
        Q,
        k.shape[2],
        args.R,
        D,
        qlen,
        args.diag,
        free,
        dropout_p,
        **tiled,
    )
    return out, lse


@_forward.register_fake
def _forward_outputs(qw, *args):
    B, N, Q, D = qw.shape
    return qw.new_empty(B, Q, N, D), qw.new_empty(B, N, Q, dtype=torch.float32)  # (B, Q, N, D): the caller's layout


@torch.library.custom_op("xlnet_lite::relative_attention_backward", mutates_args=(), schema=_BACKWARD_SCHEMA)
def _backward(
    dout,
    qw,
    qr,
    k,
    v,
    kr,
    pos,
    gain,
    seg_q,
    seg_k,
    blocked,
    ranks,
    facts,
    seed,
    dropout_p,
    out,
    lse,
    qlen,
    mask_diagonal,
    seg_classes,
):
    """dqw, dqr, dk, dv, dkr (B or 1, N, R, D) fp32, dpos, dgain (fp32); the gradients of absent operands empty."""
    B, N, Q, D = qw.shape
    blocked, mask_diagonal, free, gain, seg_k, seg_dims = _decided(
        qw, kr, gain, seg_k, blocked, ranks, facts, mask_diagonal, seg_classes
    )
    K = k.shape[2]
    dout = dout.contiguous()
    delta = (dout.float() * out.float()).sum(-1).transpose(1, 2).contiguous()  # (B, N, Q)
    dqw, dqr, dk, dv, dkr, dpos, dgain = _backward_outputs(dout, qw, qr, k, v, kr, pos, gain)
    dpos_shifted = dpos
    matmul = kr is not None and positional_form(qw.device, qw.dtype) == "matmul"
    if matmul:  # the product made again; dq writes its gradient shifted, into the product's layout
        pos = _positional_windows(qr, kr, qlen, K)
        dfull = torch.empty_like(pos.full)
        pos.zero_outside(dfull, Q, K)
        dpos_shifted = pos.pointer(dfull)
        kr_rows, R, kr = kr.shape[0], kr.shape[-1], None
    args = _operands(qw, qr, k, v, kr, pos, gain, seg_q, seg_k, blocked, seed, dropout_p, mask_diagonal, seg_dims)
    dkr_atomic = (
        kr is not None
        and launch_settings(qw.device, qw.dtype)["dkr"] is None
        and not torch.are_deterministic_algorithms_enabled()
    )
    if dkr_atomic:
        dkr.zero_()  # dq adds into it
    _, keys, tiled = _tiled("dk_dv", qw, K, args.flags)
    _attn_bwd_dkdv[(triton.cdiv(K, keys), B * N)](
        *args.pointers,
        dout,
        lse,
        delta,
        dk,
        dv,
        *args.strides,
        *_out_strides(dout),
        N,
        Q,
        K,
        args.R,
        D,
        qlen,
        args.diag,
        free,
        dropout_p,
        **tiled,
    )
    rows, _, tiled = _tiled("dq", qw, K, args.flags)
    _attn_bwd_dq[(triton.cdiv(Q, rows), B * N)](
        *args.pointers,
        dout,
        lse,
        delta,
        dqw,
        dqr,
        dpos_shifted if kr is None else lse,
        dgain if gain is not None else lse,
        dkr if kr is not None else lse,
        *args.strides,
        *_out_strides(dout),
        N,
        Q,
        K,
        args.R,
        D,
        qlen,
        args.diag,
        free,
        dropout_p,
        kr.shape[0] if kr is not None else 1,
        DKR_ATOMIC=dkr_atomic,
        **tiled,
    )
    if kr is not None and not dkr_atomic:
        qw_, qr_, k_, v_, kr_, _, *rest = args.pointers
        block, _, launch = _launch("dkr", qw.device, qw.dtype)
        _attn_bwd_dkr[(triton.cdiv(args.R, block), kr.shape[0] * N)](
            qw_,
            qr_,
            k_,
            v_,
            kr_,
            *rest,
            dout,
            lse,
            delta,
            dkr,
            *args.band_strides,
            *_out_strides(dout),
            B,
            N,
            Q,
            K,
            args.R,
            D,
            qlen,
            args.diag,
            dropout_p,
            kr.shape[0],
            BLOCK=block,
            BLOCK_D=_block_d(D),
            **{flag: value for flag, value in args.flags.items() if flag not in ("BAND", "POS_ROWS")},
            **launch,
        )
    if matmul:  # back through the product, window by window: dqr = dfull right^T, dkr = left^T dfull
        dleft = (dfull @ pos.right.transpose(-1, -2)).view(*pos.left.shape[:2], -1, pos.rows, D)
        if kr_rows == 1:  # (N, nb, B, rows, D), the batch folded into the windows' rows
            dleft = dleft.permute(2, 0, 1, 3, 4)
        dqr.copy_(dleft.flip(2).reshape(B, N, -1, D)[:, :, :Q])
        dright = pos.left.transpose(-1, -2) @ dfull  # (kr_rows or none, N, nb, D, width)
        dright = dright.view(kr_rows, N, -1, D, dright.shape[-1])
        dkrp = torch.zeros_like(pos.krp, dtype=torch.float32)  # as dkr
        for w in range(dright.shape[2]):  # the windows overlap: their parts summed, in order, in fp32
            at = (pos.first + w) * pos.rows
            dkrp[..., at : at + dright.shape[-1]] += dright[:, :, w]
        dkr.copy_(dkrp[..., pos.lead : pos.lead + R].transpose(2, 3))
    return dqw, dqr, dk, dv, dkr, dpos, dgain


@_backward.register_fake
def _backward_outputs(dout, qw, qr, k, v, kr, pos, gain, *args):
    B, N, Q, D = qw.shape
    K = k.shape[2]
    return (
        qw.new_empty(B, N, Q, D),
        qr.new_empty(B, N, Q, D),
        k.new_empty(B, N, K, D),
        v.new_empty(B, N, K, D),
        qw.new_empty(kr.shape[0], N, kr.shape[-1], D, dtype=torch.float32) if kr is not None else qw.new_empty(0),
        pos.new_empty(B, N, Q, K) if kr is None else qw.new_empty(0),
        qw.new_empty(B, N, Q, dtype=torch.float32) if gain is not None else qw.new_empty(0),
    )


def _setup_context(ctx, inputs, output):
    *tensors, dropout_p, qlen, mask_diagonal, seg_classes = inputs  # qw ... seed
    ctx.save_for_backward(*tensors, *output)
    ctx.dropout_p, ctx.qlen, ctx.mask_diagonal, ctx.seg_classes = dropout_p, qlen, mask_diagonal, seg_classes


def _gradients(ctx, dout, _dlse):
    *tensors, out, lse = ctx.saved_tensors  # qw ... seed, as _setup_context saved them
    _, _, _, _, kr, _, gain, *_ = tensors
    dqw, dqr, dk, dv, dkr, dpos, dgain = _backward(
        dout, *tensors, ctx.dropout_p, out, lse, ctx.qlen, ctx.mask_diagonal, ctx.seg_classes
    )
    grad_kr = None
    if kr is not None:  # (B or 1, N, D, R), as kr
        grad_kr = dkr.transpose(2, 3).to(kr.dtype)
    return (
        dqw,
        dqr if kr is not None else None,
        dk,
        dv,
        grad_kr,
        dpos if kr is None else None,
        dgain if gain is not None else None,
        *[None] * 10,  # seg_q ... seg_classes
    )


_forward.register_autograd(_gradients, setup_context=_setup_context)


def _check_layout(qw, qr, k, v, kr, pos, gain, blocked):
    """What the kernels assume of the operator's inputs (relative_attention gives it; a direct call may not)."""
    B = qw.shape[0]
    if qr.stride() != qw.stride() or any(t.stride(-1) != 1 for t in (qw, k, v)):
        raise ValueError("relative_attention's kernels need qr laid out as qw and unit-stride heads in qw, k and v")
    if pos is not None and not pos.is_contiguous():  # dq writes its gradient in its layout
        raise ValueError("relative_attention's kernels need contiguous positional scores (pos)")
    for name, t in (("kr", kr), ("blocked", blocked)):
        if t is not None and t.shape[0] not in (1, B):
            raise ValueError(f"relative_attention: {name} has {t.shape[0]} rows, not 1 or the batch's {B}")
    if gain is not None and not gain.is_contiguous():
        raise ValueError("relative_attention's kernels need a contiguous gain")
    if blocked is not None and blocked.dtype != torch.bool:  # ranks: MaskRanks's (B or 1, Q + K) int32, contiguous
        if blocked.dtype != torch.int32 or blocked.ndim != 2 or not blocked.is_contiguous():
            raise ValueError("relative_attention's kernels take the mask as bool (B or 1, Q, K) or as MaskRanks")
        if blocked.shape[1] != qw.shape[2] + k.shape[2]:
            raise ValueError(
                f"relative_attention: MaskRanks has {blocked.shape[1]} ranks, not Q + K = {qw.shape[2] + k.shape[2]}"
            )


class _Operands:
    """The pointers, strides and compile-time flags every kernel takes, absent operands replaced by a placeholder
    pointer with zero strides (never read: their flag is off); band_strides: the strides without the positional
    scores' (the dkr kernel's, which reads none)."""

    def __init__(self, pointers, strides, band_strides, R, diag, flags):
        self.pointers, self.strides, self.band_strides = pointers, strides, band_strides
        self.R, self.diag, self.flags = R, diag, flags


def _operands(qw, qr, k, v, kr, pos, gain, seg_q, seg_k, blocked, seed, dropout_p, mask_diagonal, seg_dims):
    """pos: the caller's (B, N, Q, K) positional scores, _Windows (the product's, POSITIONAL "matmul") or None (the
    band, with kr); seg_dims: the segment term's one-hot width (SEG_DIMS), 0 to compare the ids."""
    band = kr is not None
    stub = qw
    kr_ = kr if band else stub.new_zeros(1, 1, 1, 1)
    if isinstance(pos, _Windows):
        pos_, pos_strides, pos_rows = pos.pointer(pos.full), pos.strides, pos.rows
    else:
        pos_ = pos if not band else stub.new_zeros(1, 1, 1, 1)
        pos_strides, pos_rows = (*pos_.stride(), 0), 0
    R = kr.shape[-1] if band else 1
    has_seg = gain is not None
    ranked = blocked is not None and blocked.dtype == torch.int32
    if ranked and mask_diagonal != NO_DIAGONAL:
        ranked = DIAGONAL
    if blocked is None:
        blk = torch.zeros(1, 1, 1, dtype=torch.uint8, device=qw.device)
    elif ranked:
        blk = blocked[:, None]  # (B or 1, 1, Q + K): the kernels read its batch stride only
    else:
        blk = blocked.view(torch.uint8)
    pointers = (
        qw,
        qr,
        k,
        v,
        kr_,
        pos_,
        gain if has_seg else stub,
        seg_q if has_seg else stub,
        seg_k if has_seg else stub,
        blk,
        seed if dropout_p > 0 else stub,
    )
    before_pos = (  # the strides of the operands before the positional scores, then after them
        *qw.stride()[:3],
        *k.stride()[:3],
        *v.stride()[:3],
        0 if kr_.shape[0] == 1 else kr_.stride(0),
        *kr_.stride()[1:],
    )
    after_pos = (
        seg_q.stride(0) if has_seg else 0,
        seg_k.stride(0) if has_seg else 0,
        0 if blk.shape[0] == 1 else blk.stride(0),
        *blk.stride()[1:],
    )
    strides = (*before_pos, *pos_strides, *after_pos)
    prec = "ieee" if qw.dtype == torch.float32 else "tf32"
    flags = dict(
        BAND=band,
        HAS_SEG=has_seg,
        HAS_MASK=blocked is not None,
        RANKED=int(ranked),
        PREC=prec,
        HAS_DROPOUT=dropout_p > 0,
        POS_ROWS=pos_rows,
        SEG_DIMS=seg_dims if has_seg else 0,
    )
    return _Operands(pointers, strides, (*before_pos, *after_pos), R, mask_diagonal, flags)


def _out_strides(out):
    """(b, n, m) strides of a (B, Q, N, D) tensor."""
    return out.stride(0), out.stride(2), out.stride(1)


def _segments_by_product(qw, kr, seg_classes):
    """Whether the kernels add the segment term by the one-hot product (relative_attention's seg_classes): the ids
    counted within SEG_DIMS, 16-bit operands, and the forward, dk/dv and dq all at tiles of SEG_PRODUCT_ROWS rows or
    more (their launch settings read only then)."""
    if not seg_classes or seg_classes > SEG_DIMS or qw.dtype == torch.float32:
        return False
    band = kr is not None and positional_form(qw.device, qw.dtype) == "band"
    rows = min(_launch(kernel, qw.device, qw.dtype, band)[0] for kernel in ("forward", "dk_dv", "dq"))
    return rows >= SEG_PRODUCT_ROWS


def _forms(blocked, ranks, facts, mask_diagonal, seg_classes):
    """(mask, mask_diagonal, seg_classes, free) as the kernels take them when the operator runs: the caller's (free
    0), or where it gave KernelForms (facts; the ranks None for the block only), what they found in the data; free:
    how many leading keys every row sees (the kernels compare nothing in tiles of them)."""
    if facts is None:
        return blocked, mask_diagonal, seg_classes, 0
    ranked, diagonal, seg_classes, free = facts.tolist()  # on the CPU: no sync
    if ranked and ranks is not None:
        blocked, mask_diagonal = ranks, diagonal
    return blocked, mask_diagonal, seg_classes, free


def _decided(qw, kr, gain, seg_k, blocked, ranks, facts, mask_diagonal, seg_classes):
    """(mask, mask_diagonal, free, gain, seg_k, seg_dims) as the kernels take them (_forms, _segment_operands): one
    place, so that the forward and backward operators decide alike."""
    blocked, mask_diagonal, seg_classes, free = _forms(blocked, ranks, facts, mask_diagonal, seg_classes)
    return blocked, mask_diagonal, free, *_segment_operands(qw, kr, gain, seg_k, seg_classes)


def _segment_operands(qw, kr, gain, seg_k, seg_classes):
    """(gain, seg_k, seg_dims) as the kernels read them: with the segment term by the one-hot product, the gain's value
    as the product adds it (rounded to qw's dtype; its gradient, dq's, stays fp32) and the keys' one-hot
    (B, SEG_DIMS, K) in qw's dtype; else as given, seg_dims 0."""
    if gain is None or not _segments_by_product(qw, kr, seg_classes):
        return gain, seg_k, 0
    one_hot = torch.nn.functional.one_hot(seg_k.long(), SEG_DIMS).to(qw.dtype).transpose(1, 2).contiguous()
    return gain.to(qw.dtype).float(), one_hot, SEG_DIMS


def relative_attention(
    qw,
    k,
    v,
    *,
    qr=None,
    kr=None,
    pos=None,
    gain=None,
    seg_q=None,
    seg_k=None,
    seg_classes=None,
    blocked=None,
    forms=None,
    dropout_p=0.0,
    qlen,
):
    """softmax(qw k^T + positional term + segment term, blocked keys -inf) v, fused: see the module docstring.

    qw (B, N, Q, D): the queries plus u, scaled by 1 / sqrt(D); k, v (B, N, K, D); either qr (the queries plus v,
    scaled) with kr (B or 1, N, D, R), the projected positional keys, for the banded term of the content stream
    (query i at position i; the kernels compute it a band at a time, or with POSITIONAL "matmul" read it from one
    matmul of the two), or pos (B, N, Q, K), the positional scores already shifted; gain (B, N, Q): the scaled
    segment term a same-segment key adds, with seg_q (B, Q) and seg_k (B, K) the segment ids (or all three None);
    seg_classes: where the caller knows every id to lie in [0, seg_classes) (the model counts them), at most
    SEG_DIMS, the 16-bit kernels at tiles of SEG_PRODUCT_ROWS rows or more add the segment term by one more
    tensor-core product of one-hot dims (the gain rounded to the inputs' dtype, as the SDPA path's extra head dims
    round it) instead of comparing ids a score;
    blocked (B or 1, Q, K) bool, or the same mask as MaskRanks (mask_ranks: two vectors the kernels compare instead
    of reading a block of the mask a tile); forms: KernelForms (the model's kernel_forms), in place of seg_classes
    and with blocked the block: whether the ids are counted and the mask has ranks, decided when the kernels run (so
    that a compiled graph holds no branch on the data); dropout_p: dropout on the probabilities (after the softmax,
    inverted), its mask drawn by Philox in the kernels from a seed taken from torch's generator on qw's device.
    Returns (B, Q, N, D); rows whose keys are all blocked are 0.
    """
    if (kr is None) == (pos is None) or (kr is None) != (qr is None):
        raise ValueError("relative_attention takes the positional term as qr and kr (banded) or pos (dense)")
    if not qw.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError(
            "attn_implementation='xlnet_lite_triton' needs a CUDA device; on a CPU it runs only in "
            "Triton's interpreter (set TRITON_INTERPRET=1 before the first use; slow, for checking)"
        )
    B, N, Q, D = qw.shape
    if Q == 0 or k.shape[2] == 0:  # no query rows (an empty target_mapping) or no keys: nothing to launch (the
        return qw.new_zeros(B, Q, N, D)  # kernels assume both; a row with no key is 0)
    dtype = qw.dtype
    k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (k.to(dtype), v.to(dtype)))
    qw = qw.contiguous()
    qr = qw if qr is None else qr.to(dtype).contiguous()  # the dense form never reads it
    if kr is not None:
        kr = kr.to(dtype)
    if pos is not None:
        pos = pos.to(dtype).contiguous()
    if gain is not None:
        # the ids as int32: one comparison a score in the kernels, where int64 takes two
        gain, seg_q, seg_k = (t.contiguous() for t in (gain.float(), seg_q.to(torch.int32), seg_k.to(torch.int32)))
    seed = None
    if dropout_p > 0:
        if B * N * Q * k.shape[2] >= 2**31:
            raise ValueError(
                f"attn_implementation='xlnet_lite_triton' draws dropout by the score's index, which must "
                f"stay under 2**31: B * N * Q * K = {B * N * Q * k.shape[2]}; use fewer rows or 'sdpa'"
            )
        seed = torch.randint(2**31 - 1, (1,), device=qw.device)
    diagonal = NO_DIAGONAL
    if isinstance(blocked, MaskRanks):
        blocked, diagonal = blocked.ranks.to(torch.int32).contiguous(), blocked.diagonal
    ranks = facts = None
    if forms is not None:
        ranks, facts = forms
        ranks = None if ranks is None or blocked is None else ranks.to(torch.int32).contiguous()
    return _forward(
        qw,
        qr,
        k,
        v,
        kr,
        pos,
        gain,
        seg_q,
        seg_k,
        blocked,
        ranks,
        facts,
        seed,
        float(dropout_p),
        qlen,
        diagonal,
        seg_classes or 0,
    )[0]
