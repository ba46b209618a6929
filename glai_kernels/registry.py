"""The backend registry: every implementation of the one op, by name.

A backend is one module in `glai_kernels/backends/` that calls `register(Backend(...))` at
import; `glai_kernels.backends` imports every module there, so adding a backend means adding
one file. Selection: the `backend=` argument, else the `GLAI_BACKEND` environment variable,
else "auto", which takes the measured winner from the machine's dispatch table
(glai_kernels/dispatch/, written by the benchmarks) for the call's dtype, mode and shape, and
otherwise the available backend with the highest `auto_priority` for the tensors' device type
and dtype.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import torch

from glai_kernels import dispatch
from glai_kernels.contract import SUPPORTED_DTYPES, Shape

ENV_VAR = "GLAI_BACKEND"
AUTO = "auto"

ForwardFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""(x [B, I], act [B, P], weight [O, I, P]) -> y [B, O] without bias.

Inputs are contiguous, of one supported dtype and device, with B, I, P, O >= 1; the result
is a new tensor of the inputs' dtype. Inputs must not be modified.
"""

BackwardFn = Callable[..., tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]]
"""(dy [B, O], x, act, weight, (need_x, need_act, need_weight), saved=None)
-> (dx [B, I], dact [B, P], dweight [O, I, P]).

A gradient that is not needed is returned as None and should not be computed. `saved` is
what the backend's `forward_saving` returned with y, when the forward ran that way.
"""

ForwardSavingFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor],
                           tuple[torch.Tensor, torch.Tensor]]
"""(x, act, weight) -> (y, saved): a forward that also keeps a tensor which makes the
backward cheaper when act needs a gradient (as aten's layer norm keeps its statistics)."""

EagerFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, bool],
                  torch.Tensor]
"""(x, act, weight, bias, save) -> y [B, O] with the backend's own autograd node: optional, for
eager calls on plain tensors that need gradients (glai_kernels/op.py), where a node in C++
costs less than op.py's Python Function. Inputs checked and non-empty as ForwardFn's, but as
the caller gave them (possibly not contiguous); bias [O] or None; `save` as for
`forward_saving`. Its output, gradients and gradients of gradients must be the custom op's
bit for bit (correctness/test_small_batch.py), its results new tensors. The sparse op calls it
with its KeptIndex after `save`."""

WorkspaceFn = Callable[[Shape, bool, frozenset[str]], int]
"""(shape, forward, grads) -> elements of intermediates one call keeps alive at its peak,
beyond its inputs and results: a forward when `forward` is true (`grads` says which
gradients its backward will need, which decides what it keeps), else a backward computing
`grads` (a subset of {"x", "act", "weight"}), including what the forward kept for it."""


def device_present(device_type: str) -> str | None:
    """None when this process can use the device type, else why not."""
    if device_type == "cuda" and not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    return None


@dataclass(frozen=True)
class Backend:
    """One implementation of the estimator op.

    `availability(device_type)` returns None when the backend can run on that device type in
    this process, else the reason it cannot (a missing package, no GPU, a failed build).
    `auto_priority` maps a device type to this backend's rank when "auto" chooses (highest
    wins; a device type not listed is never chosen by auto). A backend with
    `forward_saving` also gives `saved_shape`, the shape of what it saves, for fake tensors.
    `baseline` marks the one backend of an op that benchmarks time every other against in the
    same run (the dense op's is `einsum`, the paper's Listing 1). `workspace` estimates its
    intermediates (see `WorkspaceFn`) so a benchmark can skip a case that would not fit;
    None means fused: no intermediate larger than its results. `eager` (see `EagerFn`)
    records its own autograd node for eager calls instead of op.py's Python Function.
    """

    name: str
    forward: ForwardFn
    backward: BackwardFn
    devices: tuple[str, ...]
    description: str
    dtypes: tuple[torch.dtype, ...] = SUPPORTED_DTYPES
    auto_priority: Mapping[str, int] = field(default_factory=dict)
    availability: Callable[[str], str | None] = device_present
    forward_saving: ForwardSavingFn | None = None
    saved_shape: Callable[[Shape], tuple[int, ...]] | None = None
    baseline: bool = False
    workspace: WorkspaceFn | None = None
    eager: EagerFn | None = None
    op: str = field(default="", compare=False)  # set by the registry it is registered in

    def unsupported_reason(self, device_type: str, dtype: torch.dtype | None = None) -> str | None:
        """Why this backend cannot take tensors of this device type and dtype, or None."""
        if device_type not in self.devices:
            return f"runs on {', '.join(self.devices)}, not {device_type}"
        if dtype is not None and dtype not in self.dtypes:
            return f"supports {', '.join(str(d) for d in self.dtypes)}, not {dtype}"
        return Registry.of(self.op).availability(self.name, device_type)

    def workspace_elements(self, shape: Shape, forward: bool, grads: Iterable[str]) -> int:
        """This backend's `workspace` for one call (0 for a fused backend)."""
        return 0 if self.workspace is None else self.workspace(shape, forward, frozenset(grads))


_ENVIRON = os.environ
_ENV_KEY = getattr(_ENVIRON, "encodekey", lambda key: key)(ENV_VAR)


def environment_backend() -> str:
    """$GLAI_BACKEND's value ("" when unset), as `os.environ.get` gives it. Read on every op
    call: `get` of an unset variable raises and catches a KeyError inside (≈ 0.5 µs), so the
    mapping under `os.environ` is read directly where it is CPython's own (`os._Environ`: every
    write to `os.environ` goes through its `_data`; a bare `os.putenv` reaches neither), `get`
    otherwise."""
    environ = os.environ
    data = getattr(environ, "_data", None) if environ is _ENVIRON else None
    if data is None:
        return environ.get(ENV_VAR, "")
    raw = data.get(_ENV_KEY)
    return "" if raw is None else environ.decodevalue(raw)


_AVAILABILITY: dict[tuple[str, str, str], str | None] = {}
_RESOLVED_MAX = 256  # a registry's remembered answers (`Registry.resolve`), cleared when full


@torch._dynamo.assume_constant_result
def _availability(op: str, name: str, device_type: str) -> str | None:
    """A backend's availability on a device type, asked once per process.

    Checks may build an extension or look for a compiler, which should happen once, and
    which torch.compile cannot trace: it takes the answer as a constant instead.
    """
    key = (op, name, device_type)
    if key not in _AVAILABILITY:
        _AVAILABILITY[key] = Registry.of(op).get(name).availability(device_type)
    return _AVAILABILITY[key]


class Registry:
    """The backends of one op, by name (the dense estimator's is `ESTIMATOR`; the sparse
    kept-path estimator has its own). Selection is the same for every op: the `backend=`
    argument, else $GLAI_BACKEND, else "auto"."""

    _BY_OP: ClassVar[dict[str, Registry]] = {}

    def __init__(self, op: str) -> None:
        if op in Registry._BY_OP:
            raise ValueError(f"a registry for op {op!r} already exists")
        self.op = op
        self._backends: dict[str, Backend] = {}
        self._resolved: dict[tuple, Backend] = {}  # `resolve`'s answers (`_resolve_key`)
        Registry._BY_OP[op] = self
        dispatch.on_clear(self._resolved.clear)  # tables swapped: "auto" may pick another

    @classmethod
    def of(cls, op: str) -> Registry:
        return cls._BY_OP[op]

    def availability(self, name: str, device_type: str) -> str | None:
        return _availability(self.op, name, device_type)

    def _forget(self, name: str) -> None:
        for key in [k for k in _AVAILABILITY if k[:2] == (self.op, name)]:
            del _AVAILABILITY[key]
        self._resolved.clear()

    def register(self, backend: Backend) -> Backend:
        """Add a backend; its name must be new and not the reserved word "auto"."""
        if backend.name == AUTO or backend.name in self._backends:
            raise ValueError(f"backend name {backend.name!r} is reserved or already registered")
        if backend.baseline and any(b.baseline for b in self._backends.values()):
            raise ValueError(f"{self.op} already has a baseline backend ({self.baseline().name})")
        object.__setattr__(backend, "op", self.op)
        self._backends[backend.name] = backend
        self._resolved.clear()
        return backend

    def replace(self, backend: Backend) -> Backend:
        """Swap the registered backend of the same name for `backend`, keeping its place;
        returns the one it replaced (the regression gate's tests plant a slowed variant)."""
        old = self.get(backend.name)
        object.__setattr__(backend, "op", self.op)
        self._backends[backend.name] = backend
        self._forget(backend.name)
        return old

    def unregister(self, name: str) -> None:
        """Remove a backend (tests register deliberately wrong ones and remove them)."""
        self._backends.pop(name, None)
        self._forget(name)

    def names(self) -> list[str]:
        """Registered backend names, in registration order."""
        return list(self._backends)

    def backends(self) -> list[Backend]:
        return list(self._backends.values())

    def get(self, name: str) -> Backend:
        """The backend called `name`; an unknown name raises listing the registered ones."""
        try:
            return self._backends[name]
        except KeyError:
            known = ", ".join([AUTO, *sorted(self._backends)])
            raise ValueError(f"unknown {self.op} backend {name!r}; "
                             f"registered backends: {known}") from None

    def baseline(self) -> Backend:
        """The backend every same-run speedup is measured against (for the dense op, the
        paper's Listing 1)."""
        for b in self._backends.values():
            if b.baseline:
                return b
        raise LookupError(f"no baseline backend is registered for {self.op}")

    def requested_name(self, backend: str | None = None) -> str:
        """The name asked for: the argument, else $GLAI_BACKEND, else "auto"."""
        if backend is not None:
            if backend != AUTO:
                self.get(backend)  # validate early, whatever the tensors
            return backend
        name = environment_backend() or AUTO
        if name != AUTO:
            try:
                self.get(name)
            except ValueError as error:  # say where the name came from
                raise ValueError(f"${ENV_VAR}={name!r} (the environment variable) is not "
                                 f"a backend: {error}") from None
        return name

    def pick_auto(self, device_type: str, dtype: torch.dtype,
                  call: dispatch.Call | None = None) -> Backend:
        """The backend "auto" runs for this device and dtype.

        With `call` (the mode and shape), the measured winner from the machine's dispatch
        table (glai_kernels/dispatch/) when there is one and it can run here; otherwise the
        available backend with the highest auto priority.
        """
        if call is not None:
            name, _rule = dispatch.measured_pick(self.op, device_type, dtype, call)
            chosen = self._backends.get(name) if name is not None else None
            if (chosen is not None and device_type in chosen.auto_priority
                    and chosen.unsupported_reason(device_type, dtype) is None):
                return chosen
        return self.pick_by_priority(device_type, dtype)

    def auto_rule(self, device_type: str, dtype: torch.dtype,
                  call: dispatch.Call | None = None) -> str:
        """In words, the rule `pick_auto` follows for these arguments (python -m
        glai_kernels prints it)."""
        if call is None:
            return "priorities (no call shape given)"
        name, rule = dispatch.measured_pick(self.op, device_type, dtype, call)
        if name is None:
            return f"priorities ({rule})"
        chosen = self._backends.get(name)
        if chosen is None or device_type not in chosen.auto_priority:
            return f"priorities (the table's {name!r} is not an auto candidate here; {rule})"
        reason = chosen.unsupported_reason(device_type, dtype)
        if reason is not None:
            return f"priorities (the table's {name!r} is unavailable: {reason}; {rule})"
        return f"measured ({rule})"

    def pick_by_priority(self, device_type: str, dtype: torch.dtype) -> Backend:
        """The available backend with the highest auto priority for this device and dtype
        (the first registered among equals).

        A plain loop, not max(key=...), which torch.compile cannot trace: the sparse op's
        module forward resolves "auto" inside a compiled region."""
        best: Backend | None = None
        for candidate in self._backends.values():
            rank = candidate.auto_priority.get(device_type)
            if rank is None or candidate.unsupported_reason(device_type, dtype) is not None:
                continue
            if best is None or rank > best.auto_priority[device_type]:
                best = candidate
        if best is None:
            raise RuntimeError(f"no {self.op} backend is available for {device_type} {dtype}; "
                               f"see glai_kernels.backends()")
        return best

    def resolve(self, backend: str | None, device: torch.device, dtype: torch.dtype,
                call: dispatch.Call | None = None) -> Backend:
        """The backend that will run for tensors on `device` of `dtype` (for "auto", in the
        mode and at the shape `call` says, when given).

        Raises ValueError for an unknown name and RuntimeError, with the reason, for a
        backend that cannot run these tensors here.
        """
        key = self._resolve_key(backend, device, dtype, call)
        chosen = self._resolved.get(key) if key is not None else None
        if chosen is not None:
            return chosen
        name = self.requested_name(backend)
        if name == AUTO:
            chosen = self.pick_auto(device.type, dtype, call)
        else:
            chosen = self.get(name)
            reason = chosen.unsupported_reason(device.type, dtype)
            if reason is not None:
                raise RuntimeError(
                    f"{self.op} backend {name!r} cannot run {dtype} on {device}: {reason}")
        if key is not None:
            if len(self._resolved) >= _RESOLVED_MAX:
                self._resolved.clear()
            self._resolved[key] = chosen
        return chosen

    def resolved(self, backend: str | None, device: torch.device, dtype: torch.dtype,
                 call: dispatch.Call | None = None) -> Backend | None:
        """What `resolve` answered for these arguments before, while nothing it read has
        changed since; None where it has not answered them (or under torch.compile)."""
        key = self._resolve_key(backend, device, dtype, call)
        return self._resolved.get(key) if key is not None else None

    @staticmethod
    def _resolve_key(backend: str | None, device: torch.device, dtype: torch.dtype,
                     call: dispatch.Call | None) -> tuple | None:
        """What `resolve`'s answer depends on besides the registry, the backends'
        availability and the dispatch tables (each of which clears the answers when it
        changes): the name asked for, $GLAI_BACKEND's value when none is, the device, the
        dtype, and for "auto" with a call shape that shape and the thread count whose table
        it reads (and the current CUDA device). With the default backend, resolving inside an op
        cost ≈ 3 µs alone and ≈ 12 µs of an A2 training step, an answer kept ≈ 1; with a
        backend named, ≈ 2.5 µs of the step (docs/notes/pipeline.md, "The ordinary GLAI step,
        fourth pass: what the head's forward asks every step (issue 41, stop 50)"). None under
        torch.compile, which traces the resolution itself."""
        if torch.compiler.is_compiling():
            return None
        where = 0
        if call is not None:
            where = (torch.get_num_threads() if device.type == "cpu"
                     else torch.cuda.current_device() if device.type == "cuda" else 0)
        return (backend, environment_backend() if backend is None else None, device, dtype,
                call, where)

    def statuses(self) -> list[BackendStatus]:
        """Availability of every registered backend on every device type it declares."""
        return [
            BackendStatus(
                name=b.name,
                description=b.description,
                dtypes=tuple(str(d).removeprefix("torch.") for d in b.dtypes),
                devices={d: self.availability(b.name, d) for d in b.devices},
                auto_priority=dict(b.auto_priority),
            )
            for b in self._backends.values()
        ]


@dataclass(frozen=True)
class BackendStatus:
    """What `glai_kernels.backends()` reports for one backend."""

    name: str
    description: str
    dtypes: tuple[str, ...]
    # device type -> None when available there, else the reason it is not
    devices: dict[str, str | None]
    auto_priority: dict[str, int]

    @property
    def available(self) -> bool:
        return any(reason is None for reason in self.devices.values())

    def __str__(self) -> str:
        where = "; ".join(f"{d}: {'available' if r is None else 'unavailable (' + r + ')'}"
                          for d, r in self.devices.items())
        return f"{self.name:8s} {where} -- {self.description}"


ESTIMATOR = Registry("estimator")
"""The dense estimator's backends (glai_kernels/backends/)."""

# The dense registry's methods under the names every caller has used.
register = ESTIMATOR.register
replace = ESTIMATOR.replace
unregister = ESTIMATOR.unregister
names = ESTIMATOR.names
get = ESTIMATOR.get
baseline = ESTIMATOR.baseline
requested_name = ESTIMATOR.requested_name
pick_auto = ESTIMATOR.pick_auto
pick_by_priority = ESTIMATOR.pick_by_priority
auto_rule = ESTIMATOR.auto_rule
resolve = ESTIMATOR.resolve
statuses = ESTIMATOR.statuses
