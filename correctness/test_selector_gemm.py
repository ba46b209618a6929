"""The path selector's frozen layers on the extension's GEMM (`glai_ext::linear`): against the
float64 oracle at sizes that cross every tile edge, its fused gates, its errors, its fake, and
the selector using it (agreeing with F.linear's gates wherever rounding cannot decide, the
transposed weight following load_state_dict and .to)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from glai_models import random_mlp

from glai_kernels import extension
from glai_kernels.glai import from_mlp
from reference import tolerance


def _layer(batch: int, inputs: int, outputs: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, inputs, generator=gen, dtype=dtype)
    weight = torch.randn(outputs, inputs, generator=gen, dtype=dtype)
    bias = torch.randn(outputs, generator=gen, dtype=dtype)
    return x, weight, bias


# rows across the 6-row register tile, columns across a 64-lane tile and its vectors, depth 0..;
# B a multiple of 8 and P of 16: the 8-row tile of 3 vectors (48 columns), its last block 1-3
SIZES = [(1, 1, 1), (5, 7, 15), (6, 33, 16), (7, 300, 17), (13, 129, 63), (16, 1280, 320),
         (25, 2, 65), (50, 576, 130), (3, 0, 4), (0, 5, 3), (8, 5, 16), (16, 9, 112),
         (32, 17, 80), (24, 70, 48)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("size", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_linear_agrees_with_the_oracle(built, size, dtype):
    batch, inputs, outputs = size
    x, weight, bias = _layer(batch, inputs, outputs, dtype, seed=sum(size))
    wide = torch.stack([x, torch.full_like(x, float("nan"))], 2).flatten(1)[:, ::2]
    assert torch.equal(wide, x) and (x.numel() < 2 or not wide.is_contiguous())  # x, strided
    before = [t.clone() for t in (wide, weight, bias)]
    transposed = weight.t().contiguous()
    for with_bias in (True, False):
        b = bias if with_bias else None
        pre = extension.run_linear(wide, transposed, b, False)
        assert pre.shape == (batch, outputs) and pre.dtype == dtype
        exact = x.double() @ weight.double().t() + (bias.double() if with_bias else 0)
        scale = x.double().abs() @ weight.double().abs().t() + (
            bias.double().abs() if with_bias else 0)
        error = (pre.double() - exact).abs().div(scale.clamp_min(1e-300)).max() \
            if pre.numel() else 0
        assert error <= tolerance(dtype)
        gates = extension.run_linear(wide, transposed, b, True)
        assert torch.equal(gates, (pre > 0).to(dtype))  # the fused compare, same bits
        assert set(gates.unique().tolist()) <= {0.0, 1.0}
    assert all(torch.equal(t, u) for t, u in zip((wide, weight, bias), before, strict=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_the_8_row_tile_gives_the_6_row_tiles_bits(built, dtype):
    """B = 16 runs in 8-row tiles, B = 17 in 6-row ones: every element is the same sum in the
    same order, so its first 16 rows are the same bits."""
    x, weight, bias = _layer(17, 300, 112, dtype, seed=11)
    transposed = weight.t().contiguous()
    for gates in (False, True):
        sixteen = extension.run_linear(x[:16], transposed, bias, gates)
        seventeen = extension.run_linear(x, transposed, bias, gates)
        assert torch.equal(sixteen, seventeen[:16])


def test_linear_runs_on_two_threads_with_the_same_bits(built):
    x, weight, bias = _layer(64, 700, 400, torch.float32, seed=3)  # 36 MFLOP: both threads
    transposed = weight.t().contiguous()
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = extension.run_linear(x, transposed, bias, False)
        torch.set_num_threads(2)
        two = extension.run_linear(x, transposed, bias, False)
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(one, two)


@pytest.mark.parametrize("bad, message", [
    (lambda x, w, b: (x[0], w, b), "x must be"),
    (lambda x, w, b: (x, w[:-1], b), "weight_t must be"),
    (lambda x, w, b: (x, w.double(), b), "weight_t must match"),
    (lambda x, w, b: (x, w, b[:-1]), "bias must be"),
    (lambda x, w, b: (x, w, b.double()), "bias must match"),
    (lambda x, w, b: (x.half(), w.half(), b.half()), "float32 or float64"),
])
def test_linear_names_the_bad_argument(built, bad, message):
    x, weight, bias = _layer(4, 5, 3, torch.float32, seed=1)
    with pytest.raises(RuntimeError, match=message):
        extension.run_linear(*bad(x, weight.t().contiguous(), bias), True)


def test_linear_opcheck_and_fake(built):
    x, weight, bias = _layer(7, 9, 5, torch.float32, seed=2)
    torch.library.opcheck(torch.ops.glai_ext.linear.default,
                          (x, weight.t().contiguous(), bias, True))
    with torch._subclasses.FakeTensorMode():
        fake = torch.ops.glai_ext.linear(torch.empty(7, 9), torch.empty(9, 5), None, False)
    assert tuple(fake.shape) == (7, 5)


def _selectors(widths, dtype=torch.float32, seed=0):
    mlp = random_mlp(widths, seed=seed, dtype=dtype)
    fast, slow = from_mlp(mlp).selector, from_mlp(mlp).selector
    fast.gemm, slow.gemm = "cpp", "torch"
    return mlp, fast, slow


@pytest.mark.parametrize("widths", [(33, 129, 7), (9, 70, 13, 2)], ids=["1 layer", "2 layers"])
def test_the_selector_gates_agree_with_f_linear_where_rounding_cannot_decide(built, widths):
    _, fast, slow = _selectors(widths)
    x = torch.randn(19, widths[0], generator=torch.Generator().manual_seed(5))
    got, expected = fast.gates(x), slow.gates(x)
    h = x
    for layer, (g, e) in enumerate(zip(got, expected, strict=True)):
        pre = F.linear(h, getattr(slow, f"weight{layer}"), getattr(slow, f"bias{layer}"))
        decided = pre.abs() > 1e-4 * (h.abs() @ getattr(slow, f"weight{layer}").abs().t() + 1)
        assert torch.equal(g[decided], e[decided])
        assert decided.float().mean() > 0.99  # the comparison covers nearly every gate
        h = torch.relu(pre)
    assert torch.equal(fast(x), slow(x)) or (fast(x) != slow(x)).float().mean() < 0.01


def test_the_selector_follows_its_weights_when_they_change_in_place(built):
    _, fast, slow = _selectors((12, 40, 3), seed=1)
    x = torch.randn(8, 12, generator=torch.Generator().manual_seed(2))
    first = fast(x)
    other, _, _ = _selectors((12, 40, 3), seed=9)  # another MLP's frozen layers
    state = from_mlp(other).selector.state_dict()
    fast.load_state_dict(state)  # copies into the same buffers: their version moves
    slow.load_state_dict(state)
    assert not torch.equal(first, slow(x))
    assert torch.equal(fast(x), slow(x))
    fast.double()  # new buffers, new dtype
    assert torch.equal(fast(x.double()), slow.double()(x.double()))


def test_the_selector_gemm_setting_is_checked(built):
    _, fast, _ = _selectors((4, 6, 2))
    fast.gemm = "blas"
    with pytest.raises(ValueError, match="gemm must be one of"):
        fast(torch.randn(3, 4))
    fast.gemm = "cpp"
    with pytest.raises(ValueError, match="float32/float64 on CPU"):
        fast(torch.randn(3, 4).half())


def test_selected_columns_folded_into_the_gemm_give_the_gates_bits(built):
    _, fast, _ = _selectors((20, 150, 3), seed=4)
    columns = torch.randperm(150, generator=torch.Generator().manual_seed(1))[:77]
    chosen = fast.select(columns)
    chosen.gemm = "cpp"
    x = torch.randn(13, 20, generator=torch.Generator().manual_seed(3))
    act = chosen(x)  # one GEMM over the 77 chosen units
    assert act.shape == (13, 77)
    assert torch.equal(act, fast.gates(x)[0][:, columns])  # every unit's gates, then chosen
    before = act.clone()
    chosen.load_state_dict({**chosen.state_dict(), "bias0": chosen.bias0 + 100.0})
    assert bool((chosen(x) == 1).all()) and not torch.equal(chosen(x), before)


@pytest.mark.parametrize("paths", [64, 65, 127], ids=["whole-tiles", "one-over", "one-under"])
def test_the_selectors_padded_columns_give_the_unpadded_kernels_bits(built, paths):
    """The selector keeps its weight zero-padded to whole 64-column tiles and drops the padded
    gates: the same bits as the kernel on the unpadded weight, act [B, P] contiguous."""
    mlp, fast, _ = _selectors((21, paths, 3), seed=paths)
    x = torch.randn(17, 21, generator=torch.Generator().manual_seed(9))
    layer = mlp.layers[0] if hasattr(mlp, "layers") else mlp[0]
    units = fast.units[0]
    want = torch.ops.glai_ext.linear(x, layer.weight.detach().index_select(0, units).t()
                                     .contiguous(), layer.bias.detach().index_select(0, units),
                                     True)
    got = fast(x)
    assert got.shape == (17, units.numel()) and got.is_contiguous()
    assert torch.equal(got, want)
