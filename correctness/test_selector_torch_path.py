"""The one-hidden-layer selector on F.linear (`PathSelector.gemm = "torch"`, the paper
protocol's; also wherever the extension's GEMM does not run): act is `gates`' own F.linear
call with the kept columns selected and the compare written in place, the same bits as the
gates and the padded column selection it replaces, in fewer ops."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from glai_models import random_mlp
from torch.utils._python_dispatch import TorchDispatchMode

from glai_kernels.glai import from_mlp, prune
from glai_kernels.glai.selector import PathSelector


def _selector(columns: list[int] | None, dtype: torch.dtype) -> PathSelector:
    """A torch-GEMM selector of a 13-19-5 MLP, over these unit columns (None: every unit)."""
    sel = from_mlp(random_mlp((13, 19, 5), seed=7, dtype=dtype)).selector
    if columns is not None:
        sel = sel.select(torch.tensor(columns))
    sel.gemm = "torch"
    return sel


def _expected(sel: PathSelector, x: torch.Tensor) -> torch.Tensor:
    """The five-op path: every unit's gates, a padded column of ones, the selection."""
    gates = (F.linear(x, sel.weight0, sel.bias0) > 0).to(x.dtype)
    return F.pad(gates, (0, 1), value=1.0).index_select(1, sel.units[0])


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


COLUMNS = [None, [3, 0, 18, 7, 7, 11], [5]]  # every unit; a reordered subset with a repeat; one


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("columns", COLUMNS, ids=["all", "subset", "one"])
def test_the_torch_path_gives_the_gates_bits(columns, dtype):
    sel = _selector(columns, dtype)
    x = torch.randn(11, 13, generator=torch.Generator().manual_seed(2), dtype=dtype)
    x[0] = 0  # pre-activations equal to the biases; x[:, 0] below: a strided batch
    wide = torch.stack([x, x], 2).flatten(1)[:, ::2]
    for inputs in (x, wide, x.clone().requires_grad_()):
        act = sel(inputs)
        assert act.dtype == dtype and not act.requires_grad
        assert torch.equal(act, _expected(sel, x))
    assert 0 < sel(x).sum() < sel(x).numel()  # both gate values occur


def test_the_torch_path_runs_three_ops():
    # the GEMM, the column selection, the compare in place; before: the compare's bools, a
    # cast, a pad and the selection besides the GEMM
    sel = _selector([3, 0, 18, 7], torch.float32)
    x = torch.randn(4, 13)
    sel(x)  # the column row, derived once
    with _Ops() as ops:
        sel(x)
    assert "gt_" in ops.names and not {"gt", "_to_copy", "constant_pad_nd"} & set(ops.names)
    assert len(ops.names) <= 4  # F.linear may come as t + addmm


def test_a_sentinel_column_still_reads_ones():
    # a hand-made one-layer selector whose column names the "no unit" sentinel n1
    sel = _selector(None, torch.float64)
    units = torch.tensor([[2, 19, 0]])
    odd = PathSelector([sel.weight0], [sel.bias0], (0.0,), units, torch.ones(3, dtype=torch.long))
    odd.gemm = "torch"
    x = torch.randn(6, 13, dtype=torch.float64)
    act = odd(x)
    assert torch.equal(act[:, 1], torch.ones(6, dtype=torch.float64))
    assert torch.equal(act, _expected(odd, x))


def test_autocast_keeps_the_inputs_dtype():
    sel = _selector([1, 4, 9], torch.float32)
    x = torch.randn(5, 13)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        act = sel(x)
    pre = F.linear(x.bfloat16(), sel.weight0.bfloat16(), sel.bias0.bfloat16())
    assert act.dtype == torch.float32
    assert torch.equal(act, (pre > 0).float().index_select(1, sel.units[0]))


def test_dropout_in_training_keeps_the_gates_path():
    # the selection must come after dropout drew its numbers over every unit's gates
    sel = from_mlp(random_mlp((13, 19, 5), seed=7, dtype=torch.float32, dropout=0.5)).selector
    sel = sel.select(torch.tensor([3, 0, 18])).train()
    sel.gemm = "torch"
    x = torch.randn(8, 13)
    torch.manual_seed(1)
    act = sel(x)
    torch.manual_seed(1)
    gates = F.dropout((F.linear(x, sel.weight0, sel.bias0) > 0).float(), 0.5, training=True)
    assert torch.equal(act, gates.index_select(1, sel.units[0]))


def test_a_pruned_sparse_head_on_torchs_gemm_matches_the_extensions_to_rounding():
    mlp = random_mlp((13, 12, 5), seed=3, dtype=torch.float32)
    head = prune(from_mlp(mlp), torch.randn(64, 13), keep=150, layout="sparse").head
    twin = copy.deepcopy(head)
    twin.selector.gemm = "torch"
    x = torch.randn(9, 13)
    torch.testing.assert_close(twin(x), head(x))


def test_meta_tensors_give_shapes():
    sel = _selector([3, 0, 18], torch.float32).to("meta")
    act = sel(torch.empty(4, 13, device="meta"))
    assert act.shape == (4, 3) and act.device.type == "meta"
