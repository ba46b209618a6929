"""Registered CPU backends that record their calls, for the tests of how `auto` chooses
(correctness/test_registry.py: the priorities; correctness/test_dispatch.py: the tables)."""

from __future__ import annotations

import torch

from glai_kernels import registry


def spy_backend(name: str, priority: int, calls: list[str]) -> registry.Backend:
    """A CPU backend computing the op with einsum and appending "<name>.forward" or
    "<name>.backward" to `calls` on each call; `priority` is its CPU auto priority."""

    def forward(x, act, weight):
        calls.append(f"{name}.forward")
        return torch.einsum("bi,bs,ois->bo", x, act, weight)

    def backward(dy, x, act, weight, needs, saved=None):
        calls.append(f"{name}.backward")
        return (torch.einsum("bo,ois,bs->bi", dy, weight, act) if needs[0] else None,
                torch.einsum("bo,bi,ois->bs", dy, x, weight) if needs[1] else None,
                torch.einsum("bo,bi,bs->ois", dy, x, act) if needs[2] else None)

    return registry.Backend(name=name, forward=forward, backward=backward,
                            devices=("cpu",), description="spy",
                            auto_priority={"cpu": priority})
