"""The float64 oracle for one benchmark case, computed once and shared by every backend.

The values and their error scales come from `reference` (`forward64`, `abs_forward64`,
`grads64`, `abs_grads64`) and the verdict from `reference.verdict.judge` (shape, dtype, error
under the dtype's tolerance): a benchmark judges a backend exactly as the correctness suite
does. Rows of y, dx and dact depend only on their
own batch row, and dweight is a sum over the batch, so the oracle runs in batch chunks: its
memory stays bounded at any batch size. Results are kept on the CPU.
"""

from __future__ import annotations

from functools import cached_property

import torch

from bench.harness.passes import Outputs, Tensors
from reference import abs_forward64, abs_grads64, forward64, grads64
from reference.verdict import judge

CHUNK_BYTES = 256 * 2**20


def chunk_rows(shape_ipo: tuple[int, int, int], chunk_bytes: int = CHUNK_BYTES) -> int:
    """Batch rows per chunk so that the oracle's float64 intermediates ([rows, I, P] inside
    the forward's einsum, [rows, O, I] inside the gradients') stay under `chunk_bytes`."""
    inputs, paths, outputs = shape_ipo
    per_row = 8 * max(inputs * paths, outputs * inputs, outputs * paths)
    return max(1, chunk_bytes // per_row)


def tf32_enabled(device: torch.device) -> bool:
    """Whether float32 matmuls on this device may round their inputs to TF32."""
    if device.type != "cuda":
        return False
    precision = getattr(torch.backends.cuda.matmul, "fp32_precision", None)
    if precision is not None and precision != "none":
        return precision == "tf32"
    return bool(torch.backends.cuda.matmul.allow_tf32)


class Oracle:
    """float64 values and error scales of y and the three gradients for one set of inputs."""

    def __init__(self, t: Tensors, chunk_bytes: int = CHUNK_BYTES) -> None:
        # what every output must come back as: the inputs' dtype
        self.dtype = t.x.dtype
        # one float64 copy up front, not one per chunk
        self.t = Tensors(*(v.detach().to(torch.float64) for v in (t.x, t.act, t.weight, t.dy)))
        b, i = t.x.shape
        o, _, p = t.weight.shape
        self.rows = chunk_rows((i, p, o), chunk_bytes)
        self.batch = b

    def _chunks(self):
        for start in range(0, self.batch, self.rows):
            rows = slice(start, start + self.rows)
            yield self.t.x[rows], self.t.act[rows], self.t.dy[rows]

    @cached_property
    def forward(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        w = self.t.weight
        values, scales = [], []
        for x, act, _ in self._chunks():
            values.append(forward64(x, act, w).cpu())
            scales.append(abs_forward64(x, act, w).cpu())
        return {"y": (torch.cat(values), torch.cat(scales))}

    @cached_property
    def gradients(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        w = self.t.weight
        dx, dact, sx, sact = [], [], [], []
        dweight = sweight = None
        for x, act, dy in self._chunks():
            g, s = grads64(dy, x, act, w), abs_grads64(dy, x, act, w)
            dx.append(g.x.cpu())
            dact.append(g.act.cpu())
            sx.append(s.x.cpu())
            sact.append(s.act.cpu())
            # dweight sums over the batch: add the chunks' partial sums
            dweight = g.weight.cpu() if dweight is None else dweight + g.weight.cpu()
            sweight = s.weight.cpu() if sweight is None else sweight + s.weight.cpu()
        return {"dx": (torch.cat(dx), torch.cat(sx)), "dact": (torch.cat(dact), torch.cat(sact)),
                "dweight": (dweight, sweight)}

    @cached_property
    def weight_gradient(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(dweight [O, I, P], its error scale) alone, as `gradients` computes them, for a
        caller that needs no dx or dact (a training step of the path weights)."""
        dweight = sweight = None
        for x, act, dy in self._chunks():
            g = torch.einsum("bo,bi,bs->ois", dy, x, act).cpu()
            s = torch.einsum("bo,bi,bs->ois", dy.abs(), x.abs(), act.abs()).cpu()
            dweight = g if dweight is None else dweight + g
            sweight = s if sweight is None else sweight + s
        return dweight, sweight

    def error_ratio(self, outputs: Outputs, tf32: bool = False) -> float:
        """The worst error of any output over its tolerance: <= 1 means correct.

        A missing output, a wrong shape or a dtype other than the inputs' counts as
        infinitely wrong (`reference.verdict.judge`).
        """
        worst = 0.0
        for name, actual in outputs.items():
            expected, scale = (self.forward if name == "y" else self.gradients)[name]
            worst = max(worst, judge(actual, expected, scale, self.dtype, tf32).ratio)
        return worst
