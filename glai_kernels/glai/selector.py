"""The path selector: a frozen ReLU MLP's hidden layers turned into path activations.

For hidden layers 1..L with 0/1 unit gates g_l[b, j] = [pre-activation of unit j > 0], a path
column s of the estimator names one unit per layer from its start layer on:

    act[b, s] = prod_{l = start[s]}^{L} g_l[b, units[l, s]]

A column that starts at layer 1 carries every input (and the constant-1 input for the first
hidden bias); one starting at layer l >= 2 carries only the constant-1 input, i.e. the bias of
layer l (docs/ARCHITECTURE.md §4.3). `units[l, s] == n_l` marks "no unit on this layer" (before
the start).
With one hidden layer and every unit kept, act is just g_1.

The frozen layers' GEMMs run on the extension's `glai_ext::linear` (through
`glai_kernels.fused.linear`; float32/float64 on CPU, outside torch.compile, when the extension
is available: the same rule as the `auto` backend, building it on first need), else on
`F.linear`. At the paper's batch sizes MKL's sgemm reaches
a third of this CPU's FMA peak and the extension about 2x that (docs/notes/sparse.md, "The
selector's GEMM"). `PathSelector.gemm = "torch"` forces F.linear. The two sum in different
orders, so a pre-activation within rounding of 0 may gate differently; the path weights see
such a unit's contribution only as ~its pre-activation (≈ 0) either way.
"""

from __future__ import annotations

import math
import operator

import torch
import torch.nn.functional as F
from torch import nn

from glai_kernels import fused
from glai_kernels.glai.mlp import MLPLayers

GEMMS = ("auto", "cpp", "torch")


def all_paths(hidden: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Every path column of an MLP with hidden widths (n1, ..., nL).

    Returns (units [L, P] long, start [P] long, 1-based). Columns are ordered by start layer,
    then row-major over (j_start, ..., j_L); P = sum_{l=1}^{L} prod_{m=l}^{L} n_m.
    """
    depth = len(hidden)
    units_blocks, start_blocks = [], []
    for first in range(depth):  # 0-based start layer
        spans = hidden[first:]
        count = math.prod(spans)
        index = torch.arange(count)
        block = torch.empty(depth, count, dtype=torch.long)
        stride = count
        for layer in range(depth):
            if layer < first:
                block[layer] = hidden[layer]  # sentinel: no unit on this layer
            else:
                stride //= hidden[layer]
                block[layer] = (index // stride) % hidden[layer]
        units_blocks.append(block)
        start_blocks.append(torch.full((count,), first + 1, dtype=torch.long))
    return torch.cat(units_blocks, 1), torch.cat(start_blocks)


_EXTENSION_DTYPES = (torch.float32, torch.float64)  # what `glai_ext::linear` runs
_READY = False  # True once the extension's CPU kernels were found available


def _extension_ready() -> bool:
    """`fused.unavailable() is None`, asked until it is: the extension is built and loaded
    once per process (extension_build.build is cached), so once available it stays so, and
    a caller reading `_READY` first then spares the four calls of the question (per step,
    see `PathSelector.forward`)."""
    global _READY
    if not _READY:
        _READY = fused.unavailable() is None
    return _READY


_TILE_COLUMNS = 64  # a multiple of every instruction set's register tile width (kNR)


def _padded_columns(weight_t: torch.Tensor, bias: torch.Tensor | None
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """weight_t [I, P] and bias [P] with zero columns up to a multiple of _TILE_COLUMNS."""
    pad = -weight_t.shape[1] % _TILE_COLUMNS
    weight_t = F.pad(weight_t, (0, pad)).contiguous()
    return weight_t, None if bias is None else F.pad(bias, (0, pad))


def _kept_columns(weight: torch.Tensor, bias: torch.Tensor | None, units: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The one hidden layer's weight [n1, n0] and bias [n1] reduced to the path columns'
    units (units [1, P]), transposed to [n0, P] and padded to whole register tiles."""
    return _padded_columns(weight.index_select(0, units[0]).t(),
                           None if bias is None else bias.index_select(0, units[0]))


def _unit_row(units: torch.Tensor, weight: torch.Tensor) -> torch.Tensor | None:
    """units[0] [P] of a one-hidden-layer selector (weight [n1, n0]), contiguous, or None
    when a column names the "no unit" sentinel n1 (its act is the padded column of ones)."""
    row = units[0].contiguous()
    if row.device.type == "meta" or not row.numel():  # no values to look at: shapes only
        return row
    return None if int(row.max()) >= weight.shape[0] else row


class PathSelector(nn.Module):
    """act [B, P] from x [B, n0] through frozen hidden layers (buffers, never trained).

    Dropout rates (one per hidden layer) act on the unit gates in training mode, scaled by
    1/(1-p): with one hidden layer this is exactly the distribution of the MLP's dropout after
    its ReLU; with more, the pattern of deeper layers stays the frozen one (no re-routing).
    """

    def __init__(
        self,
        weights: list[torch.Tensor],
        biases: list[torch.Tensor | None],
        dropout: tuple[float, ...],
        units: torch.Tensor,
        start: torch.Tensor,
    ) -> None:
        """weights[k] [n_{k+1}, n_k] and biases[k] of hidden layer k+1 (copied, frozen);
        units [L, P] and start [P] as in the module docstring."""
        super().__init__()
        depth = len(weights)
        if depth < 1 or len(biases) != depth or len(dropout) != depth:
            raise ValueError("PathSelector needs one weight, bias and dropout rate per hidden "
                             "layer")
        if units.dim() != 2 or units.shape != (depth, start.numel()):
            raise ValueError(f"units must be [L={depth}, P] with one start layer per column, "
                             f"got units {list(units.shape)} and start {list(start.shape)}")
        self.widths = (weights[0].shape[1], *(w.shape[0] for w in weights))  # (n0, ..., nL)
        self.dropout = tuple(float(p) for p in dropout)
        for k, (weight, bias) in enumerate(zip(weights, biases, strict=True)):
            self.register_buffer(f"weight{k}", weight.detach().clone())
            self.register_buffer(f"bias{k}", None if bias is None else bias.detach().clone())
        # on the layers' device: all_paths builds them on the CPU, the MLP may be on a GPU
        device = weights[0].device
        self.register_buffer("units", units.to(device, torch.long).clone())
        self.register_buffer("start", start.to(device, torch.long).clone())
        self._single_full = (depth == 1 and units.shape[1] == self.widths[1]
                             and bool((units[0].cpu() == torch.arange(self.widths[1])).all()))

    @classmethod
    def from_layers(cls, layers: MLPLayers) -> PathSelector:
        """The selector over every path of a parsed MLP (the output layer is not needed)."""
        hidden = layers.linears[:-1]
        units, start = all_paths(layers.widths[1:-1])
        return cls([lin.weight for lin in hidden], [lin.bias for lin in hidden],
                   layers.dropout, units, start)

    @property
    def hidden_layers(self) -> int:
        return len(self.widths) - 1

    @property
    def paths(self) -> int:
        """P, the number of path columns."""
        return self.units.shape[1]

    gemm = "auto"  # "auto" | "cpp" | "torch": what runs the frozen layers (module docstring)

    def gates(self, x: torch.Tensor) -> list[torch.Tensor]:
        """0/1 gates [B, n_l] of every hidden layer, in x's dtype (no dropout).

        With `gemm="torch"` the pre-activations come from the same F.linear calls as the
        MLP's forward, so the pattern is the MLP's own, bit for bit; the extension's GEMM
        sums in another order (module docstring).
        """
        out = []
        h = x.detach()  # the gates are piecewise constant: no gradient flows through them
        buffers = self._buffers  # nn.Module.__getattr__ costs ≈ 1 µs a read, per step
        last = self.hidden_layers - 1
        fast = self._use_extension(h)
        for k in range(last + 1):
            weight, bias = buffers[f"weight{k}"], buffers[f"bias{k}"]
            if fast:
                transposed = self._transposed(k, weight)
                if k == last:  # the compare fused into the GEMM's store
                    out.append(fused.linear(h, transposed, bias, True))
                    break
                pre = fused.linear(h, transposed, bias, False)
            else:
                pre = F.linear(h, weight, bias)
            out.append((pre > 0).to(x.dtype))
            if k < last:  # the last layer's ReLU feeds nothing here
                h = torch.relu(pre)
        return out

    def _use_extension(self, x: torch.Tensor) -> bool:
        gemm = self.gemm
        if gemm == "auto":  # the default first: one expression, in the order of the rule below
            return (x.device.type == "cpu" and x.dtype in _EXTENSION_DTYPES
                    and self._buffers["weight0"].dtype == x.dtype
                    and not torch.compiler.is_compiling() and (_READY or _extension_ready()))
        if gemm not in GEMMS:
            raise ValueError(f"PathSelector.gemm must be one of {GEMMS}, got {gemm!r}")
        if gemm == "torch" or torch.compiler.is_compiling():
            return False
        usable = (x.device.type == "cpu" and x.dtype in _EXTENSION_DTYPES
                  and self._buffers["weight0"].dtype == x.dtype)
        if gemm == "cpp":
            if not usable:
                raise ValueError(f"PathSelector.gemm='cpp' runs float32/float64 on CPU, got "
                                 f"x {x.dtype} on {x.device}")
            why = fused.unavailable()
            if why is not None:
                raise RuntimeError(f"PathSelector.gemm='cpp': {why}")
            return True
        return usable and fused.unavailable() is None

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.pop("_derived_cache", None)  # derived from the buffers: not worth pickling
        return state

    def _derived(self, name: object, sources: tuple, make):
        """make(*sources), kept while each source is the same tensor at the same version
        (load_state_dict copies into the buffers in place: their versions move)."""
        cache = self.__dict__.setdefault("_derived_cache", {})
        kept = cache.get(name)
        # a list comprehension and map(is_): ≈ 1 µs less a step than generators
        versions = [-1 if t is None else t._version for t in sources]
        # the entry holds the sources themselves, so their ids cannot be reused while compared
        if (kept is None or kept[1] != versions or len(kept[0]) != len(sources)
                or not all(map(operator.is_, kept[0], sources))):
            kept = (sources, versions, make(*sources))
            cache[name] = kept
        return kept[2]

    def _transposed(self, k: int, weight: torch.Tensor) -> torch.Tensor:
        """weight{k}^T [n_k, n_{k+1}], contiguous."""
        return self._derived(k, (weight,), lambda w: w.t().contiguous())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, n0] -> act [B, P], 0/1 (or dropout-scaled in training mode)."""
        widths = self.widths
        if x.dim() != 2 or x.shape[1] != widths[0]:
            raise ValueError(f"x must be [B, {widths[0]}], got {list(x.shape)}")
        buffers = self._buffers
        # every Python line here costs ~3x its time alone inside a training step at the
        # paper's B = 16 (docs/notes/pipeline.md, "The ordinary GLAI step, second pass (issue
        # 41, stop 46)"): the one-hidden-layer case reads as few attributes as it can
        if len(widths) == 2 and not (self.training and self.dropout[0] > 0):
            if self._use_extension(x):
                # act[:, s] is unit units[0, s]'s gate: the column selection folded into the
                # GEMM (each column sums in the same order wherever it sits: the same bits as
                # selecting from every unit's gates), the columns zero-padded to whole register
                # tiles once here, so the kernel does not pad its last block on every call
                # (B1's P = 319: ≈ 9 µs a call; docs/notes/sparse.md, "The bias's update in one
                # call, and the selector's tiles")
                units = buffers["units"]
                weight, bias = self._derived("columns", (buffers["weight0"], buffers["bias0"],
                                                         units), _kept_columns)
                paths = units.shape[1]
                out = fused.linear(x.detach() if x.requires_grad else x, weight, bias, True)
                return out if out.shape[1] == paths else out[:, :paths].contiguous()
            if not torch.compiler.is_compiling():  # Dynamo traces `gates` (its cache)
                act = self._one_layer_torch(x)
                if act is not None:
                    return act
        gates = self.gates(x)
        if self.training:
            gates = [F.dropout(g, p, training=True) if p > 0 else g
                     for g, p in zip(gates, self.dropout, strict=True)]
        if self._single_full:
            return gates[0]
        act = None
        for layer, gate in enumerate(gates):
            # one extra column of ones stands for "no unit on this layer"
            column = F.pad(gate, (0, 1), value=1.0).index_select(1, self.units[layer])
            act = column if act is None else act * column
        return act

    def _one_layer_torch(self, x: torch.Tensor) -> torch.Tensor | None:
        """act [B, P] of a one-hidden-layer selector without dropout on F.linear (`gemm`
        "torch", or where the extension's GEMM does not run): `gates`' own F.linear call (the
        MLP's pre-activations, bit for bit), its kept columns selected, the compare written in
        place. `gates` and the column selection take five ops and four [B, n1]-sized tensors
        for this (the compare's bools, their cast, the padded copy, the selection), ≈ 11 µs of
        the ≈ 30 µs selector alone at A2 (docs/notes/pipeline.md, "The ordinary GLAI step, third
        pass (issue 41, stop 49)"); the bits are the same. None where a column names the "no
        unit" sentinel (only in a hand-made selector): the gates' path then."""
        buffers = self._buffers
        columns = None
        if not self._single_full:
            columns = self._derived("unit row", (buffers["units"], buffers["weight0"]),
                                    _unit_row)
            if columns is None:
                return None
        pre = F.linear(x.detach() if x.requires_grad else x, buffers["weight0"],
                       buffers["bias0"])
        if columns is not None:
            pre = pre.index_select(1, columns)
        if pre.dtype != x.dtype or pre.requires_grad:  # autocast's dtype; trainable buffers
            return (pre > 0).to(x.dtype)
        return pre.gt_(0)  # 1.0 where > 0, else 0.0 (NaN too), as (pre > 0).to(x.dtype)

    def select(self, columns: torch.Tensor) -> PathSelector:
        """A selector with only these path columns, in this order (same frozen layers)."""
        columns = columns.to(self.units.device)
        depth = self.hidden_layers
        new = PathSelector([getattr(self, f"weight{k}") for k in range(depth)],
                           [getattr(self, f"bias{k}") for k in range(depth)],
                           self.dropout, self.units[:, columns], self.start[columns])
        return new.train(self.training)

    def input_support(self) -> torch.Tensor:
        """[I, P] bool: which (input, column) pairs are paths at all. I = n0 + 1; a column
        starting at layer >= 2 is a bias path and carries only the constant input (last)."""
        n0 = self.widths[0]
        support = (self.start == 1).unsqueeze(0).expand(n0 + 1, -1).clone()
        support[n0] = True
        return support

    def extra_repr(self) -> str:
        return f"widths={self.widths}, paths={self.paths}, dropout={self.dropout}"
