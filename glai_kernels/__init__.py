"""glai-kernels: the GreenLightningAI estimator as one PyTorch op with interchangeable backends.

    y = glai_kernels.estimator(x, act, weight, bias=None, backend=None)
    y[b, o] = sum_i sum_s x[b, i] * act[b, s] * weight[o, i, s] + bias[o]

`backend=` picks an implementation per call; $GLAI_BACKEND sets the default; "auto" picks
the fastest available one for the tensors' device. `glai_kernels.backends()` lists them.

    head = glai_kernels.from_mlp(mlp)   # a ReLU MLP as a GLAI head, exactly (glai_kernels.glai)
    sw = glai_kernels.sparse.from_dense(weight, mask)   # only the kept path weights
    y = glai_kernels.sparse.estimator(x, act, sw, bias)  # cost follows the K kept weights
"""

from glai_kernels import backends as _backend_modules  # noqa: F401  (registers every backend)
from glai_kernels import sparse  # the kept-path estimator (glai_kernels.sparse.estimator)
from glai_kernels.contract import SUPPORTED_DTYPES, Shape, check_inputs
from glai_kernels.glai import GLAIHead, from_mlp
from glai_kernels.module import GLAIEstimator
from glai_kernels.op import estimator
from glai_kernels.registry import BackendStatus, statuses


def backends() -> list[BackendStatus]:
    """Every registered backend, where it is available and why not elsewhere."""
    return statuses()


__all__ = [
    "SUPPORTED_DTYPES",
    "BackendStatus",
    "GLAIEstimator",
    "GLAIHead",
    "Shape",
    "backends",
    "check_inputs",
    "estimator",
    "from_mlp",
    "sparse",
]
__version__ = "0.1.0"
