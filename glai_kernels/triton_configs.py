"""The `triton` backend's launch configurations, and the cost model that ranks them.

The dataclasses the launchers take (tests force them), the one rule for float32's dot
precision, the K splits worth trying on a GPU of a given SM count, and each kernel's candidate
configs pruned by a predicted time (glai_kernels/backends/triton.py times the few kept, through
glai_kernels/triton_tuning.py). Pure Python: nothing here needs Triton or a GPU.
Design and predictions: docs/notes/triton.md, "TF32, split-K to the SM count, a 5-second
autotune (issue 38, stop 45)".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from glai_kernels.contract import Shape


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


@dataclass(frozen=True)
class ForwardConfig:
    """Tiles of the forward GEMM (M = B, N = O, K = I*P) and the number of K slices."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3


@dataclass(frozen=True)
class GradWeightConfig:
    """Tiles of the dweight GEMM (M = O, N = I*P, K = B)."""

    block_o: int
    block_k: int
    block_b: int
    num_warps: int = 4
    num_stages: int = 3


@dataclass(frozen=True)
class GradInputsConfig:
    """Tiles of the dx/dact kernel: G tiles [block_b, block_i*block_s], O in block_o steps,
    the inputs cut into i_splits slices."""

    block_b: int
    block_i: int
    block_s: int
    block_o: int
    i_splits: int = 1
    num_warps: int = 4
    num_stages: int = 3


def float32_dot_precision() -> str:
    """tl.dot's input precision for float32 inputs, by torch's own settings: "tf32" when
    `torch.backends.cuda.matmul.allow_tf32` is True or `torch.get_float32_matmul_precision()`
    is not "highest", else "ieee" (full float32): the one rule every kernel of the triton
    backend follows (through `dot_precision`).

    Since torch 2.9 both are views of one setting, `torch.backends.cuda.matmul.fp32_precision`
    ("tf32", "ieee", or "none" when unset), and reading either raises once code has mixed the
    old and new ways of setting it; so that setting is read first when set, then each old
    name, one that raises counting as not allowing TF32."""
    matmul = torch.backends.cuda.matmul
    setting = getattr(matmul, "fp32_precision", "none")
    if setting != "none":
        return "ieee" if setting == "ieee" else "tf32"
    for allows in (lambda: matmul.allow_tf32,
                   lambda: torch.get_float32_matmul_precision() != "highest"):
        try:
            if allows():
                return "tf32"
        except RuntimeError:
            pass
    return "ieee"


def dot_precision(dtype: torch.dtype) -> str:
    """tl.dot's input precision for inputs of `dtype`: float32's by `float32_dot_precision`;
    float16's widened fp32 operands through TF32 (exact for float16 values, with fp32's
    range: docs/ARCHITECTURE.md §1); bfloat16 its own dot; float64 never calls tl.dot."""
    if dtype == torch.float32:
        return float32_dot_precision()
    return "tf32" if dtype == torch.float16 else "ieee"


def slices(tiles: int, blocks: int, sms: int, min_blocks: int = 4) -> int:
    """Slices to cut a reduction of `blocks` blocks into, so that `tiles` output tiles times
    the slices fill about two waves of `sms` processors, each slice keeping >= min_blocks."""
    return max(1, min((2 * sms) // tiles, blocks // min_blocks))


# A K slice keeps at least this many k-tiles: a shorter chain saves less latency than its
# partial's reduction costs.
MIN_CHAIN = 4


def forward_splits(tiles: int, k_tiles: int, sms: int) -> tuple[int, ...]:
    """The K splits worth trying when `tiles` (b, o) tiles cover a K of `k_tiles` k-tiles on
    `sms` SMs, the rule's first: the shortest chains that keep to one program per SM (tiles
    x split <= sms, when tiles < sms), then chains twice as long; never chains under
    MIN_CHAIN k-tiles; (1,) when the tiles fill the SMs alone. Each split is the number of
    slices its chain length cdiv(k_tiles, split) needs, so no slice is empty."""
    cap = max(1, min(sms, k_tiles // MIN_CHAIN))
    target = max(1, min(cap, sms // tiles))
    splits = []
    for wanted in (target, max(1, target // 2)):
        chain = -(-k_tiles // wanted)
        splits.append(-(-k_tiles // chain))
    return tuple(dict.fromkeys(splits))


# (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages): small M for the paper's batches of
# 16 and 32, long k-tiles for few outputs (short chains), large tiles for large batches
# (narrow ones for few outputs).
_FORWARD_TILES = (
    (16, 16, 256, 4, 4), (16, 32, 128, 4, 4), (16, 32, 256, 4, 3), (16, 64, 128, 4, 4),
    (16, 64, 256, 4, 3), (32, 64, 128, 4, 3), (64, 16, 128, 4, 3), (64, 64, 64, 4, 4),
    (64, 128, 64, 4, 3), (128, 16, 64, 4, 3), (128, 64, 64, 4, 3), (128, 128, 64, 8, 3),
    (128, 256, 64, 8, 3),
)
# (BLOCK_O, BLOCK_K, BLOCK_B, num_warps, num_stages)
_GRAD_WEIGHT_TILES = (
    (16, 128, 16, 4, 3), (16, 256, 16, 4, 3), (16, 128, 64, 4, 3), (32, 128, 32, 4, 3),
    (64, 128, 32, 4, 3), (64, 256, 32, 8, 3), (128, 128, 32, 8, 3), (128, 128, 64, 8, 3),
    (128, 256, 64, 8, 3),
)
# (BLOCK_I, BLOCK_O, num_warps, num_stages); BLOCK_B and BLOCK_S come from
# grad_inputs_config, I_SPLITS from the candidate's BLOCK_I.
_GRAD_INPUTS_TILES = ((1, 16, 4, 3), (2, 16, 4, 3), (2, 32, 4, 3), (4, 32, 8, 3), (4, 64, 8, 2))
# candidates timed per kernel at most (each may compile: most of a new shape's cost)
TOP_K = {"forward": 4, "grad_weight": 3, "grad_inputs": 3}

# The cost model's machine (a prediction that ranks candidates; the timing chooses among
# the few kept): an H100 SXM's datasheet bandwidth and peaks, a launch, and the latency of
# one k-tile step of a program's serial chain that the pipeline leaves exposed (the `cuda`
# kernel's fit was 2.1 us a tile with single-buffered loads; issue 38).
_MODEL_BYTES_S = 3.35e12
_MODEL_FLOPS = {"ieee": 67e12, "tf32": 495e12, "half": 990e12}
_MODEL_LAUNCH_S = 4e-6
_MODEL_STEP_S = 0.5e-6


def _model_s(nbytes: float, flops: float, programs: int, steps: int, sms: int,
             peak: float, launches: int = 1) -> float:
    """Predicted seconds: launches, plus the longest of moving `nbytes`, computing `flops`
    (both at the share of SMs the `programs` occupy) and `steps` chained steps per SM."""
    busy = min(1.0, programs / sms)
    waves = -(-programs // sms)
    return (launches * _MODEL_LAUNCH_S
            + max(nbytes / (_MODEL_BYTES_S * busy), flops / (peak * busy),
                  waves * steps * _MODEL_STEP_S))


def _peak(dtype: torch.dtype) -> float:
    """The model's peak for the dot this dtype runs: bf16 tensor cores for bfloat16, else
    by its `dot_precision`."""
    if dtype == torch.bfloat16:
        return _MODEL_FLOPS["half"]
    return _MODEL_FLOPS[dot_precision(dtype)]


def forward_cost(shape: Shape, config: ForwardConfig, dtype: torch.dtype, sms: int) -> float:
    """Predicted seconds of one forward with `config` (the pruning's model)."""
    b, o, k = shape.batch, shape.outputs, shape.gemm_k
    rows, cols = cdiv(b, config.block_m), cdiv(o, config.block_n)
    programs = rows * cols * config.split_k
    chain = cdiv(cdiv(k, config.split_k), config.block_k)
    nbytes = rows * o * k * dtype.itemsize + (programs * config.block_m * config.block_n * 4
                                              if config.split_k > 1 else 0)
    flops = 2 * rows * config.block_m * cols * config.block_n * k
    return _model_s(nbytes, flops, programs, chain, sms, _peak(dtype),
                    launches=2 if config.split_k > 1 else 1)


def grad_weight_cost(shape: Shape, config: GradWeightConfig, dtype: torch.dtype,
                     sms: int) -> float:
    """Predicted seconds of one dweight with `config`."""
    b, o, k = shape.batch, shape.outputs, shape.gemm_k
    outs, ks = cdiv(o, config.block_o), cdiv(k, config.block_k)
    steps = cdiv(b, config.block_b)
    nbytes = o * k * dtype.itemsize + outs * 2 * b * k * dtype.itemsize // shape.paths
    flops = 2 * outs * config.block_o * ks * config.block_k * steps * config.block_b
    return _model_s(nbytes, flops, outs * ks, steps, sms, _peak(dtype))


def grad_inputs_cost(shape: Shape, config: GradInputsConfig, dtype: torch.dtype,
                     sms: int) -> float:
    """Predicted seconds of one dx/dact with `config`."""
    b, i, p, o = shape.batch, shape.inputs, shape.paths, shape.outputs
    rows, s_blocks = cdiv(b, config.block_b), cdiv(p, config.block_s)
    i_blocks, o_steps = cdiv(i, config.block_i), cdiv(o, config.block_o)
    programs = rows * s_blocks * config.i_splits
    steps = cdiv(i_blocks, config.i_splits) * o_steps
    nbytes = rows * o * i * p * dtype.itemsize
    flops = (2 * rows * config.block_b * s_blocks * config.block_s * i_blocks * config.block_i
             * o_steps * config.block_o)
    return _model_s(nbytes, flops, programs, steps, sms, _peak(dtype))


def _fits(block: int, size: int) -> bool:
    """A tile side no larger than the size needs (tl.dot's minimum of 16 aside)."""
    return block <= max(16, next_pow2(size))


def _kept(candidates, cost, top_k: int) -> list:
    """The `top_k` cheapest candidates by `cost`, cheapest first (ties: listed order)."""
    unique = list(dict.fromkeys(candidates))
    return sorted(unique, key=cost)[:top_k]


def forward_candidates(shape: Shape, dtype: torch.dtype, sms: int) -> list[ForwardConfig]:
    """The forward configs worth timing at `shape` on `sms` SMs, best-predicted first, at most
    TOP_K["forward"]: tiles no larger than the shape needs, each with the splits
    `forward_splits` gives."""
    b, o, k = shape.batch, shape.outputs, shape.gemm_k
    configs = []
    for bm, bn, bk, warps, stages in _FORWARD_TILES:
        if not (_fits(bm, b) and _fits(bn, o)):
            continue
        tiles = cdiv(b, bm) * cdiv(o, bn)
        for split in forward_splits(tiles, cdiv(k, bk), sms):
            configs.append(ForwardConfig(bm, bn, bk, split, warps, stages))
    return _kept(configs, lambda c: forward_cost(shape, c, dtype, sms), TOP_K["forward"])


def grad_weight_candidates(shape: Shape, dtype: torch.dtype,
                           sms: int) -> list[GradWeightConfig]:
    """The dweight configs worth timing, best-predicted first, at most TOP_K["grad_weight"]."""
    configs = [GradWeightConfig(bo, bk, bb, warps, stages)
               for bo, bk, bb, warps, stages in _GRAD_WEIGHT_TILES
               if _fits(bo, shape.outputs) and _fits(bb, shape.batch)]
    return _kept(configs, lambda c: grad_weight_cost(shape, c, dtype, sms),
                 TOP_K["grad_weight"])


def grad_inputs_candidates(shape: Shape, dtype: torch.dtype, sms: int,
                           rule: GradInputsConfig) -> list[GradInputsConfig]:
    """The dx/dact configs worth timing, best-predicted first, at most TOP_K["grad_inputs"]:
    the `rule`'s batch and path blocks (its workspaces' shapes depend on them), the inputs cut
    for each candidate's input block."""
    tiles = cdiv(shape.batch, rule.block_b) * cdiv(shape.paths, rule.block_s)
    configs = [GradInputsConfig(rule.block_b, bi, rule.block_s, bo,
                                slices(tiles, cdiv(shape.inputs, bi), sms),
                                warps, stages)
               for bi, bo, warps, stages in _GRAD_INPUTS_TILES if _fits(bo, shape.outputs)]
    return _kept(configs or [rule], lambda c: grad_inputs_cost(shape, c, dtype, sms),
                 TOP_K["grad_inputs"])
