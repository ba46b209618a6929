"""The oracles every backend is judged against, in plain PyTorch (the tests' package, not
installed).

- `listing1_forward`/`listing1_backward`: the paper's Listing 1 (two einsums) and the
  gradients its autograd computes; they live in the library as the `einsum` backend
  (glai_kernels/backends/einsum.py) and are re-exported here.
- `float64`: docs/ARCHITECTURE.md §1's forward and gradient formulas, written out, evaluated in
  float64,
  with the matching sums of absolute values that scale each dtype's tolerance.
- `loops`: literal loops after the paper's Listings 2 and 3, for tiny sizes: a second,
  independent oracle that checks the first.
- `inputs`: seeded random inputs (never zeros) shared by the tests and the benchmarks.
- `tolerance`: the one per-dtype tolerance table and the closeness check built on it.
- `verdict`: the one verdict (`judge`) that the tests and the benchmarks both apply to a
  backend's result: present, the right shape and dtype, and within the dtype's tolerance.
"""

from glai_kernels.backends.einsum import listing1_backward, listing1_forward
from reference.float64 import Gradients, abs_forward64, abs_grads64, forward64, grads64
from reference.inputs import Inputs, make_inputs
from reference.loops import loops_backward, loops_forward
from reference.tolerance import TOLERANCE, is_close, tolerance, worst_error
from reference.verdict import Verdict, judge

__all__ = [
    "TOLERANCE",
    "Gradients",
    "Inputs",
    "Verdict",
    "abs_forward64",
    "abs_grads64",
    "forward64",
    "grads64",
    "is_close",
    "judge",
    "listing1_backward",
    "listing1_forward",
    "loops_backward",
    "loops_forward",
    "make_inputs",
    "tolerance",
    "worst_error",
]
