"""`torch` (sparse): the kept-path estimator in plain PyTorch, over torch.sparse CSR matrices.

The layout's groups are the non-empty rows of a CSR matrix Mg [G, I] with row offsets
`group_ptr`, column indices `inputs` and the values: the group sums are one sparse-dense
product, then act scales each group and the groups of an output are added (index_add):

    Zg^T = Mg @ x^T                                 [G, B]
    y^T[o] = sum_{g of o} act^T[s_g] * Zg^T[g]      [O, B]

Backward, with A[g, b] = dy[b, o_g] act[b, s_g] ([G, B]):
    dx^T      = Mt @ A, Mt the CSR [I, G] built from the reverse order input_ptr /
                input_entries (rows i, columns entry_groups, the values gathered)
    dvalues   = sampled_addmm(Mg's pattern, A, x): dv[k] = sum_b A[g_k, b] x[b, i_k]
    dact^T[s] = sum_{g with s_g = s} dy^T[o_g] * Zg^T[g]   (index_add; Zg kept from the
                forward when act needs a gradient)
Everything runs in the transposed [rows, B] form (B contiguous per row) and in float32 for
half inputs. Of the pure-PyTorch forms measured (gather + index_add, gather + segment_reduce,
this), this was the fastest at both paper shapes and both batches: docs/notes/sparse.md,
"Sparse kept-path estimator"; `glai-bench sparse-torch-candidates` reruns the comparison.
"""

from __future__ import annotations

import warnings

import torch

from glai_kernels.contract import accumulation_dtype
from glai_kernels.registry import Backend
from glai_kernels.sparse.layout import KeptIndex
from glai_kernels.sparse.registry import SPARSE_ESTIMATOR, groups_by_batch


def _csr(ptr: torch.Tensor, cols: torch.Tensor, values: torch.Tensor,
         size: tuple[int, int]) -> torch.Tensor:
    with warnings.catch_warnings():  # "CSR support is in beta", once per process
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(ptr, cols, values, size=size, check_invariants=False)


def _rows(t: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """t [B, n] -> [n, B] contiguous in the accumulation dtype."""
    return t.t().to(acc).contiguous()


def _group_sums(xt: torch.Tensor, values: torch.Tensor, index: KeptIndex) -> torch.Tensor:
    return _csr(index.group_ptr, index.inputs, values, (index.groups, xt.shape[0])) @ xt


def _forward(x, act, values, index):
    acc = accumulation_dtype(x.dtype)
    zg = _group_sums(_rows(x, acc), values.to(acc), index)
    per_group = zg * _rows(act, acc).index_select(0, index.group_paths)
    yt = per_group.new_zeros(index.shape[0], x.shape[0])
    yt.index_add_(0, index.group_outputs, per_group)
    return yt.t().to(x.dtype), zg


def torch_forward(x: torch.Tensor, act: torch.Tensor, values: torch.Tensor,
                index: KeptIndex) -> torch.Tensor:
    """x [B, I], act [B, P], values [K] -> y [B, O]."""
    return _forward(x, act, values, index)[0]


def torch_forward_saving(x: torch.Tensor, act: torch.Tensor, values: torch.Tensor,
                       index: KeptIndex) -> tuple[torch.Tensor, torch.Tensor]:
    """As torch_forward, also returning Zg^T [G, B] (accumulation dtype) for dact."""
    return _forward(x, act, values, index)


def torch_backward(
    dy: torch.Tensor,
    x: torch.Tensor,
    act: torch.Tensor,
    values: torch.Tensor,
    index: KeptIndex,
    needs: tuple[bool, bool, bool],
    saved: torch.Tensor | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """dy [B, O] -> (dx [B, I], dact [B, P], dvalues [K]), only those in `needs`;
    `saved` is the forward's Zg^T [G, B]."""
    need_x, need_act, need_values = needs
    acc = accumulation_dtype(x.dtype)
    v = values.to(acc)
    xt, dyt = _rows(x, acc), _rows(dy, acc)
    dy_groups = dyt.index_select(0, index.group_outputs)  # [G, B]
    dx = dact = dvalues = None
    if need_x or need_values:
        a = dy_groups * _rows(act, acc).index_select(0, index.group_paths)  # [G, B]
        if need_x:
            order = index.input_entries
            mt = _csr(index.input_ptr, index.entry_groups.index_select(0, order),
                      v.index_select(0, order), (x.shape[1], index.groups))
            dx = (mt @ a).t().to(x.dtype)
        if need_values:
            # the pattern's values are zeros: sampled_addmm multiplies them by beta = 0, and
            # an infinite value there would make its dv NaN
            pattern = _csr(index.group_ptr, index.inputs, torch.zeros_like(v),
                           (index.groups, x.shape[1]))
            sampled = torch.sparse.sampled_addmm(pattern, a, xt.t(), beta=0.0)
            dvalues = sampled.values().to(x.dtype)
    if need_act:
        zg = saved if saved is not None else _group_sums(xt, v, index)
        dactt = dyt.new_zeros(act.shape[1], act.shape[0])
        dactt.index_add_(0, index.group_paths, dy_groups * zg)
        dact = dactt.t().to(x.dtype)
    return dx, dact, dvalues


SPARSE_ESTIMATOR.register(Backend(
    name="torch",
    forward=torch_forward,
    backward=torch_backward,
    forward_saving=torch_forward_saving,
    saved_shape=groups_by_batch,
    devices=("cpu", "cuda"),
    description="plain PyTorch: CSR sparse-dense products over the (o, s) groups",
    auto_priority={"cpu": 10, "cuda": 10},
    baseline=True,
))
