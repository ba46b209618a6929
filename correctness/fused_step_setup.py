"""What the fused-step tests share (test_fused_step.py: torch's update; test_kernel_adam.py:
the update inside the cpp kernel): a small pruned sparse head, its training batches, the
optimizers it is stepped with, and the values and optimizer state compared after the steps.
"""

from __future__ import annotations

import torch
from glai_models import random_mlp

from glai_kernels.glai import from_mlp, prune

STEPS = 3
BATCH = 13  # crosses the cpp kernels' 8- and 16-lane tiles


def sparse_head(dtype: torch.dtype, dropout: float = 0.0, backend: str | None = None):
    """A seeded 11 -> 14 -> 5 MLP pruned to a sparse GLAI head (mu = 0.3), in training mode,
    on `backend` (None: auto)."""
    mlp = random_mlp((11, 14, 5), seed=3, dtype=dtype, dropout=dropout)
    omega = torch.randn(64, 11, dtype=dtype, generator=torch.Generator().manual_seed(1))
    head = prune(from_mlp(mlp), omega, mu=0.3, layout="sparse").head
    head.backend = backend
    return head.train()


def batches(dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """STEPS seeded (x [BATCH, 11], class targets [BATCH]) pairs."""
    gen = torch.Generator().manual_seed(7)
    return [(torch.randn(BATCH, 11, generator=gen, dtype=dtype),
             torch.randint(0, 5, (BATCH,), generator=gen)) for _ in range(STEPS)]


OPTIMIZERS = {
    "adam": lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.1, fused=True),
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1, fused=True),
    "adam_unfused": lambda p: torch.optim.Adam(p, lr=1e-2, weight_decay=0.1),
}


def state_of(head, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The head's kept values and bias with each one's exp_avg, exp_avg_sq and step."""
    values, bias = head.sparse_weight.values, head.bias
    tensors = [values.detach(), bias.detach()]
    for p in (values, bias):
        st = optimizer.state[p]
        tensors += [st["exp_avg"], st["exp_avg_sq"], st["step"]]
    return tensors
