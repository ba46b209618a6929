"""Literal loops after the paper's Listings 2 and 3, for tiny sizes only.

A second oracle that shares no code with the einsum ones: plain Python scalars and loops,
float64 throughout. Listing 2 indexes weights[i, j, o]; our weight is [O, I, P], so the loops
read weight[o, i, j]. Listing 3 gives only dweight; dx and dact follow docs/ARCHITECTURE.md §1 in
the same
style.
"""

from __future__ import annotations

import torch


def _lists(*tensors: torch.Tensor) -> list[list]:
    return [t.detach().to(torch.float64).tolist() for t in tensors]


def loops_forward(x: torch.Tensor, act: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Listing 2: y [B, O] from x [B, I], act [B, P], weight [O, I, P]."""
    xs, acts, ws = _lists(x, act, weight)
    n_samples, n_inputs = len(xs), len(ws[0]) if ws else 0
    n_outputs, n_paths = len(ws), len(acts[0]) if acts else 0
    y = [[0.0] * n_outputs for _ in range(n_samples)]
    for o in range(n_outputs):
        for s in range(n_samples):
            for i in range(n_inputs):
                sum_weights = 0.0
                for j in range(n_paths):
                    sum_weights += acts[s][j] * ws[o][i][j]
                y[s][o] += sum_weights * xs[s][i]
    return torch.tensor(y, dtype=torch.float64).reshape(n_samples, n_outputs)


def loops_backward(
    dy: torch.Tensor, x: torch.Tensor, act: torch.Tensor, weight: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Listing 3 (dweight) and the same loops for dx and dact, all float64."""
    dys, xs, acts, ws = _lists(dy, x, act, weight)
    n_samples, n_outputs = len(dys), len(ws)
    n_inputs, n_paths = len(xs[0]) if xs else 0, len(acts[0]) if acts else 0
    dw = [[[0.0] * n_paths for _ in range(n_inputs)] for _ in range(n_outputs)]
    dx = [[0.0] * n_inputs for _ in range(n_samples)]
    dact = [[0.0] * n_paths for _ in range(n_samples)]
    for o in range(n_outputs):
        for s in range(n_samples):
            dy_partial = dys[s][o]
            for i in range(n_inputs):
                partial = xs[s][i] * dy_partial
                for j in range(n_paths):
                    dw[o][i][j] += acts[s][j] * partial
                    dx[s][i] += dy_partial * ws[o][i][j] * acts[s][j]
                    dact[s][j] += partial * ws[o][i][j]
    as_tensor = lambda v, *shape: torch.tensor(v, dtype=torch.float64).reshape(*shape)  # noqa: E731
    return (as_tensor(dx, n_samples, n_inputs), as_tensor(dact, n_samples, n_paths),
            as_tensor(dw, n_outputs, n_inputs, n_paths))
