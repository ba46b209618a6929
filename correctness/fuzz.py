"""What the fuzzer draws (correctness/test_properties.py): shapes across every kernel's tiles,
memory layouts, gate magnitudes, and the inputs built from one drawn case.

Shapes. Most cases are small (every axis 0..9, where the kernels' remainder paths live); a
share make one axis large, and a smaller share two axes (the others then at most 2, so that
B·I·P·O, and the time, stays bounded). A large axis is either next to a tile edge (a multiple
of a tile size, minus one, plus one) or anywhere up to `AXIS_MAX`. The tiles, read from the
kernels:

- cpp (glai_kernels/csrc/cpu/kernels*.inc): rows of B or I in kMR = 6; columns of P or B in
  kNR = 64 (float32, bfloat16 and float16, which computes in float32) or 32 (float64);
  forward row groups of 8·6 = 48 rows of B; dact tasks of 16 rows of B.
- triton under the interpreter (backends/triton_fused.py, `*_config`): B tiles up to 64
  (dweight's up to 32), O up to 128 (float64: 32), P up to 128, K = I·P up to 4096 (float64:
  256), split over K once K spans 8 of those tiles: two large axes I and P reach it.
- cuda (csrc/cuda/estimator_kernels.cu): 64 x 64 tiles (128 x 128 for full float32 at M, N >= 128,
  simt_tile.cuh), K steps of 8, 16 and 32.

Layouts: each input, and dy, is contiguous, a strided view (every other element of a
buffer twice as wide, or its dimensions reversed in memory) or an expanded one (stride 0
along one dimension, the values of its first slice repeated).

Gates: binary (0/1, scaled by the magnitude), soft (normal times the magnitude) or wide (each
element its own magnitude). Magnitudes span 2^±30 in float32, float64 and bfloat16. Float16
values are kept where its tolerance means something: every value at least half its scale
(1, or 1/sqrt(I·P) for weight) before the gates' scaling, since below float16's normal range,
6.1e-5, rounding the result alone errs by more than the tolerance relative to a sum of tiny
terms; and gate magnitudes in [2^-3, 2^8] (see `GATE_EXPONENTS`).

Double backward (the sparse op's gradient penalty sum(r * dx), `penalty`). Each second
derivative it takes is one op call on exact inputs: d/dact is dact with r in x's place,
d/dvalues is dvalues with r in x's place (glai_kernels/calls.py, `double_backward`), so the
first derivatives' error model holds unchanged (float32 or float64 accumulation, one rounding
of the result) and so does every dtype's tolerance. What it needs is what x needs: r drawn as
x is, floored in float16. An unfloored r failed float16 cases by 1.9x to 20x (B=127 I=3 P=4
O=1: d/dact[b, s] = dy·r·W, one kept term, at 6.3e-7 with |r| = 3.8e-6, where float16's
spacing is 6.0e-8: rounding the result alone errs by 4% of the term), on every backend alike.
"""

from __future__ import annotations

import os
import random
import secrets

import torch
from hypothesis import strategies as st

from glai_kernels.contract import SUPPORTED_DTYPES
from reference import Inputs, abs_forward64, abs_grads64, make_inputs

FUZZ_SEED_VAR = "GLAI_FUZZ_SEED"


def fuzz_seed() -> int:
    """The property tests' seed: $GLAI_FUZZ_SEED, else a new one for this run, stored in the
    environment so that every import of this file (and every subprocess) sees the same one."""
    if not os.environ.get(FUZZ_SEED_VAR):
        os.environ[FUZZ_SEED_VAR] = str(secrets.randbelow(2**32))
    return int(os.environ[FUZZ_SEED_VAR])


DTYPES = SUPPORTED_DTYPES
AXIS_MAX = 320
TILES = (6, 16, 32, 48, 64, 128, 256)
EDGES = sorted({n for t in TILES for k in (1, 2, 3) for n in (k * t - 1, k * t, k * t + 1)
                if 10 <= n <= AXIS_MAX})
# (lowest, highest) power of two of the gates' magnitude. float16's top keeps the results
# themselves below 65504: dweight sums up to 320 rows of dy·x·act, ~90 g at five sigma, so
# 2^8; at 2^12 every backend's y is inf because the exact y is. Random draws up to 2^10 did
# not reach issue 16 item 2 (a half intermediate overflowing while the result fits: it needs
# cancelling partial sums, which that item's own tests construct).
GATE_EXPONENTS = {torch.float16: (-3, 8)}
DEFAULT_GATE_EXPONENTS = (-30, 30)
HALF_FLOOR = 0.5  # float16: the smallest magnitude of any value before gate scaling
# float16: every exact result's sum of absolute terms stays below half the range. The gate
# exponents above assume B terms of random sign; a case whose dy, x and act are all expanded
# along the batch adds B equal terms (seen: dweight past 65504 at B = 242, gates 2^8), so its
# gates are halved until the results fit.
HALF_RESULT_MAX = 2.0 ** 15

small = st.integers(0, 9)
large = st.one_of(st.sampled_from(EDGES), st.integers(10, AXIS_MAX))


@st.composite
def shapes(draw) -> tuple[int, int, int, int]:
    """(B, I, P, O): all small (80%), one axis large (16%) or two (4%, the others <= 2)."""
    n_large = draw(st.sampled_from((0,) * 20 + (1,) * 4 + (2,)))
    big = draw(st.permutations(range(4)))[:n_large]
    rest = small if n_large < 2 else st.integers(0, 2)
    return tuple(draw(large) if axis in big else draw(rest) for axis in range(4))


LAYOUTS = ("contiguous",) * 4 + ("spread", "reversed", "expanded", "expanded")
layouts = st.sampled_from(LAYOUTS)

cases = st.fixed_dictionaries({
    "shape": shapes(),
    "dtype": st.sampled_from(DTYPES),
    "gates": st.sampled_from(["binary", "soft", "wide"]),
    "gate_exponent": st.floats(0.0, 1.0),  # where in the dtype's range, mapped by gate_scale
    "bias": st.booleans(),
    "grads": st.sets(st.sampled_from(["x", "act", "weight", "bias"])),
    "layouts": st.fixed_dictionaries({name: st.tuples(layouts, st.integers(0, 2))
                                      for name in ("x", "act", "weight", "bias", "dy")}),
    "seed": st.integers(0, 2**31 - 1),
})


def graph_keys(seed: int, count: int) -> list[dict]:
    """`count` (shape, dtype, grads) triples drawn like `cases` draws them, from `seed`.

    For the `compile` backend, whose every new dtype, set of gradients, size 0 or 1 or pair
    of equal sizes compiles a new graph (~2 s each here; 114 graphs in its first 460 free
    cases): each run fuzzes its cases over a few of these, drawn afresh from the run's seed,
    while values, layouts, gates and bias vary freely.
    """
    rng = random.Random(seed)
    keys = []
    for _ in range(count):
        n_large = rng.choice((0, 0, 1, 1, 2))
        big = rng.sample(range(4), n_large)
        shape = tuple((rng.choice(EDGES) if rng.random() < 0.5 else rng.randint(10, AXIS_MAX))
                      if axis in big else rng.randint(0, 2 if n_large == 2 else 9)
                      for axis in range(4))
        keys.append({"shape": shape, "dtype": rng.choice(DTYPES),
                     "grads": frozenset(g for g in ("x", "act", "weight", "bias")
                                        if rng.random() < 0.5)})
    return keys


def cases_over(keys: list[dict]) -> st.SearchStrategy[dict]:
    """`cases` with shape, dtype and grads taken from `keys` (see graph_keys)."""
    return st.tuples(st.sampled_from(keys), cases).map(lambda kc: {**kc[1], **kc[0]})


def gate_exponents(dtype: torch.dtype, where: float) -> tuple[float, float]:
    """Wide gates' exponents (lo, hi): ±|e| for e as in `gate_scale`, within the dtype's range."""
    lo, hi = GATE_EXPONENTS.get(dtype, DEFAULT_GATE_EXPONENTS)
    e = (2 * where - 1) ** 3  # -1..1, most of the mass near 0
    return max(lo, -abs(e) * max(-lo, hi)), min(hi, abs(e) * max(-lo, hi))


def gate_scale(dtype: torch.dtype, where: float) -> float:
    """The gates' magnitude, 2^e: e at `where` (0..1) of the dtype's exponent range, skewed so
    that half the cases stay within 2^±4 of 1."""
    lo, hi = GATE_EXPONENTS.get(dtype, DEFAULT_GATE_EXPONENTS)
    e = (2 * where - 1) ** 3
    return 2.0 ** (e * (hi if e > 0 else -lo))


def lay_out(t: torch.Tensor, layout: str, dim: int) -> torch.Tensor:
    """The same values as `t` (or, expanded, its first slice along `dim` repeated) in another
    memory layout."""
    dim = dim % t.dim()
    if layout == "contiguous":
        return t
    if layout == "reversed":  # dimensions in reverse order in memory (column-major for 2-D)
        order = tuple(reversed(range(t.dim())))
        return t.permute(order).contiguous().permute(order)
    index = [slice(None)] * t.dim()
    if layout == "expanded":
        index[dim] = slice(0, 1)
        return t[tuple(index)].expand(t.shape)
    if layout == "spread":  # every other element of a buffer twice as wide, offset by one
        shape = list(t.shape)
        shape[dim] = 2 * shape[dim] + 1
        buffer = torch.full(shape, float("nan"), dtype=t.dtype, device=t.device)
        index[dim] = slice(1, None, 2)
        buffer[tuple(index)] = t
        return buffer[tuple(index)]
    raise ValueError(f"layout: unknown {layout!r}")


def _floor(t: torch.Tensor, floor: float) -> torch.Tensor:
    """|t| raised to at least `floor`, signs kept (zeros become +floor)."""
    sign = torch.where(t < 0, -1.0, 1.0).to(t.dtype)
    return sign * t.abs().clamp_min(floor)


def build(case: dict, device: str = "cpu") -> tuple[Inputs, torch.Tensor]:
    """The inputs x [B, I], act [B, P], weight [O, I, P], bias [O] or None, and dy [B, O]
    of one drawn case, in its dtype and layouts."""
    batch, inputs, paths, outputs = case["shape"]
    dtype, seed = case["dtype"], case["seed"]
    data = make_inputs(batch, inputs, paths, outputs, dtype=torch.float64, seed=seed,
                       gates="binary" if case["gates"] == "binary" else "soft",
                       bias=case["bias"])
    gen = torch.Generator().manual_seed(seed + 1)
    dy = torch.randn(batch, outputs, generator=gen, dtype=torch.float64)
    x, act, weight, bias = data
    if dtype == torch.float16:
        x, dy = _floor(x, HALF_FLOOR), _floor(dy, HALF_FLOOR)
        weight = _floor(weight, HALF_FLOOR / max(1, inputs * paths) ** 0.5)  # its own scale
        bias = None if bias is None else _floor(bias, HALF_FLOOR)
        if case["gates"] != "binary":
            act = _floor(act, HALF_FLOOR)
    if case["gates"] == "wide":  # each gate its own magnitude, 2^lo..2^hi
        lo, hi = gate_exponents(dtype, case["gate_exponent"])
        u = torch.rand(act.shape, generator=gen, dtype=torch.float64)
        act = act * torch.exp2(lo + (hi - lo) * u)
    else:
        act = act * gate_scale(dtype, case["gate_exponent"])
    if dtype == torch.float16:
        act = _fit_half(x, act, weight, bias, dy, case["layouts"])
    tensors = {"x": x, "act": act, "weight": weight, "bias": bias, "dy": dy}
    laid = {name: None if t is None else lay_out(t.to(device=device, dtype=dtype),
                                                 *case["layouts"][name])
            for name, t in tensors.items()}
    return Inputs(laid["x"], laid["act"], laid["weight"], laid["bias"]), laid["dy"]


def _fit_half(x: torch.Tensor, act: torch.Tensor, weight: torch.Tensor,
              bias: torch.Tensor | None, dy: torch.Tensor, layouts: dict) -> torch.Tensor:
    """act (float64) halved, exactly, until y, dx and dweight of the laid-out case have sums
    of absolute terms within HALF_RESULT_MAX (dact does not depend on act)."""
    xl, wl, dyl = (lay_out(t, *layouts[n]) for n, t in (("x", x), ("weight", weight),
                                                         ("dy", dy)))
    for _ in range(64):
        a = lay_out(act, *layouts["act"])
        grads = abs_grads64(dyl, xl, a, wl)
        scales = (abs_forward64(xl, a, wl, bias), grads.x, grads.weight)
        if max((float(t.max()) for t in scales if t.numel()), default=0.0) <= HALF_RESULT_MAX:
            break
        act = act / 2
    return act


def penalty(case: dict, x: torch.Tensor, act: torch.Tensor, weight: torch.Tensor,
            dy: torch.Tensor) -> torch.Tensor:
    """r [B, I], x's shape, dtype and device, for a case's gradient penalty sum(r * dx): a
    standard normal draw from the case's seed; in float16, floored as x is (`HALF_FLOOR`) and
    halved, exactly, until the second derivatives' sums of absolute terms (d/dact [B, P],
    d/dweight [O, I, P]) are within HALF_RESULT_MAX, as `_fit_half` does for act."""
    gen = torch.Generator().manual_seed(case["seed"] + 2)
    r = torch.randn(x.shape, generator=gen, dtype=torch.float64)
    if case["dtype"] == torch.float16:
        r = _floor(r, HALF_FLOOR)
        d, a, w = (t.detach().double().abs() for t in (dy, act, weight))
        for _ in range(64):
            scales = (torch.einsum("bo,bi,ois->bs", d, r.abs(), w),
                      torch.einsum("bo,bi,bs->ois", d, r.abs(), a))
            if max((float(t.max()) for t in scales if t.numel()), default=0.0) \
                    <= HALF_RESULT_MAX:
                break
            r = r / 2
    return r.to(x.device, x.dtype)


def describe(case: dict) -> str:
    """One line naming a case's shape, dtype, gates and layouts, for failure messages."""
    b, i, p, o = case["shape"]
    laid = {k: f"{v[0]}@{v[1]}" for k, v in case["layouts"].items() if v[0] != "contiguous"}
    return (f"B={b} I={i} P={p} O={o} {case['dtype']} {case['gates']} gates x"
            f"{gate_scale(case['dtype'], case['gate_exponent']):.3g} bias={case['bias']} "
            f"grads={sorted(case['grads'])} layouts={laid or 'contiguous'} seed={case['seed']}")


# ----------------------------------------------------------------------------------------
# The sparse op (glai_kernels.sparse): the same cases, plus which path weights are kept

# some, a few, most, every one, none (1 case in 8; hypothesis favours the first: not that)
DENSITIES = (0.3, 0.1, 0.3, 0.5, 0.7, 0.7, 1.0, 0.0)
EMPTIABLE = ("outputs", "inputs", "paths")

masks = st.fixed_dictionaries({
    "density": st.sampled_from(DENSITIES),
    # axes some of whose rows keep nothing (an output with no group, an input or a path no
    # entry uses: the reverse orders' empty ranges); none in half the cases
    "empty": st.sampled_from(((),) * 4 + tuple((axis,) for axis in EMPTIABLE) + (EMPTIABLE,)),
    "seed": st.integers(0, 2**31 - 1),
})


@st.composite
def sparse_shapes(draw) -> tuple[int, int, int, int]:
    """`shapes`, with every axis at least 1 in 7 cases of 8: hypothesis favours small
    draws, and with a zero axis (or no kept path) the sparse op computes nothing."""
    shape = draw(shapes())
    return shape if draw(st.integers(0, 7)) == 0 else tuple(max(1, d) for d in shape)


sparse_cases = st.tuples(cases, masks, sparse_shapes()).map(
    lambda c: {**c[0], "mask": c[1], "shape": c[2]})


def kept_mask(case: dict, device: str = "cpu") -> torch.Tensor:
    """bool [O, I, P] of a sparse case: each path weight kept with the drawn density, then
    half the rows of each `empty` axis emptied (none of an axis of one row: density 0 empties
    everything)."""
    _, inputs, paths, outputs = case["shape"]
    drawn = case["mask"]
    gen = torch.Generator().manual_seed(drawn["seed"])
    mask = torch.rand(outputs, inputs, paths, generator=gen) < drawn["density"]
    for axis in sorted(drawn["empty"]):
        dim = EMPTIABLE.index(axis)
        size = mask.shape[dim]
        if size >= 2:
            rows = torch.randperm(size, generator=gen)[:size // 2]
            mask.index_fill_(dim, rows, False)
    return mask.to(device)


def corrupt(index, seed: int):
    """(a copy of `index` with one entry of one field changed, the field, whether the new value
    is outside what the field addresses). Any single change breaks an invariant: a valid
    index is the one its entries define, and every field is part of that definition."""
    from glai_kernels.sparse.layout import _BOUNDS, _counts

    rng = random.Random(seed)
    counts = _counts(index)
    fields = [name for name in index._fields if getattr(index, name).numel()]
    name = rng.choice(fields)
    kind, count = _BOUNDS[name]
    t = getattr(index, name).clone()
    position = rng.randrange(t.numel())
    current = int(t[position])
    top = counts[count] + 1 if kind == "ptr" else counts[count]  # in range: [0, top)
    choices = [v for v in range(top) if v != current] if top <= 64 else []
    while top > 64 and not choices:
        v = rng.randrange(top)
        choices = [v] if v != current else []
    outside = not choices or rng.random() < 0.5
    if outside:
        value = rng.choice([-1, -rng.randint(2, 2**31 - 1), top + rng.randint(0, 2**20)])
    else:
        value = rng.choice(choices)
    changed = index._asdict()
    t[position] = value
    changed[name] = t
    return type(index)(**changed), name, outside
