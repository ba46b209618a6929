"""Deliberately wrong estimators. The checker must reject every one of them; if it passes
one, the checker (or its tolerances) cannot be trusted."""

from __future__ import annotations

import torch

from reference import listing1_forward


def weight_transposed(x, act, weight, bias):
    """Reads weight [O, I, P] as if it were laid out [O, P, I]."""
    o, i, p = weight.shape
    return listing1_forward(x, act, weight.reshape(o, p, i).transpose(1, 2), bias)


def act_ignored(x, act, weight, bias):
    """Treats every path as active."""
    return listing1_forward(x, torch.ones_like(act), weight, bias)


def bias_forgotten(x, act, weight, bias):
    return listing1_forward(x, act, weight, None)


class _DropActGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, act, weight):
        ctx.save_for_backward(x, act, weight)
        return torch.einsum("bi,bs,ois->bo", x, act, weight)

    @staticmethod
    def backward(ctx, dy):
        x, act, weight = ctx.saved_tensors
        dx = torch.einsum("bo,ois,bs->bi", dy, weight, act)
        dweight = torch.einsum("bo,bi,bs->ois", dy, x, act)
        return dx, torch.zeros_like(act), dweight


def act_gradient_dropped(x, act, weight, bias):
    y = _DropActGradient.apply(x, act, weight)
    return y if bias is None else y + bias


def accumulates_in_half(x, act, weight, bias):
    """Sums in the inputs' half precision, one rounding per term, with no float32
    accumulator: right for short sums, wrong at the paper's K = I*P."""
    outer = (x.unsqueeze(2) * act.unsqueeze(1)).reshape(x.shape[0], -1)
    w = weight.reshape(weight.shape[0], -1)
    y = torch.zeros(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device)
    for k in range(outer.shape[1]):
        y = y + outer[:, k:k + 1] * w[:, k]
    return y if bias is None else y + bias


KNOWN_WRONG = {
    "weight_transposed": (weight_transposed, "y"),
    "act_ignored": (act_ignored, "y"),
    "bias_forgotten": (bias_forgotten, "y"),
    "act_gradient_dropped": (act_gradient_dropped, "dact"),
}
