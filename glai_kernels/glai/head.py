"""`GLAIHead`: a frozen path selector feeding the estimator op; a drop-in MLP head.

Two layouts of the path weights: "dense" (a Parameter [O, I, P], with an optional mask of
the paths that exist) and "sparse" (a `glai_kernels.sparse.SparsePathWeight`: only the K
kept values are a Parameter, the sparse op computes over them). `prune` picks the layout.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
from torch import nn

from glai_kernels import registry
from glai_kernels import sparse as sparse_op
from glai_kernels.autocast import autocast_dtype
from glai_kernels.glai.selector import PathSelector
from glai_kernels.op import backend_for, estimator
from glai_kernels.sparse import SparsePathWeight

LAYOUTS = ("dense", "sparse")


def _zero_pruned_gradient(module_ref: weakref.ref) -> Callable[[torch.Tensor], None]:
    """A post-accumulate-grad hook: zero the gradient of pruned path weights, in place, once
    per backward (however many forwards fed it). A weight that starts at zero with zero
    gradient and zero optimizer state stays exactly zero under SGD/Adam/AdamW with weight
    decay, whose update of such an entry is 0."""

    def hook(param: torch.Tensor) -> None:
        module = module_ref()
        if module is not None and module._pruned is not None and param.grad is not None:
            param.grad.masked_fill_(module._pruned, 0)

    return hook


class GLAIHead(nn.Module):
    """y = estimator([x, 1], selector(x), weight, bias): a GLAI model as an nn.Module.

    Shapes: x [B, n0] -> y [B, O]; weight [O, I = n0+1, P]; act [B, P] from the frozen
    selector (its layers are buffers).

    Dense layout (`weight` a tensor): the parameters are `weight` and `bias`. `weight_mask`
    (bool [O, I, P], or None for all) marks the path weights that exist: entries outside it
    are zero, get zero gradient (a post-accumulate-grad hook zeroes it in place after each
    backward), and are not counted by `num_parameters()`.

    Sparse layout (`weight` a SparsePathWeight, no mask): the parameters are
    `sparse_weight.values` [K] and `bias`, so `sum(p.numel() for p in head.parameters()) ==
    head.num_parameters()` and an optimizer steps over K values; the forward runs the sparse
    op (`glai_kernels.sparse.estimator`; `backend` names a sparse backend). `head.weight`
    and `head.weight_mask` still read as the dense [O, I, P] weight and mask, computed on
    each access (for inspection: O·I·P elements).

    Loading a state dict (`load_state_dict`) keeps every Parameter object: an optimizer built
    before the load steps what was loaded. A sparse state dict of another K resizes
    `sparse_weight.values` in place (SparsePathWeight's docstring: the optimizer's moments of
    the old K must then be loaded with the optimizer's state dict, or the optimizer rebuilt;
    torch.optim.Adam raises at `step()` on moments of the old size, and FusedSparseStep resets
    them).

    Meta tensors: a head moved with `.to("meta")` runs forward and backward (shapes only), in
    either layout; `prune` refuses a meta head or reference (which paths survive depends on
    their values).

    `backend_used` records the estimator backend of the last forward; in the sparse layout
    it is prefixed "sparse:" (e.g. "sparse:torch"), a sparse registry name, so a record
    of it says which op ran. Build one with `glai_kernels.from_mlp(mlp)`; prune
    with `glai_kernels.glai.prune`.
    """

    def __init__(
        self,
        selector: PathSelector,
        weight: torch.Tensor | SparsePathWeight,
        bias: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        *,
        backend: str | None = None,
    ) -> None:
        super().__init__()
        n0 = selector.widths[0]
        shape = tuple(weight.shape)
        if len(shape) != 3 or shape[1:] != (n0 + 1, selector.paths):
            raise ValueError(f"weight must be [O, {n0 + 1}, {selector.paths}] for this "
                             f"selector, got {list(shape)}")
        if bias is not None and bias.shape != shape[:1]:
            raise ValueError(f"bias must be [{shape[0]}], got {list(bias.shape)}")
        self.selector = selector
        self.backend = backend
        self.backend_used: str | None = None
        self._hooked: int | None = None
        if isinstance(weight, SparsePathWeight):
            if mask is not None:
                raise ValueError("mask must be None with a SparsePathWeight (its entries are "
                                 "the paths that exist)")
            sparse_backend_name(backend)  # an unknown name fails here, not mid-training
            self.sparse_weight = weight
            self.bias = nn.Parameter(bias.detach().clone()) if bias is not None else None
            return
        self._init_dense(weight, bias, mask)

    def _init_dense(self, weight: torch.Tensor, bias: torch.Tensor | None,
                    mask: torch.Tensor | None) -> None:
        backend = self.backend
        if mask is not None and (mask.shape != weight.shape or mask.dtype != torch.bool):
            raise ValueError(f"mask must be bool {list(weight.shape)}, got {mask.dtype} "
                             f"{list(mask.shape)}")
        registry.requested_name(backend)  # an unknown backend name fails here, not mid-training
        weight = weight.detach().clone()
        pruned = None if mask is None else ~mask
        if pruned is not None:
            weight.masked_fill_(pruned, 0)
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias.detach().clone()) if bias is not None else None
        self.register_buffer("weight_mask", None if mask is None else mask.clone())
        # the complement, kept so each step's gradient masking is one in-place pass
        self.register_buffer("_pruned", pruned, persistent=False)
        self._ensure_gradient_mask()

    @property
    def layout(self) -> str:
        """"sparse" when the kept values are the parameter, else "dense"."""
        sparse = self.__dict__.get("_modules", {}).get("sparse_weight") is not None
        return "sparse" if sparse else "dense"

    def __getattr__(self, name: str):
        # The sparse layout has no dense `weight` / `weight_mask`; reading them gives the
        # dense view, so code that inspects a head works in either layout.
        sw = self.__dict__.get("_modules", {}).get("sparse_weight")
        if name in ("weight", "weight_mask") and sw is not None:
            return sw.to_dense() if name == "weight" else sw.mask()
        return super().__getattr__(name)

    def _ensure_gradient_mask(self) -> None:
        # Hooks live on the Parameter object and are not deep-copied, so a copied head (or one
        # whose Parameter was replaced) registers its own on first use.
        if self._pruned is not None and self._hooked != id(self.weight):
            self.weight.register_post_accumulate_grad_hook(
                _zero_pruned_gradient(weakref.ref(self)))
            self._hooked = id(self.weight)

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        if self.layout == "dense" and self.weight_mask is not None:
            self._pruned = ~self.weight_mask  # a loaded mask replaces its complement too

    @property
    def in_features(self) -> int:
        return self.selector.widths[0]

    @property
    def weight_shape(self) -> tuple[int, int, int]:
        """(O, I, P) of the estimator weight, in either layout."""
        if self.layout == "sparse":
            return self.sparse_weight.shape
        return tuple(self.weight.shape)

    @property
    def out_features(self) -> int:
        return self.weight_shape[0]

    @property
    def paths(self) -> int:
        """P, the estimator's path columns (dense size of its last dimension)."""
        return self.weight_shape[2]

    @property
    def dtype(self) -> torch.dtype:
        """The path weights' dtype."""
        return self.sparse_weight.dtype if self.layout == "sparse" else self.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.sparse_weight.device if self.layout == "sparse" else self.weight.device

    def path_count(self) -> int:
        """Path weights that exist (kept and not structurally zero)."""
        if self.layout == "sparse":
            return self.sparse_weight.nnz
        if self.weight_mask is None:
            return self.weight.numel()
        return int(self.weight_mask.sum())

    def num_parameters(self) -> int:
        """Trainable parameters: kept path weights plus the output bias."""
        return self.path_count() + (self.bias.numel() if self.bias is not None else 0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, n0] -> y [B, O]."""
        # the submodules and the bias read from the module's dicts: nn.Module.__getattr__
        # costs ≈ 1 µs a read, per step (docs/notes/pipeline.md, "A cheaper ordinary GLAI
        # step (issue 41 item 2, stop 45)")
        modules = self._modules
        act = modules["selector"](x)
        sw = modules.get("sparse_weight")
        if sw is not None:  # the sparse layout
            # the dtype the op runs in: inside torch.autocast the region's (the op casts)
            dtype = autocast_dtype(x.device.type)
            if dtype is None or not x.is_floating_point() or x.dtype == torch.float64:
                dtype = x.dtype
            backend = self.backend
            chosen = sparse_op.op.resolve(backend, x.device, dtype,
                                          sparse_op.op.auto_call(x, act, sw, backend, True))
            used = f"sparse:{chosen.name}"
            if self.__dict__.get("backend_used") != used:  # nn.Module.__setattr__: ≈ 1 µs
                self.backend_used = used
            # resolved once here, not again inside `estimator` (docs/notes/sparse.md, "Training
            # step: the Python around the kernels"); the constant-1 input that carries the
            # hidden biases supplied by the op (`ones`)
            return sparse_op.op.run_resolved(x, act, sw, self._parameters.get("bias"), chosen,
                                             ones=True)
        # the constant-1 input carries the hidden biases (F.pad's own call, without its
        # Python wrapper: one frame fewer per step)
        x_aug = torch.constant_pad_nd(x, (0, 1), 1.0)
        if self._pruned is not None and torch.is_grad_enabled():
            self._ensure_gradient_mask()
        name = backend_for(x_aug, self.backend, act, self.weight)
        self.backend_used = name
        return estimator(x_aug, act, self.weight, self.bias, backend=name)

    def extra_repr(self) -> str:
        out_count, in_count, path_count = self.weight_shape
        return (f"in_features={self.in_features}, paths={self.paths}, "
                f"out_features={self.out_features}, kept={self.path_count()}/"
                f"{out_count * in_count * path_count}, layout={self.layout}, "
                f"backend={self.backend or 'env/auto'}")


def sparse_backend_name(backend: str | None) -> str:
    """The sparse backend `backend` (else $GLAI_BACKEND, else "auto") asks for; raises
    ValueError if it names none (e.g. a backend only the dense op has): the sparse op's own
    `requested_name`."""
    return sparse_op.op.requested_name(backend)


def has_sparse_backend(backend: str | None) -> bool:
    """Whether the requested backend (argument, else $GLAI_BACKEND, else auto) exists for
    the sparse op."""
    try:
        sparse_backend_name(backend)
    except ValueError:
        return False
    return True
