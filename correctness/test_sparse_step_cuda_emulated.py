"""The fused sparse training step's CUDA kernels, run on the CPU.

`glai_kernels/csrc/cuda/sparse_step_kernels.cu` (dvalues and the Adam/AdamW update of the kept
values in one kernel; dbias and its update in another) is compiled as C++ against the CUDA
emulation of `correctness/cuda_emulation/` (a block's threads are fibers run in rounds between
barriers; see test_sparse_cuda_emulated.py) and driven through the C launchers the binding
calls. Over several steps it must follow the ordinary step, autograd through the sparse op
(`torch` backend) and torch.optim.Adam / AdamW, to within test_kernel_adam.py's tolerance (a
few units in the last place per operation, amplified by 1/sqrt(v)), at awkward sizes (B = 1,
13, 37: one, a partial and two lane tiles; more entries than one block takes; groups longer
than a block's rows), weight decay on and off; and give the same bits in two runs.

What this checks: the indexing, the lane sums' order and barriers, the update's formula and
scalars, the step count read through its pointer (the device-side count a CUDA graph needs).
What it cannot: the hardware; the `cuda` cases of test_fused_step.py's GPU runs do.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from emulated_build import build_emulated
from sparse_cuda_abi import DTYPES, INVALID_VALUE, SparseProblem, ptr

from glai_kernels.sparse import estimator, from_dense

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "glai_kernels" / "csrc" / "cuda" / "sparse_step_kernels.cu"

STEPS = 4
# as test_kernel_adam.py: after a few updates, a few ulps per operation amplified by 1/sqrt(v)
TOL = {torch.float32: {"rtol": 1e-5, "atol": 1e-6}, torch.float64: {"rtol": 1e-12, "atol": 1e-13}}


class AdamStep(ctypes.Structure):
    """sparse_step_kernels.cuh's glai_adam_step."""

    _fields_ = [(name, ctypes.c_double) for name in ("lr", "beta1", "beta2", "weight_decay",
                                                     "eps", "step")]
    _fields_ += [("step_on_device", ctypes.c_void_p), ("decoupled", ctypes.c_int)]


@pytest.fixture(scope="module")
def kernels(tmp_path_factory) -> ctypes.CDLL:
    lib = build_emulated(SOURCE, tmp_path_factory.mktemp("sparse_step_cuda_emulation"),
                         "glai_sparse_step_cuda_emulated")
    step = ctypes.POINTER(AdamStep)
    lib.glai_sparse_dvalues_adam.restype = ctypes.c_int
    lib.glai_sparse_dvalues_adam.argtypes = [ctypes.POINTER(SparseProblem), ctypes.c_void_p,
                                             ctypes.c_void_p, ctypes.c_void_p, step,
                                             ctypes.c_void_p]
    lib.glai_bias_adam.restype = ctypes.c_int
    lib.glai_bias_adam.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int,
                                   ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, step,
                                   ctypes.c_void_p]
    return lib


# (B, I, P, O), kept entries. Lanes: 8 for B <= 8, 16 for B <= 16, else 32; 256 / lanes rows,
# 4 entries a row: 128 entries a block at B = 1, 64 at B = 13, 32 at B = 37.
CASES = {
    "B1": ((1, 7, 3, 4), 30),
    "B13": ((13, 11, 9, 5), 120),
    "B37-two-tiles-many-blocks": ((37, 40, 10, 6), 2000),
    "B16-long-groups": ((16, 300, 3, 2), 650),
}


class Problem:
    """A seeded sparse estimator problem: inputs, a target, the kept weight and a bias."""

    def __init__(self, sizes: tuple[int, int, int, int], keep: int, dtype: torch.dtype):
        batch, inputs, paths, outputs = sizes
        gen = torch.Generator().manual_seed(sum(sizes) + keep)
        mask = torch.zeros(outputs * inputs * paths, dtype=torch.bool)
        mask[torch.randperm(mask.numel(), generator=gen)[:keep]] = True
        if keep > 600:  # output 0, path 0 keeps every input: a group longer than a block's rows
            mask.view(outputs, inputs, paths)[0, :, 0] = True
        weight = torch.randn(outputs, inputs, paths, generator=gen, dtype=torch.float64)
        self.weight, self.mask = weight.to(dtype), mask.view(outputs, inputs, paths)
        self.sw = self.kept()
        self.bias0 = torch.randn(outputs, generator=gen, dtype=torch.float64).to(dtype)
        self.x = [torch.randn(batch, inputs, generator=gen, dtype=torch.float64).to(dtype)
                  for _ in range(STEPS)]
        self.act = [torch.rand(batch, paths, generator=gen, dtype=torch.float64).to(dtype)
                    for _ in range(STEPS)]
        self.target = [torch.randn(batch, outputs, generator=gen, dtype=torch.float64).to(dtype)
                       for _ in range(STEPS)]
        self.dtype = dtype

    def kept(self):
        """A new SparsePathWeight of the kept weight (its values a Parameter of its own)."""
        return from_dense(self.weight, self.mask)


def _optimizer(params, decoupled: bool, weight_decay: float) -> torch.optim.Optimizer:
    kind = torch.optim.AdamW if decoupled else torch.optim.Adam
    return kind(params, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=weight_decay)


def _ordinary_steps(problem: Problem, decoupled: bool, weight_decay: float) -> list[list]:
    """Autograd through the sparse op and torch.optim; the state after each step."""
    sw = problem.kept()
    values = sw.values
    bias = torch.nn.Parameter(problem.bias0.clone())
    optimizer = _optimizer([values, bias], decoupled, weight_decay)
    states = []
    for x, act, target in zip(problem.x, problem.act, problem.target, strict=True):
        y = estimator(x, act, sw, bias, backend="torch")
        F.mse_loss(y, target).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        states.append([t.detach().clone() for t in (
            values, optimizer.state[values]["exp_avg"], optimizer.state[values]["exp_avg_sq"],
            bias, optimizer.state[bias]["exp_avg"], optimizer.state[bias]["exp_avg_sq"])])
    return states


def _kernel_steps(kernels, problem: Problem, decoupled: bool, weight_decay: float,
                  device_step: bool = True) -> list[list]:
    """The emulated kernels: the loss's gradient dy by autograd over the loss alone (as
    FusedSparseStep), then dvalues + update and dbias + update; the state after each step."""
    index = problem.sw.index
    w = problem.sw.values.detach().clone()
    bias = problem.bias0.clone()
    moments = [torch.zeros_like(w), torch.zeros_like(w), torch.zeros_like(bias),
               torch.zeros_like(bias)]
    count = torch.zeros((), dtype=torch.float32)  # the optimizer's state["step"]
    outputs, inputs, paths = index.shape
    states = []
    for x, act, target in zip(problem.x, problem.act, problem.target, strict=True):
        y = _forward(problem, x, act, w, bias).requires_grad_(True)
        dy = torch.autograd.grad(F.mse_loss(y, target), y)[0].contiguous()
        count += 1
        hyper = AdamStep(1e-2, 0.9, 0.999, weight_decay, 1e-8, float(count),
                         count.data_ptr() if device_step else None, int(decoupled))
        xt, actt, dyt = x.t().contiguous(), act.t().contiguous(), dy.t().contiguous()
        problem_c = SparseProblem(ptr(xt), ptr(actt), None, ptr(dyt),
                                  *(ptr(t) for t in index), x.shape[0], inputs, paths, outputs,
                                  index.nnz, index.groups, DTYPES[problem.dtype])
        assert kernels.glai_sparse_dvalues_adam(ctypes.byref(problem_c), w.data_ptr(),
                                                moments[0].data_ptr(), moments[1].data_ptr(),
                                                ctypes.byref(hyper), None) == 0
        assert kernels.glai_bias_adam(dy.data_ptr(), dy.shape[0], outputs, DTYPES[problem.dtype],
                                      bias.data_ptr(), moments[2].data_ptr(),
                                      moments[3].data_ptr(), ctypes.byref(hyper), None) == 0
        states.append([t.clone() for t in (w, moments[0], moments[1], bias, moments[2],
                                           moments[3])])
    return states


def _forward(problem: Problem, x, act, values, bias) -> torch.Tensor:
    """y [B, O] of the kept weight `values` (the op's `torch` backend, no autograd)."""
    sw = problem.kept()
    with torch.no_grad():
        sw.values.copy_(values)
        return estimator(x, act, sw, bias, backend="torch")


NAMES = ("values", "exp_avg", "exp_avg_sq", "bias", "bias exp_avg", "bias exp_avg_sq")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1], ids=["no-decay", "decay"])
@pytest.mark.parametrize("decoupled", [False, True], ids=["adam", "adamw"])
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_the_fused_step_follows_the_ordinary_step(kernels, case, decoupled, weight_decay, dtype):
    sizes, keep = case
    problem = Problem(sizes, keep, dtype)
    expected = _ordinary_steps(problem, decoupled, weight_decay)
    got = _kernel_steps(kernels, problem, decoupled, weight_decay)
    for step, (mine, theirs) in enumerate(zip(got, expected, strict=True), 1):
        for name, a, b in zip(NAMES, mine, theirs, strict=True):
            torch.testing.assert_close(a, b, **TOL[dtype],
                                       msg=lambda m, n=name, s=step: f"step {s}, {n}: {m}")
    # the update moved every kept value (no entry skipped by the grid)
    assert bool((got[-1][0] != problem.sw.values.detach()).all())


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_two_runs_give_the_same_bits_and_the_step_pointer_is_the_host_count(kernels, case):
    problem = Problem(*case, torch.float32)
    first = _kernel_steps(kernels, problem, True, 0.1)
    second = _kernel_steps(kernels, problem, True, 0.1)
    host = _kernel_steps(kernels, problem, True, 0.1, device_step=False)
    for a, b, c in zip(first, second, host, strict=True):
        for x, y, z in zip(a, b, c, strict=True):
            assert torch.equal(x, y) and torch.equal(x, z)


def test_bad_launches_are_refused(kernels):
    problem = SparseProblem()
    problem.batch, problem.inputs_count, problem.outputs, problem.nnz = 4, 3, 1, 2
    problem.dtype = DTYPES[torch.float32]
    out = torch.zeros(4)
    good = AdamStep(1e-3, 0.9, 0.999, 0.0, 1e-8, 1.0, None, 0)

    def dvalues_adam(step: AdamStep, p: SparseProblem = problem) -> int:
        return kernels.glai_sparse_dvalues_adam(ctypes.byref(p), out.data_ptr(), out.data_ptr(),
                                                out.data_ptr(), ctypes.byref(step), None)

    # no dy, x or act with a batch to sum over
    assert dvalues_adam(good) == INVALID_VALUE
    # a step count below 1 without a device count, betas outside [0, 1), a negative lr
    for bad in (AdamStep(1e-3, 0.9, 0.999, 0.0, 1e-8, 0.0, None, 0),
                AdamStep(1e-3, 1.0, 0.999, 0.0, 1e-8, 1.0, None, 0),
                AdamStep(-1e-3, 0.9, 0.999, 0.0, 1e-8, 1.0, None, 0)):
        problem.nnz = 0  # refused before K = 0 returns
        assert dvalues_adam(bad) == INVALID_VALUE
        problem.nnz = 2
    # the update is in the parameter's dtype: float32 or float64
    half = SparseProblem()
    half.nnz, half.dtype = 2, DTYPES[torch.float16]
    assert dvalues_adam(good, half) == INVALID_VALUE
    assert kernels.glai_bias_adam(out.data_ptr(), 2, 2, DTYPES[torch.float16], out.data_ptr(),
                                  out.data_ptr(), out.data_ptr(), ctypes.byref(good),
                                  None) == INVALID_VALUE
    # a null moment, and a bias update with a batch but no dy
    assert kernels.glai_bias_adam(out.data_ptr(), 2, 2, DTYPES[torch.float32], out.data_ptr(),
                                  None, out.data_ptr(), ctypes.byref(good), None) == INVALID_VALUE
    assert kernels.glai_bias_adam(None, 2, 2, DTYPES[torch.float32], out.data_ptr(),
                                  out.data_ptr(), out.data_ptr(), ctypes.byref(good),
                                  None) == INVALID_VALUE
    # nothing to update is not an error
    problem.nnz = 0
    assert dvalues_adam(good) == 0


def test_a_batch_of_zero_rows_updates_with_a_zero_gradient(kernels):
    """As the CPU op: every gradient an empty sum, the update still runs (Adam's weight decay
    and the moments' decay apply)."""
    problem = Problem((1, 5, 3, 2), 12, torch.float32)
    index = problem.sw.index
    w = problem.sw.values.detach().clone()
    m, v = torch.zeros_like(w), torch.zeros_like(w)
    outputs, inputs, paths = index.shape
    c = SparseProblem(None, None, None, None, *(ptr(t) for t in index), 0, inputs, paths,
                      outputs, index.nnz, index.groups, DTYPES[torch.float32])
    hyper = AdamStep(1e-2, 0.9, 0.999, 0.1, 1e-8, 1.0, None, 1)
    assert kernels.glai_sparse_dvalues_adam(ctypes.byref(c), w.data_ptr(), m.data_ptr(),
                                            v.data_ptr(), ctypes.byref(hyper), None) == 0
    expected = problem.sw.values.detach() * (1 - 1e-2 * 0.1)  # AdamW's decay; m = v = 0
    torch.testing.assert_close(w, expected, **TOL[torch.float32])
    assert not m.any() and not v.any()
