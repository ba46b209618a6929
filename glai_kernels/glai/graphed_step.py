"""A training step replayed from a CUDA graph: one capture per batch shape, inputs copied into
static buffers, the launches of a whole step (forward, backward, optimizer) issued at once.

At the paper's batch every head's step is a few microseconds of arithmetic under tens of
microseconds of kernel launches and Python (docs/notes/cuda.md, "An H100 lease ..."): a graph
replays the step's kernels without either. It is offered to every model the pipeline trains
(the MLP, the reduced MLP, the GLAI estimator, the linear head) so that GLAI's comparison with
the MLP stays like for like: both with graphs, or both without (issue 37, item 3).

    step = graphed(training_step(model, task, optimizer), device)   # step(batch) as before
    prepare_optimizer(optimizer, device)      # capturable=True where torch.optim needs it

How `GraphedStep(step, device, strategy)` runs `step(batch)` (batch: a tensor or a
tuple/list of tensors, as glai/tasks.py's tasks yield them):

1. the batch's signature (each tensor's shape and dtype) picks an entry; a new signature gets
   static buffers on `device`, one per tensor, and its own capture later (the last, partial
   batch of an epoch is a second shape);
2. each call copies the batch into its entry's static buffers (copy-in; a CPU episode index
   moves to the device here, outside the graph) and runs the step on the buffers;
3. the first `warmup` calls of an entry run the step eagerly (on a side stream on CUDA, as
   torch requires before a capture: the optimizer's state and autograd's buffers exist, the
   lazy initialisations are done); the next call captures the step into a graph and every
   call from then on replays it. Capture records without running, so the capturing call
   then replays once: **every call is exactly one step on its own batch**, so training with
   the wrapper computes what training without it does (to rounding).

The strategy object does the device's part: `CudaGraphs` (torch.cuda.CUDAGraph, one memory
pool for the wrapper's graphs) or `EagerStandIn` (the CPU's stand-in: "capture" keeps the
step, "replay" runs it on the static buffers), so the buffer logic is tested without a GPU.
A capture that fails (an operation a graph cannot hold: a host sync, a CPU tensor) is not
an error: the entry runs eagerly from then on and `fallback` says why, so a pipeline run on a
GPU prices what it could.

A step that reads a host scalar that changes between steps would replay the captured value:
the ordinary step with `capturable=True` optimizers keeps its step counts on the device, as
does `FusedSparseStep` with the CUDA kernels (the count read by the kernel, fused.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

Batch = object  # a tensor, or a tuple/list of tensors


def _leaves(batch: Batch) -> list[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        return [batch]
    if isinstance(batch, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in batch):
        return list(batch)
    raise TypeError(f"GraphedStep: a batch must be a tensor or a tuple/list of tensors, got "
                    f"{type(batch).__name__}")


def signature(batch: Batch) -> tuple:
    """What a capture depends on: each tensor's shape and dtype (and the nesting)."""
    leaves = _leaves(batch)
    return (type(batch).__name__, tuple((tuple(t.shape), t.dtype) for t in leaves))


def _rebuild(batch: Batch, leaves: list[torch.Tensor]) -> Batch:
    return leaves[0] if isinstance(batch, torch.Tensor) else type(batch)(leaves)


class EagerStandIn:
    """The CPU's stand-in for a capture: the step is kept and "replayed" by running it, on
    the same static buffers a graph would read."""

    name = "stand-in"

    def eager(self, fn: Callable[[], None]) -> None:
        fn()

    def capture(self, fn: Callable[[], None]) -> Callable[[], None]:
        return fn


class CudaGraphs:
    """Captures with torch.cuda.CUDAGraph: warm-up on a side stream, one memory pool for every
    graph of the wrapper (they never run at once)."""

    name = "cuda-graph"

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pool = None
        self.graphs: list = []  # keep each graph (and its memory) alive

    def eager(self, fn: Callable[[], None]) -> None:
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream(self.device).wait_stream(side)

    def capture(self, fn: Callable[[], None]) -> Callable[[], None]:
        graph = torch.cuda.CUDAGraph()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        torch.cuda.synchronize(self.device)
        with torch.cuda.graph(graph, pool=self.pool):
            fn()
        self.graphs.append(graph)
        return graph.replay


def strategy_for(device: torch.device) -> EagerStandIn | CudaGraphs:
    """CUDA graphs on a CUDA device, the eager stand-in elsewhere."""
    return CudaGraphs(device) if device.type == "cuda" else EagerStandIn()


@dataclass
class _Entry:
    static: Batch
    calls: int = 0
    replay: Callable[[], None] | None = None
    fallback: str | None = None


@dataclass
class GraphedStep:
    """step(batch) through static buffers and one capture per batch signature (module
    docstring). `warmup`: eager calls of each signature before its capture (torch's examples
    take 3; at least 1, so the optimizer's state exists before the capture)."""

    step: Callable[[Batch], object]
    device: torch.device
    strategy: object = None
    warmup: int = 3
    entries: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.warmup < 1:
            raise ValueError(f"GraphedStep: warmup must be >= 1, got {self.warmup}")
        self.device = torch.device(self.device)
        if self.strategy is None:
            self.strategy = strategy_for(self.device)

    def __call__(self, batch: Batch) -> None:
        key = signature(batch)
        entry = self.entries.get(key)
        if entry is None:
            leaves = [torch.empty_like(t, device=self.device) for t in _leaves(batch)]
            entry = self.entries[key] = _Entry(_rebuild(batch, leaves))
        for static, new in zip(_leaves(entry.static), _leaves(batch), strict=True):
            static.copy_(new, non_blocking=True)
        run = lambda: self.step(entry.static)  # noqa: E731  (the step on the buffers)
        if entry.fallback is not None:
            run()
        elif entry.replay is not None:
            entry.replay()
        elif entry.calls < self.warmup:
            self.strategy.eager(run)
            entry.calls += 1
        else:
            try:
                entry.replay = self.strategy.capture(run)
            except Exception as e:  # a step a graph cannot hold: priced eagerly, and said so
                entry.fallback = f"{type(e).__name__}: {e}".splitlines()[0]
                run()
                return
            entry.replay()

    @property
    def captured(self) -> int:
        """How many batch signatures replay from a capture."""
        return sum(e.replay is not None for e in self.entries.values())

    @property
    def fallback(self) -> str | None:
        """Why a capture failed (the first such reason), None when none did."""
        return next((e.fallback for e in self.entries.values() if e.fallback), None)


def prepare_optimizer(optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Set capturable=True in each param group that has the option (Adam, AdamW, ...) on a
    CUDA device, before the first step: torch.optim refuses a capture without it, and with it
    keeps the step counts on the device. SGD needs nothing. A no-op elsewhere."""
    if torch.device(device).type != "cuda":
        return
    for group in optimizer.param_groups:
        if "capturable" in group:
            group["capturable"] = True


def graphed(step: Callable[[Batch], object], device: torch.device,
            strategy: object = None, warmup: int = 3) -> GraphedStep:
    """`step` (step(batch), e.g. training.training_step's) replayed from CUDA graphs on a
    CUDA `device`, through the eager stand-in elsewhere."""
    return GraphedStep(step, torch.device(device), strategy, warmup)
