"""The sparse op's backends: `SPARSE_ESTIMATOR`, a `glai_kernels.registry.Registry` whose
`Backend` entries take these signatures (selection as for the dense op: `backend=`, else
$GLAI_BACKEND, else "auto").

    forward(x, act, values, index) -> y
        x [B, I], act [B, P], values [K] (one supported dtype, contiguous, one device),
        index: KeptIndex (layout.py; int32, contiguous, same device). B, I, P, O, K >= 1.
        Returns y [B, O] in the inputs' dtype, without bias. Must not modify its inputs.

    forward_saving(x, act, values, index) -> (y, zg)      [optional]
        As forward, also returning the group partial sums Zg (layout.py) in
        accumulation_dtype(x.dtype) (float32 for float16/bfloat16, else x's dtype), laid out
        as the backend likes ([B, G], or [G, B] for a kernel with B on the lanes); the
        Backend's `saved_shape(SparseShape)` states which, for fake tensors. The op asks for
        it only when act needs a gradient, and hands it back to this backend's backward.

    backward(dy, x, act, values, index, needs, saved=None) -> (dx, dact, dvalues)
        dy [B, O]; needs = (need_x, need_act, need_values). Returns dx [B, I], dact [B, P],
        dvalues [K] in the inputs' dtype, None for a gradient not needed (and not computed).
        `saved` is forward_saving's Zg when the forward ran that way, else absent.

Backend's other fields mean what they do for the dense op (glai_kernels/registry.py); the
first registered is `torch`, the baseline that sparse benchmarks time the others against.
Empty calls (B, I, P, O or K zero) never reach a backend: the op answers them with zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

from glai_kernels.contract import Pass
from glai_kernels.registry import Registry


@dataclass(frozen=True)
class SparseShape:
    """The sizes of one sparse call: B, I, P, O and the layout's K and G."""

    batch: int
    inputs: int
    paths: int
    outputs: int
    nnz: int
    groups: int

    def forward_flops(self) -> int:
        """2·B·K for the group sums plus 2·B·G to scale and add them (docs/ARCHITECTURE.md)."""
        return 2 * self.batch * (self.nnz + self.groups)

    def flops(self, pass_: Pass = "forward") -> int:
        """Floating-point operations; the backward (dx, dact, dvalues) is three forwards."""
        return {"forward": 1, "backward": 3, "both": 4}[pass_] * self.forward_flops()

    def min_bytes(self, itemsize: int, pass_: Pass = "forward") -> int:
        """Fewest bytes a pass reads or writes once each: the bytes floor.

        forward:  values [K], the index arrays it walks (inputs [K], group_ptr [G+1],
                  group_paths [G], output_ptr [O+1], int32), x, act, and y written.
        backward: dy, x, act, values and all ten index arrays read; dx, dact, dvalues
                  written (the group sums Zg, when kept, add B·G·4 more, not counted).
        """
        b, i, p, o, k, g = (self.batch, self.inputs, self.paths, self.outputs, self.nnz,
                            self.groups)
        index_forward = 4 * (k + (g + 1) + g + (o + 1))
        index_all = 4 * (3 * k + 4 * g + (g + 1) + (o + 1) + (i + 1) + (p + 1))
        forward = itemsize * (k + b * i + b * p + b * o) + index_forward
        backward = itemsize * (b * o + b * i + b * p + k) * 2 - itemsize * b * o + index_all
        return {"forward": forward, "backward": backward, "both": forward + backward}[pass_]


def groups_by_batch(shape: SparseShape) -> tuple[int, int]:
    """Zg^T kept as [G, B], the batch contiguous: the `saved_shape` of every backend that
    does not pad the batch."""
    return (shape.groups, shape.batch)


SPARSE_ESTIMATOR = Registry("sparse_estimator")
"""The sparse kept-path estimator's backends (glai_kernels/sparse/backends/)."""
