"""`triton`: fused Triton kernels that never store [B, I, P] or [B, O, P] in global memory.

The op as one GEMM (docs/ARCHITECTURE.md §2): M = B, N = O, K = I*P, with the left operand
U[b, k] = x[b, k // P] * act[b, k % P] formed tile by tile in registers, and weight viewed
[O, I*P] (contiguous in k). Three kernels, each shape in the comments is a tile in registers:

- `_forward_kernel`: y [B, O]. Tiles [BLOCK_M, BLOCK_N] over (b, o), a loop over K feeding
  tl.dot with U [BLOCK_M, BLOCK_K] and weight [BLOCK_K, BLOCK_N]. K can be cut into SPLIT_K
  slices (the paper's heads at B = 16 have one or two (b, o) tiles and K ~ 50K..400K): the
  slices' partials (fp32; fp64 for float64) meet in a workspace, by atomic adds, or, when
  `torch.are_deterministic_algorithms_enabled()`, written to [SPLIT_K, B, O] and summed in a
  fixed order by `_sum_slices_kernel`.
- `_grad_weight_kernel`: dweight [O, I*P] = dy^T @ U, the GEMM M = O, N = I*P, K = B, with U
  formed on the fly again.
- `_grad_inputs_kernel`: dx and dact from one tile G [BLOCK_B, BLOCK_I*BLOCK_S] = dy @ weight
  (its GEMM K is O), G[b, (i, s)] = sum_o dy[b, o] weight[o, i, s]:
      dx[b, i]   = sum_s G[b, i, s] act[b, s]      dact[b, s] = sum_i G[b, i, s] x[b, i]
  so weight is read once for both, and the two gradients cost one GEMM, not two. A program
  owns a block of paths s and a slice of the inputs i; dx partials per path block and dact
  partials per input slice go to small fp32 workspaces, summed in a fixed order.

Numerics: loads are converted to the accumulation dtype (fp32, or fp64 for fp64) before any
arithmetic, so U = x·act is formed in fp32; for tl.dot it is rounded to bf16 for bfloat16
(bf16 tensor cores; bf16 has fp32's range) and to TF32 for float16 (TF32 tensor cores: fp16's
mantissa with fp32's range, so a product past 65504 cannot overflow), fp32 accumulation;
fp32 inputs go through TF32 only where torch's own settings allow it
(glai_kernels/triton_configs.py's `float32_dot_precision`, the one rule every kernel here
follows, through `dot_precision`), full fp32 ("ieee") otherwise.
float64 never calls tl.dot (its support depends on the Triton version and the GPU): it takes
a multiply-and-sum path (`FMA`), on the GPU and in the interpreter alike.

Triton's interpreter (TRITON_INTERPRET=1, set before this module is imported) runs the same
kernels on the CPU, for verification. It cannot do bfloat16 arithmetic, tl.dot or rounding
(it truncates), so with `EMULATE_BF16` bfloat16 values live in fp32 registers, rounded to
bfloat16 to-nearest-even by bit arithmetic: the same values a GPU's bf16 tl.dot sees. Its
tl.dot ignores the input precision (numpy's matmul in full fp32), so with `EMULATE_TF32` a
"tf32" dot's operands are rounded to TF32 (10 mantissa bits, to nearest even) first. The
interpreter is not thread-safe (one process-wide interpreter builder holds the program id
being run, and triton.language is patched while a kernel runs): call this backend from one
thread at a time under TRITON_INTERPRET=1.

Every index that is multiplied by a stride is int64 (`_tile`), so B*I, O*I*P, B*O*P past
2**31 address correctly. Design notes and predictions: docs/notes/triton.md, "Triton backend".
"""

# Kernel arguments follow Triton's convention (compile-time constants in capitals) and the
# the contract's size names (docs/ARCHITECTURE.md §1) B, I, P, O, K, so the lowercase-argument and
# ambiguous-name rules are off.
# ruff: noqa: N803, E741

from __future__ import annotations

import contextlib
import functools
import math

import torch

from glai_kernels import triton_configs as configs
from glai_kernels import triton_tuning
from glai_kernels.contract import Shape
from glai_kernels.registry import Backend, device_present, register
from glai_kernels.triton_configs import (
    ForwardConfig,
    GradInputsConfig,
    GradWeightConfig,
    dot_precision,
    forward_splits,
)
from glai_kernels.triton_configs import slices as _slices

try:
    import triton
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
except ImportError:  # the backend still registers and says why it cannot run
    triton = tl = InterpretedFunction = None


def _jit(fn):
    """triton.jit; under the interpreter, `_Interpreted` (fewer re-patchings of triton.language)."""
    if triton is None:
        return fn
    jitted = triton.jit(fn)
    if _Interpreted is not None and type(jitted) is InterpretedFunction:
        jitted.__class__ = _Interpreted
    return jitted


def _interpreted_class():
    """InterpretedFunction whose launches patch triton.language fewer times, where this
    triton's interpreter has what it rests on (else None: plain triton.jit).

    A launch patches triton.language for the whole grid and restores it at its end; the
    interpreter then patches again at every call of a jitted function inside (triton's own
    tl.sum and tl.zeros, this module's helpers), though nothing undoes a patch before the
    launch ends: the same attributes set to the same wrappers, ≈ 2.8 ms a call, 31% of a
    profile of the interpreted sparse fuzzer (its cases 21% faster without: docs/notes/ci.md,
    "Triton's interpreter without the repeated patching (stop 55)"). During one of this
    module's launches a call patches only the first time for its function's module; then it
    is the interpreter's own call: the rewritten function, its errors wrapped the same way.
    After the launch the interpreter's call is as it was."""
    from triton.runtime import interpreter

    needed = (hasattr(InterpretedFunction, "rewrite") and hasattr(InterpretedFunction, "run")
              and hasattr(interpreter, "_patch_lang")
              and hasattr(interpreter, "InterpreterError"))
    if not needed:
        return None
    plain_call = InterpretedFunction.__call__

    def call_patching_once(self, *args, **kwargs):
        patched = _launch_patched[-1]
        if self.fn.__module__ not in patched:
            interpreter._patch_lang(self.fn)
            patched.add(self.fn.__module__)
        try:
            return self.rewrite()(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e

    class Interpreted(InterpretedFunction):
        def run(self, *args, **kwargs):
            _launch_patched.append(set())
            InterpretedFunction.__call__ = call_patching_once
            try:
                return super().run(*args, **kwargs)
            finally:
                _launch_patched.pop()
                if not _launch_patched:
                    InterpretedFunction.__call__ = plain_call

    return Interpreted


# the modules whose jitted functions have patched triton.language in each running launch (a
# stack: a launch inside a launch gets its own)
_launch_patched: list[set[str]] = []
_Interpreted = _interpreted_class() if InterpretedFunction is not None else None


# ----------------------------------------------------------------------------------------
# Device helpers


@_jit
def _tile(index, BLOCK: tl.constexpr):
    """int64 offsets index*BLOCK + [0, BLOCK): cast before the multiply, so block index
    times block size, and everything later multiplied by a stride, cannot wrap at 2**31."""
    return tl.cast(index, tl.int64) * BLOCK + tl.arange(0, BLOCK)


@_jit
def _rounded(v, DTYPE: tl.constexpr, EMULATE_BF16: tl.constexpr):
    """v rounded to DTYPE. Under EMULATE_BF16, v (fp32) rounded to bfloat16 to nearest even,
    kept in fp32: the interpreter's own fp32->bf16 conversion truncates."""
    if EMULATE_BF16:
        bits = v.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    else:
        return v.to(DTYPE)


@_jit
def _tf32(v):
    """fp32 v rounded to TF32 (10 mantissa bits) to nearest even, kept in fp32: what a TF32
    tensor core reads of an fp32 operand, for the interpreter, whose tl.dot ignores the
    precision. Inf and NaN stay as they are."""
    bits = v.to(tl.uint32, bitcast=True)
    rounded = (bits + 0xFFF + ((bits >> 13) & 1)) & 0xFFFFE000
    special = (bits & 0x7F800000) == 0x7F800000
    return tl.where(special, bits, rounded).to(tl.float32, bitcast=True)


@_jit
def _mma(acc, a, b, FMA: tl.constexpr, PRECISION: tl.constexpr, EMULATE_TF32: tl.constexpr):
    """acc + a @ b for tiles a [M, K], b [K, N]; FMA multiplies and sums without tl.dot;
    EMULATE_TF32 rounds a "tf32" dot's operands as a GPU would (the interpreter)."""
    if FMA:
        return acc + tl.sum(a[:, :, None] * b[None, :, :], axis=1)
    elif EMULATE_TF32:
        return tl.dot(_tf32(a), _tf32(b), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc, input_precision=PRECISION)


@_jit
def _store_tile(ptr, value, rows, cols, row_mask, col_mask, N, piece, B, PARTIAL: tl.constexpr,
                OUT: tl.constexpr, EMULATE_BF16: tl.constexpr):
    """Store the tile `value` [R, C] (ACC) at [rows, cols] of a row-major [B, N] result, masked:
    rounded once to OUT, or, PARTIAL, as it is into slice `piece` of an [S, B, N] workspace
    whose slices are summed in a fixed order after (`_sum_slices_kernel`)."""
    offsets = rows[:, None] * N + cols[None, :]
    mask = row_mask[:, None] & col_mask[None, :]
    if PARTIAL:
        tl.store(ptr + tl.cast(piece, tl.int64) * B * N + offsets, value, mask=mask)
    else:
        tl.store(ptr + offsets, _rounded(value, OUT, EMULATE_BF16), mask=mask)


@_jit
def _outer_tile(x_ptr, act_ptr, rows, ks, B, I, P, k_end, ACC: tl.constexpr):
    """U[b, k] = x[b, k // P] * act[b, k % P] for rows [R] (int64) and ks [C] (int64): an
    [R, C] tile in ACC, zero outside b < B, k < k_end. Never leaves registers."""
    inputs = ks // P
    paths = ks - inputs * P
    mask = (rows < B)[:, None] & (ks < k_end)[None, :]
    xv = tl.load(x_ptr + rows[:, None] * I + inputs[None, :], mask=mask, other=0.0)
    av = tl.load(act_ptr + rows[:, None] * P + paths[None, :], mask=mask, other=0.0)
    return xv.to(ACC) * av.to(ACC)


# ----------------------------------------------------------------------------------------
# Kernels


@_jit
def _forward_kernel(
    x_ptr, act_ptr, w_ptr, y_ptr, ws_ptr,
    B, I, P, O, K,
    SPLIT_K,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr, DETERMINISTIC: tl.constexpr,
    ACC: tl.constexpr, DOT: tl.constexpr, OUT: tl.constexpr,
    FMA: tl.constexpr, PRECISION: tl.constexpr, EMULATE_BF16: tl.constexpr,
    EMULATE_TF32: tl.constexpr,
):
    """y [B, O] = U [B, K] @ weight[O, K]^T, program (m, n, slice) -> y tile [BM, BN].

    Unless SPLIT (SPLIT_K == 1) it stores y. Otherwise each of the SPLIT_K K slices' fp32
    partial goes to ws: atomically added into ws [B, O] (zeroed), or, DETERMINISTIC, stored at
    ws[slice] of [SPLIT_K, B, O]. SPLIT_K is a runtime argument, so the splits a shape tries
    share one compiled kernel (compiling is most of a new shape's tuning cost).
    """
    rows = _tile(tl.program_id(0), BLOCK_M)  # b
    cols = _tile(tl.program_id(1), BLOCK_N)  # o
    piece = tl.program_id(2)
    # each slice a whole number of k-tiles, cdiv(k-tiles, SPLIT_K) of them
    k_per_split = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    k_lo = tl.cast(piece, tl.int64) * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    col_mask = cols < O
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=ACC)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        u = _outer_tile(x_ptr, act_ptr, rows, ks, B, I, P, k_hi, ACC)
        w = tl.load(w_ptr + cols[None, :] * K + ks[:, None],
                    mask=(ks < k_hi)[:, None] & col_mask[None, :], other=0.0)
        acc = _mma(acc, _rounded(u, DOT, EMULATE_BF16), w.to(DOT), FMA, PRECISION, EMULATE_TF32)
    mask = (rows < B)[:, None] & col_mask[None, :]
    offsets = rows[:, None] * O + cols[None, :]
    if not SPLIT:
        tl.store(y_ptr + offsets, _rounded(acc, OUT, EMULATE_BF16), mask=mask)
    elif DETERMINISTIC:
        tl.store(ws_ptr + tl.cast(piece, tl.int64) * B * O + offsets, acc, mask=mask)
    else:
        tl.atomic_add(ws_ptr + offsets, acc, mask=mask)


@_jit
def _sum_slices_kernel(ws_ptr, out_ptr, N, SLICES, BLOCK: tl.constexpr,
                       OUT: tl.constexpr, EMULATE_BF16: tl.constexpr):
    """out [N] = sum over ws [SLICES, N] in slice order 0, 1, ...: a fixed order, so the
    same inputs give the same bits."""
    offsets = _tile(tl.program_id(0), BLOCK)
    mask = offsets < N
    acc = tl.load(ws_ptr + offsets, mask=mask, other=0.0)
    for piece in range(1, SLICES):
        acc += tl.load(ws_ptr + tl.cast(piece, tl.int64) * N + offsets, mask=mask, other=0.0)
    tl.store(out_ptr + offsets, _rounded(acc, OUT, EMULATE_BF16), mask=mask)


@_jit
def _grad_weight_kernel(
    dy_ptr, x_ptr, act_ptr, dw_ptr,
    B, I, P, O, K,
    BLOCK_O: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_B: tl.constexpr,
    ACC: tl.constexpr, DOT: tl.constexpr, OUT: tl.constexpr,
    FMA: tl.constexpr, PRECISION: tl.constexpr, EMULATE_BF16: tl.constexpr,
    EMULATE_TF32: tl.constexpr,
):
    """dweight [O, K] = dy^T [O, B] @ U [B, K], program (o, k) -> tile [BO, BK], loop over B."""
    outs = _tile(tl.program_id(0), BLOCK_O)
    ks = _tile(tl.program_id(1), BLOCK_K)
    out_mask = outs < O
    acc = tl.zeros((BLOCK_O, BLOCK_K), dtype=ACC)
    for block in range(0, tl.cdiv(B, BLOCK_B)):
        rows = _tile(block, BLOCK_B)
        dy_t = tl.load(dy_ptr + rows[None, :] * O + outs[:, None],
                       mask=(rows < B)[None, :] & out_mask[:, None], other=0.0)
        u = _outer_tile(x_ptr, act_ptr, rows, ks, B, I, P, K, ACC)
        acc = _mma(acc, dy_t.to(DOT), _rounded(u, DOT, EMULATE_BF16), FMA, PRECISION,
                   EMULATE_TF32)
    tl.store(dw_ptr + outs[:, None] * K + ks[None, :], _rounded(acc, OUT, EMULATE_BF16),
             mask=out_mask[:, None] & (ks < K)[None, :])


@_jit
def _grad_inputs_kernel(
    dy_ptr, w_ptr, x_ptr, act_ptr, dx_ptr, dact_ptr,
    B, I, P, O, K,
    BLOCK_B: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_S: tl.constexpr,
    BLOCK_O: tl.constexpr, I_SPLITS: tl.constexpr,
    NEED_X: tl.constexpr, NEED_ACT: tl.constexpr,
    DX_PARTIAL: tl.constexpr, DACT_PARTIAL: tl.constexpr,
    ACC: tl.constexpr, DOT: tl.constexpr, OUT: tl.constexpr,
    FMA: tl.constexpr, PRECISION: tl.constexpr, EMULATE_BF16: tl.constexpr,
    EMULATE_TF32: tl.constexpr,
):
    """dx [B, I] and dact [B, P] from G = dy @ weight, a [BB, BI*BS] tile at a time.

    Program (b block, s block, i slice) walks its slice's input blocks; for each it forms G
    over the loop on O, then adds sum_s G*act to dx and sum_i G*x to dact. With several path
    blocks (DX_PARTIAL) dx goes to ws [P blocks, B, I]; with several input slices
    (DACT_PARTIAL) dact goes to ws [I_SPLITS, B, P]; both are summed in a fixed order after.
    """
    rows = _tile(tl.program_id(0), BLOCK_B)
    s_block = tl.program_id(1)
    piece = tl.program_id(2)
    paths = _tile(s_block, BLOCK_S)
    row_mask = rows < B
    path_mask = paths < P
    act_tile = tl.load(act_ptr + rows[:, None] * P + paths[None, :],
                       mask=row_mask[:, None] & path_mask[None, :], other=0.0).to(ACC)
    dact = tl.zeros((BLOCK_B, BLOCK_S), dtype=ACC)
    # the flat k of the [BI, BS] (input, path) tile, row-major: kk = i_local * BS + s_local
    kk = tl.arange(0, BLOCK_I * BLOCK_S)
    kk_paths = tl.cast(s_block, tl.int64) * BLOCK_S + kk % BLOCK_S
    i_blocks = tl.cdiv(I, BLOCK_I)
    per_split = tl.cdiv(i_blocks, I_SPLITS)
    first = piece * per_split
    last = tl.minimum(first + per_split, i_blocks)
    for i_block in range(first, last):
        inputs = _tile(i_block, BLOCK_I)
        kk_inputs = tl.cast(i_block, tl.int64) * BLOCK_I + kk // BLOCK_S
        ks = kk_inputs * P + kk_paths
        k_mask = (kk_inputs < I) & (kk_paths < P)
        g = tl.zeros((BLOCK_B, BLOCK_I * BLOCK_S), dtype=ACC)
        for o_block in range(0, tl.cdiv(O, BLOCK_O)):
            outs = _tile(o_block, BLOCK_O)
            out_mask = outs < O
            dy = tl.load(dy_ptr + rows[:, None] * O + outs[None, :],
                         mask=row_mask[:, None] & out_mask[None, :], other=0.0)
            w = tl.load(w_ptr + outs[:, None] * K + ks[None, :],
                        mask=out_mask[:, None] & k_mask[None, :], other=0.0)
            g = _mma(g, dy.to(DOT), w.to(DOT), FMA, PRECISION, EMULATE_TF32)
        g3 = tl.reshape(g, (BLOCK_B, BLOCK_I, BLOCK_S))
        input_mask = inputs < I
        if NEED_X:
            dx_part = tl.sum(g3 * act_tile[:, None, :], axis=2)  # [BB, BI]
            _store_tile(dx_ptr, dx_part, rows, inputs, row_mask, input_mask, I, s_block, B,
                        DX_PARTIAL, OUT, EMULATE_BF16)
        if NEED_ACT:
            x_tile = tl.load(x_ptr + rows[:, None] * I + inputs[None, :],
                             mask=row_mask[:, None] & input_mask[None, :], other=0.0).to(ACC)
            dact += tl.sum(g3 * x_tile[:, :, None], axis=1)  # [BB, BS]
    if NEED_ACT:
        _store_tile(dact_ptr, dact, rows, paths, row_mask, path_mask, P, piece, B, DACT_PARTIAL,
                    OUT, EMULATE_BF16)


# ----------------------------------------------------------------------------------------
# Launch configurations


# Under the interpreter each program instance costs ~10 ms whatever its size, so tiles are
# large; a pretend SM count of 4 still makes the heuristics split K on the paper's heads, so
# the default test run goes through the split paths too.
_INTERPRETER_SMS = 4


def interpreted() -> bool:
    """Whether the kernels run in Triton's interpreter (TRITON_INTERPRET=1 at import)."""
    return InterpretedFunction is not None and isinstance(_forward_kernel, InterpretedFunction)


def _pow2(n: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, triton.next_power_of_2(n)))


def _sms(device: torch.device) -> int:
    if interpreted() or device.type != "cuda":
        return _INTERPRETER_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def forward_config(shape: Shape, dtype: torch.dtype, device: torch.device) -> ForwardConfig:
    """The forward's tiles by rule (the interpreter, float64, deterministic mode; tests)."""
    b, o, k = shape.batch, shape.outputs, shape.gemm_k
    if interpreted():
        # Few, large tiles: the interpreter pays per program and per loop step, and tl.dot's
        # minimum of 16 binds only on a GPU. float64's multiply-and-sum holds a
        # [bm, bk, bn] product, so its tiles stay smaller.
        wide = dtype != torch.float64
        bm, bn = _pow2(b, 1, 64), _pow2(o, 1, 128 if wide else 32)
        bk, warps = _pow2(k, 1, 4096 if wide else 256), 4
    elif dtype == torch.float64:  # multiply-and-sum: the [bm, bk, bn] product lives in registers
        bm, bn, bk, warps = 16, 16, 16, 4
    else:
        bm, bn = _pow2(b, 16, 128), _pow2(o, 32, 128)
        bk, warps = (64 if dtype != torch.float32 else 32), (8 if bm * bn >= 128 * 128 else 4)
    tiles = triton.cdiv(b, bm) * triton.cdiv(o, bn)
    split = forward_splits(tiles, triton.cdiv(k, bk), _sms(device))[0]
    return ForwardConfig(bm, bn, bk, split, warps)


def grad_weight_config(shape: Shape, dtype: torch.dtype, device: torch.device) -> GradWeightConfig:
    """dweight's tiles by rule; its grid, O/BO x I*P/BK, is large for every paper head."""
    b, o = shape.batch, shape.outputs
    if interpreted():
        wide = dtype != torch.float64
        return GradWeightConfig(_pow2(o, 1, 128 if wide else 32), 8192 if wide else 256,
                                _pow2(b, 1, 32))
    if dtype == torch.float64:
        return GradWeightConfig(16, 16, 16)
    block_o = _pow2(o, 16, 128)
    return GradWeightConfig(block_o, 128, 32 if dtype != torch.float32 else 16,
                            num_warps=8 if block_o == 128 else 4)


def grad_inputs_config(shape: Shape, dtype: torch.dtype, device: torch.device) -> GradInputsConfig:
    """dx/dact tiles by rule; i_splits cuts the inputs when the (b, s) tiles are too few."""
    b, i, p, o = shape.batch, shape.inputs, shape.paths, shape.outputs
    if interpreted():
        wide = dtype != torch.float64
        bb, bs, bo = _pow2(b, 1, 32), _pow2(p, 1, 128), _pow2(o, 1, 128 if wide else 32)
        bi = max(1, min(triton.next_power_of_2(i), (4096 if wide else 256) // bs))
        warps = 4
    elif dtype == torch.float64:
        bb, bi, bs, bo, warps = 16, 1, 16, 16, 4
    else:
        bb, bs, bo, warps = _pow2(b, 16, 64), _pow2(p, 16, 64), _pow2(o, 16, 32), 4
        bi = max(1, 128 // bs)
    tiles = triton.cdiv(b, bb) * triton.cdiv(p, bs)
    splits = _slices(tiles, triton.cdiv(i, bi), _sms(device))
    return GradInputsConfig(bb, bi, bs, bo, splits, warps)


# ----------------------------------------------------------------------------------------
# Autotuning (GPU, float16/bfloat16/float32, deterministic algorithms off): candidates from
# the shape and the SM count, pruned by a cost model to a few (glai_kernels/triton_configs.py),
# timed once per shape and kept on disk (glai_kernels/triton_tuning.py)


def forward_candidates(shape: Shape, dtype: torch.dtype, device: torch.device) -> list:
    """The forward configs worth timing at `shape` on `device`, best-predicted first."""
    return configs.forward_candidates(shape, dtype, _sms(device))


def grad_weight_candidates(shape: Shape, dtype: torch.dtype, device: torch.device) -> list:
    """The dweight configs worth timing at `shape` on `device`, best-predicted first."""
    return configs.grad_weight_candidates(shape, dtype, _sms(device))


def grad_inputs_candidates(shape: Shape, dtype: torch.dtype, device: torch.device) -> list:
    """The dx/dact configs worth timing at `shape` on `device`, best-predicted first."""
    return configs.grad_inputs_candidates(shape, dtype, _sms(device),
                                          grad_inputs_config(shape, dtype, device))


def _bench_s(fn) -> float:
    """Seconds per call of fn on the GPU (the median of a short do_bench, its first call
    compiling); a config that cannot compile or launch here (out of shared memory or
    registers) times as infinite, so it is never chosen."""
    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import OutOfResources
    from triton.testing import do_bench

    try:
        return do_bench(fn, warmup=5, rep=20) / 1e3
    except (OutOfResources, CompilationError):
        return math.inf


@functools.cache
def _device_name(device: torch.device) -> str:
    return (torch.cuda.get_device_name(device) if device.type == "cuda"
            else f"{device.type} (Triton's interpreter)")


def _tuned(kernel: str, x: torch.Tensor, weight: torch.Tensor, candidates, time_one,
           **extra) -> object:
    """The chosen config of `kernel` for these inputs (glai_kernels/triton_tuning.py). The
    key: the shape with the batch as its power-of-two bucket (a config chosen for the
    bucket fits every batch in it), the dtype and dot precision, the device's name and
    Triton's version, and `extra`. `candidates(shape, dtype, device)` lists the configs to
    time for the bucket's shape; it runs only at a key this process has not met."""
    batch, inputs, paths, outputs, _ = _sizes(x, weight)
    bucket = triton.next_power_of_2(batch)
    key = {"B": bucket, "I": inputs, "P": paths, "O": outputs,
           "dtype": str(x.dtype).removeprefix("torch."),
           "precision": _numerics(x.dtype)["PRECISION"], "device": _device_name(x.device),
           "triton": triton.__version__, **extra}
    shape = Shape(bucket, inputs, paths, outputs)
    return triton_tuning.choose(kernel, key, lambda: candidates(shape, x.dtype, x.device),
                                time_one)


def _config(kernel: str, x: torch.Tensor, weight: torch.Tensor, candidates, by_rule, time_one,
            **extra) -> object:
    """The config `kernel` runs with when the caller forces none: on a GPU, the one `_tuned`
    chooses among `candidates` (timed by `time_one`); otherwise (the interpreter, float64,
    deterministic mode: `_autotunes`) `by_rule(shape, dtype, device)`."""
    if _autotunes(x.dtype):
        return _tuned(kernel, x, weight, candidates, time_one, **extra)
    return by_rule(Shape(*_sizes(x, weight)[:4]), x.dtype, x.device)


# ----------------------------------------------------------------------------------------
# Launchers: triton_forward and triton_backward (inputs contiguous, one dtype and device)


def _numerics(dtype: torch.dtype) -> dict:
    """The kernels' dtype constants for inputs of `dtype`."""
    emulate = interpreted() and dtype == torch.bfloat16
    out = {torch.float32: tl.float32, torch.float64: tl.float64, torch.float16: tl.float16,
           torch.bfloat16: tl.bfloat16}[dtype]
    # float16's tl.dot operands are fp32 on TF32 tensor cores: TF32 keeps float16's 10-bit
    # mantissa (weight converts exactly) with fp32's range, so a formed product x·act past
    # 65504 stays finite where a float16 operand would overflow (docs/ARCHITECTURE.md §1).
    wide = dtype == torch.float16
    precision = dot_precision(dtype)  # float32's follows torch's settings
    return {
        "ACC": tl.float64 if dtype == torch.float64 else tl.float32,
        "DOT": tl.float32 if emulate or wide else out,
        "OUT": out,
        "FMA": dtype == torch.float64,
        "PRECISION": precision,
        "EMULATE_BF16": emulate,
        # the interpreter's tl.dot is full fp32 whatever the precision: round as a GPU would
        "EMULATE_TF32": interpreted() and precision == "tf32",
    }


def _accumulation(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _autotunes(dtype: torch.dtype) -> bool:
    """Timing-based choices only on a GPU, and never when results must repeat bitwise:
    another process could time differently and pick another split, so other bits."""
    return (not interpreted() and dtype != torch.float64
            and not torch.are_deterministic_algorithms_enabled())


def _on_device(t: torch.Tensor):
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


def _sum_slices(ws: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """out = ws.sum(0) in slice order, rounded once to out's dtype; ws [S, *out.shape]."""
    n = out.numel()
    block = _pow2(n, 16, 1 << 16) if interpreted() else 1024
    numerics = _numerics(out.dtype)
    _sum_slices_kernel[(triton.cdiv(n, block),)](
        ws, out, n, ws.shape[0], BLOCK=block, OUT=numerics["OUT"],
        EMULATE_BF16=numerics["EMULATE_BF16"])
    return out


def _sizes(x: torch.Tensor, weight: torch.Tensor) -> tuple[int, int, int, int, int]:
    batch, inputs = x.shape
    outputs, _, paths = weight.shape
    return batch, inputs, paths, outputs, inputs * paths


def triton_forward(x: torch.Tensor, act: torch.Tensor, weight: torch.Tensor, *,
                   config: ForwardConfig | None = None) -> torch.Tensor:
    """x [B, I], act [B, P], weight [O, I, P] -> y [B, O] in x's dtype.

    `config` forces the tiles and the K split (tests); None tunes on a GPU (once per shape,
    kept on disk) and follows `forward_config` under the interpreter, for float64 and in
    deterministic mode.
    """
    sizes = batch, _, _, outputs, _ = _sizes(x, weight)
    numerics = _numerics(x.dtype)
    acc = _accumulation(x.dtype)
    deterministic = torch.are_deterministic_algorithms_enabled()
    with _on_device(x):
        if config is None:
            config = _config(
                "forward", x, weight, forward_candidates, forward_config,
                lambda c: _bench_s(lambda: triton_forward(x, act, weight, config=c)))
        y = torch.empty(batch, outputs, dtype=x.dtype, device=x.device)
        ws = y  # not touched when K is not split
        if config.split_k > 1 and deterministic:
            ws = torch.empty(config.split_k, batch, outputs, dtype=acc, device=x.device)
        elif config.split_k > 1:
            ws = torch.zeros(batch, outputs, dtype=acc, device=x.device)
            if x.dtype == acc:
                y = ws
        grid = (triton.cdiv(batch, config.block_m), triton.cdiv(outputs, config.block_n),
                config.split_k)
        _forward_kernel[grid](
            x, act, weight, y, ws, *sizes, config.split_k,
            BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
            SPLIT=config.split_k > 1, DETERMINISTIC=deterministic,
            num_warps=config.num_warps, num_stages=config.num_stages, **numerics)
        if config.split_k > 1 and deterministic:
            _sum_slices(ws, y)
        elif config.split_k > 1 and y is not ws:
            y.copy_(ws)
        return y


def _grad_weight(dy, x, act, weight, config: GradWeightConfig | None) -> torch.Tensor:
    sizes = _, _, _, outputs, k = _sizes(x, weight)
    if config is None:
        config = _config(
            "grad_weight", x, weight, grad_weight_candidates, grad_weight_config,
            lambda c: _bench_s(lambda: _grad_weight(dy, x, act, weight, c)))
    numerics = _numerics(x.dtype)
    dweight = torch.empty_like(weight)
    grid = (triton.cdiv(outputs, config.block_o), triton.cdiv(k, config.block_k))
    _grad_weight_kernel[grid](
        dy, x, act, dweight, *sizes,
        BLOCK_O=config.block_o, BLOCK_K=config.block_k, BLOCK_B=config.block_b,
        num_warps=config.num_warps, num_stages=config.num_stages, **numerics)
    return dweight


def _grad_inputs(dy, x, act, weight, need_x: bool, need_act: bool,
                 config: GradInputsConfig | None):
    sizes = batch, inputs, paths, _, _ = _sizes(x, weight)
    if config is None:
        config = _config(
            "grad_inputs", x, weight, grad_inputs_candidates, grad_inputs_config,
            lambda c: _bench_s(lambda: _grad_inputs(dy, x, act, weight, need_x, need_act, c)),
            need_x=need_x, need_act=need_act)
    numerics = _numerics(x.dtype)
    acc = _accumulation(x.dtype)
    s_blocks = triton.cdiv(paths, config.block_s)
    dx_partial = need_x and s_blocks > 1
    dact_partial = need_act and config.i_splits > 1

    def buffer(needed: bool, partial: bool, slices: int, cols: int) -> torch.Tensor:
        if partial:
            return torch.empty(slices, batch, cols, dtype=acc, device=x.device)
        if needed:
            return torch.empty(batch, cols, dtype=x.dtype, device=x.device)
        return dy  # a valid pointer the kernel never writes through

    dx = buffer(need_x, dx_partial, s_blocks, inputs)
    dact = buffer(need_act, dact_partial, config.i_splits, paths)
    grid = (triton.cdiv(batch, config.block_b), s_blocks, config.i_splits)
    common = {"BLOCK_B": config.block_b, "BLOCK_S": config.block_s, "I_SPLITS": config.i_splits,
              "NEED_X": need_x, "NEED_ACT": need_act, "DX_PARTIAL": dx_partial,
              "DACT_PARTIAL": dact_partial, **numerics}
    _grad_inputs_kernel[grid](
        dy, weight, x, act, dx, dact, *sizes, BLOCK_I=config.block_i,
        BLOCK_O=config.block_o, num_warps=config.num_warps, num_stages=config.num_stages,
        **common)
    if dx_partial:
        dx = _sum_slices(dx, torch.empty_like(x))
    if dact_partial:
        dact = _sum_slices(dact, torch.empty_like(act))
    return (dx if need_x else None), (dact if need_act else None)


def triton_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    act: torch.Tensor,
    weight: torch.Tensor,
    needs: tuple[bool, bool, bool],
    *,
    weight_config: GradWeightConfig | None = None,
    inputs_config: GradInputsConfig | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """dy [B, O] -> (dx [B, I], dact [B, P], dweight [O, I, P]), each only if in `needs`
    (need_x, need_act, need_weight); dx and dact share one kernel. Configs as in
    `triton_forward`."""
    need_x, need_act, need_weight = needs
    dx = dact = dweight = None
    with _on_device(x):
        if need_weight:
            dweight = _grad_weight(dy, x, act, weight, weight_config)
        if need_x or need_act:
            dx, dact = _grad_inputs(dy, x, act, weight, need_x, need_act, inputs_config)
    return dx, dact, dweight


# ----------------------------------------------------------------------------------------
# Registration


def triton_availability(device_type: str) -> str | None:
    """Why Triton kernels (this backend's, or the sparse op's) cannot run on a device type
    here, or None."""
    if triton is None:
        return "triton is not installed"
    if device_type == "cpu":
        if interpreted():
            return None
        return ("on CPU the triton backend runs only in Triton's interpreter: set "
                "TRITON_INTERPRET=1 before importing glai_kernels")
    reason = device_present(device_type)
    if reason is not None:
        return reason
    if interpreted():
        return ("TRITON_INTERPRET=1 was set before glai_kernels was imported, so the kernels "
                "run in Triton's CPU interpreter; unset it to run them on the GPU")
    if torch.version.hip is not None:
        return "ROCm is not supported: the tile configs and the TF32 switch are NVIDIA's"
    capability = torch.cuda.get_device_capability()
    if capability < (8, 0):
        return ("needs an NVIDIA GPU of compute capability 8.0 or newer (bfloat16 tl.dot), "
                f"found {capability[0]}.{capability[1]}")
    return None


register(Backend(
    name="triton",
    forward=triton_forward,
    backward=triton_backward,
    devices=("cpu", "cuda"),
    description="fused Triton kernels: x⊗act tiles formed in registers, split-K, one "
                "kernel for dx and dact (on CPU only under TRITON_INTERPRET=1)",
    # Below `cuda` (20) and `torch` (10) where no measured table decides: timed on an H200
    # at the paper's batch it won no cell, 1.7-3.9x `cuda`'s time and 0.86-2.0x `torch`'s
    # in `both` (same call), and its first call at a shape tunes where torch's needs nothing
    # (docs/notes/cuda.md, "An H200 lease: the cuda tests, the whole heads sweep and
    # `triton` at the paper's batch (stop 33)"). Still listed, so a table that measures it
    # winning a cell picks it there.
    auto_priority={"cuda": 5},
    availability=triton_availability,
))
