"""`triton` (sparse): Triton kernels that walk the kept-path layout (layout.py), one output
element per program lane, no atomics.

Four kernels; every program writes its own output elements, summing in a fixed order, so
the same inputs give the same bits run after run:

- `_forward_kernel`, program (o, batch block): walks output o's groups g in
  [output_ptr[o], output_ptr[o+1]), and in each group its entries BLOCK_E at a time:
      Zg[b, g] = sum_k v[k] x[b, i_k]          y[b, o] = sum_g act[b, s_g] Zg[b, g]
  With SAVE it also stores Zg (the op asks when act needs a gradient).
- `_dvalues_kernel`, program (block of BLOCK_E entries): loops over the batch,
      dv[k] = sum_b dy[b, o_k] act[b, s_k] x[b, i_k].
- `_dx_kernel`, program (i, batch block): walks input i's entries through the reverse
  order input_ptr / input_entries, o_k and s_k through entry_groups,
      dx[b, i] = sum_k v[k] dy[b, o_k] act[b, s_k].
- `_dact_kernel`, program (s, batch block): walks path s's groups through path_ptr /
  path_groups, dact[b, s] = sum_g dy[b, o_g] Zg[b, g], with Zg read from the forward's
  saved copy, or recomputed group by group (the forward's loop) when absent.

Layout in memory: the kernels gather one batch column per entry (x[:, i_k], act[:, s_k],
dy[:, o_k]), so the launchers hand them x, act and dy transposed, [n, B] with the batch
contiguous: a column is one contiguous run of B values (one or two memory transactions on a
GPU) instead of B values I apart. The saved Zg is [G, B] for the same reason. Results are
written straight into [B, n] (each written once, so their stride costs little).

Numerics: every load is converted to the accumulation dtype (float32; float64 for float64)
before any arithmetic, and each result is rounded once to the inputs' dtype; Zg is kept in
float32 for half inputs. Triton's interpreter (TRITON_INTERPRET=1 before import) runs the
same kernels on CPU; it truncates when converting to bfloat16, so bfloat16 results are
rounded to nearest even by the dense backend's `_rounded` (EMULATE_BF16). Every offset that
multiplies an index by a size is int64 (o·B, g·B, i·B, rows·O...), so B·G, B·I past 2^31
address correctly. Design notes and the GPU prediction: docs/notes/sparse.md, "triton (sparse)".
"""

# Kernel arguments follow Triton's convention (compile-time constants in capitals) and the
# size names B, I, P, O, K, so the lowercase-argument and ambiguous-name rules are off.
# ruff: noqa: N803, E741

from __future__ import annotations

from dataclasses import dataclass

import torch

# triton and tl as the dense backend imported them: None where triton is missing, in which
# case this backend still registers and says why it cannot run (triton_availability)
from glai_kernels.backends.triton import (
    _jit,
    _on_device,
    _pow2,
    _rounded,
    _tile,
    interpreted,
    tl,
    triton,
    triton_availability,
)
from glai_kernels.contract import accumulation_dtype
from glai_kernels.registry import Backend
from glai_kernels.sparse.layout import KeptIndex
from glai_kernels.sparse.registry import SPARSE_ESTIMATOR, groups_by_batch

# ----------------------------------------------------------------------------------------
# Kernels (xt, actt, dyt are [n, B] with the batch contiguous; y, dx, dact, [B, n])


@_jit
def _item_rows(ptr, B, BLOCK_B: tl.constexpr):
    """The frame of a per-item program (item, batch block), item an output, input or path:
    (item (int64), rows [BLOCK_B] (int64), rows < B, lo, hi) with [lo, hi) = [ptr[item],
    ptr[item + 1]), the item's span of the layout list that `ptr` indexes."""
    item = tl.cast(tl.program_id(0), tl.int64)
    rows = _tile(tl.program_id(1), BLOCK_B)
    return item, rows, rows < B, tl.load(ptr + item), tl.load(ptr + item + 1)


@_jit
def _group_sum(xt_ptr, values_ptr, inputs_ptr, group_ptr, g, rows, row_mask, B,
               BLOCK_B: tl.constexpr, BLOCK_E: tl.constexpr, ACC: tl.constexpr):
    """Zg[rows, g] of group g (int64) spread over BLOCK_E lanes, [BLOCK_B, BLOCK_E] in ACC,
    entries in increasing k: the forward and the dact kernel without a saved Zg sum each
    group this one way, so both see the same bits."""
    z = tl.zeros((BLOCK_B, BLOCK_E), dtype=ACC)
    k_hi = tl.load(group_ptr + g + 1)
    for k0 in range(tl.load(group_ptr + g), k_hi, BLOCK_E):
        ks = tl.cast(k0, tl.int64) + tl.arange(0, BLOCK_E)
        mask = ks < k_hi
        i = tl.load(inputs_ptr + ks, mask=mask, other=0).to(tl.int64)
        v = tl.load(values_ptr + ks, mask=mask, other=0.0).to(ACC)
        xv = tl.load(xt_ptr + i[None, :] * B + rows[:, None],
                     mask=row_mask[:, None] & mask[None, :], other=0.0).to(ACC)
        z += xv * v[None, :]
    return z


@_jit
def _forward_kernel(
    xt_ptr, actt_ptr, values_ptr, inputs_ptr, group_ptr, group_paths_ptr, output_ptr,
    y_ptr, zg_ptr, B, O,
    BLOCK_B: tl.constexpr, BLOCK_E: tl.constexpr, SAVE: tl.constexpr,
    ACC: tl.constexpr, OUT: tl.constexpr, EMULATE_BF16: tl.constexpr,
):
    """y[rows, o] for program (o, batch block); with SAVE, Zg [G, B] of o's groups too."""
    o, rows, row_mask, g_lo, g_hi = _item_rows(output_ptr, B, BLOCK_B)
    y = tl.zeros((BLOCK_B,), dtype=ACC)
    for g in range(g_lo, g_hi):
        g64 = tl.cast(g, tl.int64)
        z = _group_sum(xt_ptr, values_ptr, inputs_ptr, group_ptr, g64, rows, row_mask, B,
                       BLOCK_B, BLOCK_E, ACC)
        s = tl.load(group_paths_ptr + g64).to(tl.int64)
        a = tl.load(actt_ptr + s * B + rows, mask=row_mask, other=0.0).to(ACC)
        # act times the group's whole sum, not each lane's: a lane without an entry holds 0,
        # and an infinite act times it gave NaN where the sum has ±inf
        zg = tl.sum(z, axis=1)
        y += a * zg
        if SAVE:
            tl.store(zg_ptr + g64 * B + rows, zg, mask=row_mask)
    tl.store(y_ptr + rows * O + o, _rounded(y, OUT, EMULATE_BF16), mask=row_mask)


@_jit
def _dvalues_kernel(
    dyt_ptr, xt_ptr, actt_ptr, inputs_ptr, entry_groups_ptr, group_outputs_ptr,
    group_paths_ptr, dv_ptr, B, K,
    BLOCK_B: tl.constexpr, BLOCK_E: tl.constexpr,
    ACC: tl.constexpr, OUT: tl.constexpr, EMULATE_BF16: tl.constexpr,
):
    """dv[ks] for program (entry block): sum over the batch, BLOCK_B rows at a time."""
    ks = _tile(tl.program_id(0), BLOCK_E)
    mask = ks < K
    i = tl.load(inputs_ptr + ks, mask=mask, other=0).to(tl.int64)
    g = tl.load(entry_groups_ptr + ks, mask=mask, other=0)
    o = tl.load(group_outputs_ptr + g, mask=mask, other=0).to(tl.int64)
    s = tl.load(group_paths_ptr + g, mask=mask, other=0).to(tl.int64)
    acc = tl.zeros((BLOCK_B, BLOCK_E), dtype=ACC)
    for b0 in range(0, B, BLOCK_B):
        rows = tl.cast(b0, tl.int64) + tl.arange(0, BLOCK_B)
        tile_mask = (rows < B)[:, None] & mask[None, :]
        d = tl.load(dyt_ptr + o[None, :] * B + rows[:, None], mask=tile_mask, other=0.0)
        a = tl.load(actt_ptr + s[None, :] * B + rows[:, None], mask=tile_mask, other=0.0)
        xv = tl.load(xt_ptr + i[None, :] * B + rows[:, None], mask=tile_mask, other=0.0)
        acc += d.to(ACC) * a.to(ACC) * xv.to(ACC)
    dv = tl.sum(acc, axis=0)
    tl.store(dv_ptr + ks, _rounded(dv, OUT, EMULATE_BF16), mask=mask)


@_jit
def _dx_kernel(
    dyt_ptr, actt_ptr, values_ptr, input_ptr, input_entries_ptr, entry_groups_ptr,
    group_outputs_ptr, group_paths_ptr, dx_ptr, B, I,
    BLOCK_B: tl.constexpr, BLOCK_E: tl.constexpr,
    ACC: tl.constexpr, OUT: tl.constexpr, EMULATE_BF16: tl.constexpr,
):
    """dx[rows, i] for program (i, batch block), over input i's entries BLOCK_E at a time."""
    inp, rows, row_mask, e_lo, e_hi = _item_rows(input_ptr, B, BLOCK_B)
    acc = tl.zeros((BLOCK_B, BLOCK_E), dtype=ACC)
    for e0 in range(e_lo, e_hi, BLOCK_E):
        es = tl.cast(e0, tl.int64) + tl.arange(0, BLOCK_E)
        mask = es < e_hi
        k = tl.load(input_entries_ptr + es, mask=mask, other=0)
        v = tl.load(values_ptr + k, mask=mask, other=0.0).to(ACC)
        g = tl.load(entry_groups_ptr + k, mask=mask, other=0)
        o = tl.load(group_outputs_ptr + g, mask=mask, other=0).to(tl.int64)
        s = tl.load(group_paths_ptr + g, mask=mask, other=0).to(tl.int64)
        tile_mask = row_mask[:, None] & mask[None, :]
        d = tl.load(dyt_ptr + o[None, :] * B + rows[:, None], mask=tile_mask, other=0.0)
        a = tl.load(actt_ptr + s[None, :] * B + rows[:, None], mask=tile_mask, other=0.0)
        acc += d.to(ACC) * a.to(ACC) * v[None, :]
    dx = tl.sum(acc, axis=1)
    tl.store(dx_ptr + rows * I + inp, _rounded(dx, OUT, EMULATE_BF16), mask=row_mask)


@_jit
def _dact_kernel(
    dyt_ptr, xt_ptr, values_ptr, inputs_ptr, group_ptr, group_outputs_ptr, path_ptr,
    path_groups_ptr, zg_ptr, dact_ptr, B, P,
    BLOCK_B: tl.constexpr, BLOCK_E: tl.constexpr, SAVED: tl.constexpr,
    ACC: tl.constexpr, OUT: tl.constexpr, EMULATE_BF16: tl.constexpr,
):
    """dact[rows, s] for program (s, batch block), over path s's groups: SAVED reads Zg
    [G, B] BLOCK_E groups at a time, else each group's Zg is recomputed in turn."""
    s, rows, row_mask, j_lo, j_hi = _item_rows(path_ptr, B, BLOCK_B)
    if SAVED:
        acc = tl.zeros((BLOCK_B, BLOCK_E), dtype=ACC)
        for j0 in range(j_lo, j_hi, BLOCK_E):
            js = tl.cast(j0, tl.int64) + tl.arange(0, BLOCK_E)
            mask = js < j_hi
            g = tl.load(path_groups_ptr + js, mask=mask, other=0).to(tl.int64)
            o = tl.load(group_outputs_ptr + g, mask=mask, other=0).to(tl.int64)
            tile_mask = row_mask[:, None] & mask[None, :]
            d = tl.load(dyt_ptr + o[None, :] * B + rows[:, None], mask=tile_mask, other=0.0)
            z = tl.load(zg_ptr + g[None, :] * B + rows[:, None], mask=tile_mask, other=0.0)
            acc += d.to(ACC) * z.to(ACC)
        dact = tl.sum(acc, axis=1)
    else:
        dact = tl.zeros((BLOCK_B,), dtype=ACC)
        for j in range(j_lo, j_hi):
            g = tl.load(path_groups_ptr + tl.cast(j, tl.int64)).to(tl.int64)
            # the forward's own sum of this group, so dact sees the Zg the forward saved; dy
            # times that whole sum, as the forward's act (an empty lane times inf is NaN)
            z = _group_sum(xt_ptr, values_ptr, inputs_ptr, group_ptr, g, rows, row_mask, B,
                           BLOCK_B, BLOCK_E, ACC)
            o = tl.load(group_outputs_ptr + g).to(tl.int64)
            d = tl.load(dyt_ptr + o * B + rows, mask=row_mask, other=0.0).to(ACC)
            dact += d * tl.sum(z, axis=1)
    tl.store(dact_ptr + rows * P + s, _rounded(dact, OUT, EMULATE_BF16), mask=row_mask)


# ----------------------------------------------------------------------------------------
# Launch configuration


@dataclass(frozen=True)
class SparseConfig:
    """Block sizes shared by the four kernels: block_b batch rows per program (dvalues
    loops over the batch in such blocks), block_e entries (or groups) per loop step."""

    block_b: int
    block_e: int
    num_warps: int = 4




def sparse_config(batch: int, dtype: torch.dtype) -> SparseConfig:
    """Blocks by rule. The interpreter pays per program and per loop step whatever the block
    size, so its blocks are large. On a GPU a batch block of at most 64 rows keeps a program's
    gathers to one or two 128-byte lines per entry, and 32 entries cover a typical group at
    the paper's kept fractions (B1 at μ = 0.86%: 11 entries per group) in one step."""
    if interpreted():
        return SparseConfig(_pow2(batch, 1, 64), 128)
    block_b = _pow2(batch, 16, 64)
    return SparseConfig(block_b, 32 if dtype != torch.float64 else 16,
                        num_warps=4 if block_b * 32 >= 1024 else 2)


# ----------------------------------------------------------------------------------------
# Launchers: the backend's forward and backward (inputs contiguous, one dtype and device)


def _numerics(dtype: torch.dtype) -> dict:
    emulate = interpreted() and dtype == torch.bfloat16
    out = {torch.float32: tl.float32, torch.float64: tl.float64, torch.float16: tl.float16,
           torch.bfloat16: tl.bfloat16}[dtype]
    return {"ACC": tl.float64 if dtype == torch.float64 else tl.float32, "OUT": out,
            "EMULATE_BF16": emulate}


def _batch_contiguous(t: torch.Tensor) -> torch.Tensor:
    """[B, n] -> [n, B] contiguous: each feature's batch column in one run."""
    return t.t().contiguous()


def _forward(x, act, values, index: KeptIndex, save: bool, config: SparseConfig | None):
    batch, outputs = x.shape[0], index.shape[0]
    config = config or sparse_config(batch, x.dtype)
    y = torch.empty(batch, outputs, dtype=x.dtype, device=x.device)
    zg = (torch.empty(index.groups, batch, dtype=accumulation_dtype(x.dtype), device=x.device)
          if save else y)  # y stands in for a pointer the kernel never touches
    with _on_device(x):
        _forward_kernel[(outputs, triton.cdiv(batch, config.block_b))](
            _batch_contiguous(x), _batch_contiguous(act), values, index.inputs,
            index.group_ptr, index.group_paths, index.output_ptr, y, zg, batch, outputs,
            BLOCK_B=config.block_b, BLOCK_E=config.block_e, SAVE=save,
            num_warps=config.num_warps, **_numerics(x.dtype))
    return y, zg


def triton_forward(x: torch.Tensor, act: torch.Tensor, values: torch.Tensor,
                   index: KeptIndex, *, config: SparseConfig | None = None) -> torch.Tensor:
    """x [B, I], act [B, P], values [K] -> y [B, O] in x's dtype. `config` forces the
    blocks (tests); None follows `sparse_config`."""
    return _forward(x, act, values, index, False, config)[0]


def triton_forward_saving(x: torch.Tensor, act: torch.Tensor, values: torch.Tensor,
                          index: KeptIndex, *, config: SparseConfig | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """As triton_forward, also returning Zg [G, B] (float32 for half inputs) for dact."""
    return _forward(x, act, values, index, True, config)


def triton_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    act: torch.Tensor,
    values: torch.Tensor,
    index: KeptIndex,
    needs: tuple[bool, bool, bool],
    saved: torch.Tensor | None = None,
    *,
    config: SparseConfig | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """dy [B, O] -> (dx [B, I], dact [B, P], dvalues [K]), only those in `needs`
    (need_x, need_act, need_values); `saved` is triton_forward_saving's Zg [G, B], without
    which dact recomputes the group sums."""
    need_x, need_act, need_values = needs
    batch, inputs = x.shape
    paths = act.shape[1]
    config = config or sparse_config(batch, x.dtype)
    numerics = _numerics(x.dtype)
    blocks = {"BLOCK_B": config.block_b, "BLOCK_E": config.block_e,
              "num_warps": config.num_warps, **numerics}
    batch_blocks = triton.cdiv(batch, config.block_b)
    dyt, actt = _batch_contiguous(dy), _batch_contiguous(act)
    xt = _batch_contiguous(x) if need_values or (need_act and saved is None) else None
    dx = dact = dvalues = None
    with _on_device(x):
        if need_values:
            dvalues = torch.empty_like(values)
            _dvalues_kernel[(triton.cdiv(index.nnz, config.block_e),)](
                dyt, xt, actt, index.inputs, index.entry_groups, index.group_outputs,
                index.group_paths, dvalues, batch, index.nnz, **blocks)
        if need_x:
            dx = torch.empty_like(x)
            _dx_kernel[(inputs, batch_blocks)](
                dyt, actt, values, index.input_ptr, index.input_entries, index.entry_groups,
                index.group_outputs, index.group_paths, dx, batch, inputs, **blocks)
        if need_act:
            dact = torch.empty_like(act)
            _dact_kernel[(paths, batch_blocks)](
                dyt, xt if xt is not None else dyt, values, index.inputs, index.group_ptr,
                index.group_outputs, index.path_ptr, index.path_groups,
                saved if saved is not None else dyt, dact, batch, paths,
                SAVED=saved is not None, **blocks)
    return dx, dact, dvalues


# ----------------------------------------------------------------------------------------
# Registration

SPARSE_ESTIMATOR.register(Backend(
    name="triton",
    forward=triton_forward,
    backward=triton_backward,
    forward_saving=triton_forward_saving,
    saved_shape=groups_by_batch,
    devices=("cpu", "cuda"),
    description="Triton kernels walking the kept-path layout: one program per (output, "
                "batch block), gathers for the gradients, no atomics (on CPU only under "
                "TRITON_INTERPRET=1)",
    auto_priority={"cuda": 20},
    availability=triton_availability,
))
