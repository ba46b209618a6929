"""The sparse op over the layout, written out in float64 with gathers and segment sums.

Slow and simple on purpose: a kernel writer's readable statement of what each pass computes
from the KeptIndex (layout.py), and a second oracle for the layout itself (the tests compare
it with the dense float64 oracle on the masked weight). Every function takes x [B, I],
act [B, P], values [K] of any floating dtype and returns float64.
"""

from __future__ import annotations

import torch

from glai_kernels.sparse.layout import KeptIndex


def _f64(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.detach().to(torch.float64) for t in tensors]


def group_sums64(x: torch.Tensor, values: torch.Tensor, index: KeptIndex) -> torch.Tensor:
    """Zg [B, G]: Zg[b, g] = sum_{k in group g} v[k] x[b, i_k]."""
    x, values = _f64(x, values)
    terms = x[:, index.inputs.long()] * values  # [B, K]
    zg = terms.new_zeros(x.shape[0], index.groups)
    return zg.index_add_(1, index.entry_groups.long(), terms)


def forward64(x: torch.Tensor, act: torch.Tensor, values: torch.Tensor, index: KeptIndex,
              bias: torch.Tensor | None = None) -> torch.Tensor:
    """y [B, O] = sum_{g of o} act[b, s_g] Zg[b, g] (+ bias[o])."""
    zg = group_sums64(x, values, index)
    (act,) = _f64(act)
    per_group = act[:, index.group_paths.long()] * zg
    y = per_group.new_zeros(x.shape[0], index.shape[0])
    y.index_add_(1, index.group_outputs.long(), per_group)
    return y if bias is None else y + bias.detach().to(torch.float64)


def backward64(dy: torch.Tensor, x: torch.Tensor, act: torch.Tensor, values: torch.Tensor,
               index: KeptIndex) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx [B, I], dact [B, P], dvalues [K]) for dy [B, O], using the reverse orders."""
    dy, x, act, values = _f64(dy, x, act, values)
    o, i, s = index.entries()
    dy_act = dy[:, o] * act[:, s]  # [B, K]
    dvalues = (dy_act * x[:, i]).sum(0)
    # dx: entries of input i, in input_entries order, summed into row i
    in_order = index.input_entries.long()
    dx = x.new_zeros(x.shape).index_add_(1, i[in_order], (dy_act * values)[:, in_order])
    # dact: groups of path s, in path_groups order, each dy[b, o_g] Zg[b, g]
    zg = group_sums64(x, values, index)
    groups = index.path_groups.long()
    per_group = dy[:, index.group_outputs.long()[groups]] * zg[:, groups]
    dact = act.new_zeros(act.shape).index_add_(1, index.group_paths.long()[groups], per_group)
    return dx, dact, dvalues
