"""What the suite measures, as data: sweeps of estimator shapes and the presets that group them.

A `Sweep` varies one axis (batch, inputs, paths or outputs) with the others at a paper
head's values (`glai_kernels.paper_heads.PAPER_HEADS`, docs/ARCHITECTURE.md §3). The paper-heads
grid is the batch
sweep over all six heads. A `Preset` names sweeps, dtypes, passes and how long to time each
measurement. `expand(preset)` turns a preset into the list of `Case`s to run, in order, each
shape once per sweep it belongs to.

Passes (see `bench.harness.passes`): forward; backward (all three gradients, from the
forward's saved state); both (forward + all three gradients, one autograd call); train
(forward + dweight only: GLAI's real training step, where the selector and backbone are
frozen).

A `KeptSweep` varies the kept fraction μ of a pruned estimator at each head's own shape
instead (issue 13; `bench.harness.kept` measures it): the sparse op's backends, the dense op on the
masked weight and the MLP the head replaces, for the passes `forward` and `step` (a whole
training step); its cases carry `mu`.

The presets (each also names the pipeline preset `glai-bench run` runs after it):
  quick      CI's smoke run and the regression gate's cases;
  first-run  `nox -s bench`'s default, sized for about 15 minutes on 2 CPU cores from a fresh
             clone: the six heads at the paper's batch with every backend and peer, the kept
             fraction at each head's matched μ and a few μ around the crossovers, then the
             pipeline's first-run preset (docs/notes/benchmarks.md, "A first run in 15
             minutes (issue 41 item 3, stop 45)");
  long       the complete CPU sweeps (hours on 2 cores; formerly `default`, a name kept as
             an alias);
  full       for GPUs: more batches, axes and dtypes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from glai_kernels.contract import Shape
from glai_kernels.glai.paper_training import paper_training
from glai_kernels.paper_heads import PAPER_HEADS, PaperHead

AXES: tuple[str, ...] = ("batch", "inputs", "paths", "outputs")
ALL_PASSES: tuple[str, ...] = ("forward", "backward", "both", "train")
PAPER_BATCHES: tuple[int, ...] = (16, 32, 256, 4096)
# the kept-fraction sweep's passes (bench/harness/kept.py): the estimator's forward, and a whole
# training step (selector, estimator forward and backward, optimizer step)
KEPT_PASSES: tuple[str, ...] = ("forward", "step")
# bench/harness/peers.py's peers by short name; max-autotune runs in the heads sweep only (each
# shape, dtype and grad mode autotunes for seconds)
ALL_PEERS: tuple[str, ...] = ("einsum", "max-autotune")
KEPT_MUS: tuple[float, ...] = (0.005, 0.01, 0.03, 0.10, 0.25, 0.50, 1.0)


@dataclass(frozen=True)
class Sweep:
    """One axis varied over `values`, the others at each head's values.

    For axes other than batch, the batch is `batch`. `dtypes`/`passes` of None mean the
    preset's.
    """

    name: str
    heads: tuple[str, ...]
    axis: str
    values: tuple[int, ...]
    batch: int = 256
    dtypes: tuple[str, ...] | None = None
    passes: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        bad = [p for p in self.passes or () if p not in ALL_PASSES]
        if bad:
            raise ValueError(f"sweep {self.name!r}: unknown passes {bad}; known: {ALL_PASSES}")
        if self.axis not in AXES:
            raise ValueError(f"sweep {self.name!r}: axis must be one of {AXES}, got {self.axis!r}")
        unknown = [h for h in self.heads if h not in PAPER_HEADS]
        if unknown:
            raise ValueError(f"sweep {self.name!r}: unknown heads {unknown}; "
                             f"known: {', '.join(PAPER_HEADS)}")
        if not self.values or min(self.values) < 1:
            raise ValueError(f"sweep {self.name!r}: values must be positive, got {self.values}")

    def shapes(self) -> list[tuple[str, Shape]]:
        """(head name, Shape) for every head and value, heads outermost."""
        out = []
        for head in self.heads:
            base = PAPER_HEADS[head].shape(self.batch).as_dict()
            for value in self.values:
                out.append((head, Shape(**{**base, self.axis: value})))
        return out


def matched_keep(head: PaperHead) -> int:
    """K, the path weights GLAI keeps at `head`'s parameter match (docs/ARCHITECTURE.md §3):
    original MLP − reduced MLP − estimator bias, counted from real modules (on the meta
    device: no memory, no initialisation)."""
    from glai_kernels.glai import count_parameters, make_mlp, reduced_widths

    widths = (head.n0, head.n1, head.n2)
    original = count_parameters(make_mlp(widths, device="meta"))
    reduced = count_parameters(make_mlp(reduced_widths(widths, head.rho), device="meta"))
    return original - reduced - head.outputs


def matched_mu(head: PaperHead) -> float:
    """K / (O·I·P) at `head`'s parameter match: A1 2.96%, B1 0.86% (docs/ARCHITECTURE.md §3)."""
    shape = head.shape(1)
    return matched_keep(head) / (shape.outputs * shape.inputs * shape.paths)


@dataclass(frozen=True)
class KeptSweep:
    """The kept fraction μ varied at each head's own estimator shape (bench/harness/kept.py
    runs it).

    Per head: every μ of `mus` plus the head's matched μ (`matched_mu`), at every batch of
    `batches` plus the head's paper batch (docs/ARCHITECTURE.md §3), in `dtype`, for the
    passes `passes` (of KEPT_PASSES).
    """

    name: str
    heads: tuple[str, ...]
    batches: tuple[int, ...] = (16, 256)
    mus: tuple[float, ...] = KEPT_MUS
    dtype: str = "float32"
    passes: tuple[str, ...] = KEPT_PASSES

    def __post_init__(self) -> None:
        bad = [p for p in self.passes if p not in KEPT_PASSES]
        if bad:
            raise ValueError(f"sweep {self.name!r}: unknown passes {bad}; known: {KEPT_PASSES}")
        unknown = [h for h in self.heads if h not in PAPER_HEADS]
        if unknown:
            raise ValueError(f"sweep {self.name!r}: unknown heads {unknown}; "
                             f"known: {', '.join(PAPER_HEADS)}")
        if not self.mus or min(self.mus) <= 0 or max(self.mus) > 1:
            raise ValueError(f"sweep {self.name!r}: mus must be in (0, 1], got {self.mus}")

    def points(self) -> list[tuple[str, Shape, float]]:
        """(head, Shape, μ) for every head, batch and μ: heads outermost, then batches,
        then μ ascending (the runner keeps one head and batch's inputs across its μ)."""
        from glai_kernels.glai import paper_training

        out = []
        for head in self.heads:
            spec = PAPER_HEADS[head]
            batches = sorted({*self.batches, paper_training(spec).batch_size})
            mus = sorted({*self.mus, matched_mu(spec)})
            out += [(head, spec.shape(b), mu) for b in batches for mu in mus]
        return out


@dataclass(frozen=True)
class Preset:
    """A named set of sweeps and how to time them.

    `min_time_s`: timed seconds per measurement (at least `rounds` samples);
    `max_call_s`: a case whose roofline floor (the fastest any backend could be, from this
    run's ceilings) exceeds this, or a backend whose fastest warm-up call exceeds three
    times this, is skipped with a note. `ceiling_time_s`: seconds per ceiling measurement.
    """

    name: str
    description: str
    sweeps: tuple[Sweep | KeptSweep, ...]
    dtypes: tuple[str, ...]
    passes: tuple[str, ...] = ALL_PASSES
    min_time_s: float = 0.3
    rounds: int = 5
    max_call_s: float = 2.0
    ceiling_time_s: float = 0.3
    peers: tuple[str, ...] = ()
    # the pipeline preset (bench/pipeline/presets.py) `glai-bench run` runs after the kernel
    # suite; None: the one of the same name
    pipeline: str | None = None
    # the progress bar's prior (bench/harness/progress.py): seconds per unit of
    # `bench.harness.suite.case_cost` on this project's 2-core CPU, until the first shape ends
    seconds_per_cost: float | None = None

    @property
    def pipeline_preset(self) -> str:
        return self.pipeline or self.name


@dataclass(frozen=True)
class Case:
    """One shape to measure at one dtype and a set of passes, with where it came from;
    `mu` is the kept fraction of a kept-fraction sweep's case (None for the dense op's)."""

    sweep: str
    head: str
    shape: Shape
    dtype: str
    passes: tuple[str, ...] = field(default=ALL_PASSES)
    mu: float | None = None


def _axis_sweeps(head: str, batch: int, values: dict[str, tuple[int, ...]],
                 **kwargs) -> tuple[Sweep, ...]:
    # the batch sweep ignores `batch`; the others carry it in their name
    return tuple(Sweep(f"{axis}@{head}" + ("" if axis == "batch" else f"-B{batch}"),
                       (head,), axis, vals, batch=batch, **kwargs)
                 for axis, vals in values.items())


def paper_batch_sweeps(heads: tuple[str, ...] = tuple(PAPER_HEADS),
                       **kwargs) -> tuple[Sweep, ...]:
    """The `heads` sweep at each head's paper batch (`paper_training(head).batch_size`: 16,
    C2 32): one Sweep per batch, heads in PAPER_HEADS order."""
    by_batch: dict[int, list[str]] = {}
    for head in heads:
        by_batch.setdefault(paper_training(PAPER_HEADS[head]).batch_size, []).append(head)
    return tuple(Sweep("heads", tuple(names), "batch", (batch,), **kwargs)
                 for batch, names in by_batch.items())


# the first-run preset's kept fractions besides each head's matched μ: 1% for the sparse
# forward's target (B1, B2 at B = 16), and 10%, 50%, 100% to bracket the crossovers (the
# committed sweep put the forward's between 20% and 40%, the step's between 43% and 96% or
# beyond 100%: docs/notes/sparse.md, "Current state")
FIRST_RUN_MUS: tuple[float, ...] = (0.01, 0.10, 0.50, 1.0)

_A1_AXES = {
    "batch": (1, 4, 16, 64, 256, 1024, 4096),
    "inputs": (33, 97, 193, 385, 769, 1537),
    "paths": (16, 32, 64, 128, 256, 512),
    "outputs": (1, 4, 16, 37, 64, 128, 256),
}

PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset(
        name="quick",
        description="CI smoke run: the six heads at the paper's batch 16, a short batch "
                    "sweep of A1; float32; forward and forward+backward",
        sweeps=(
            Sweep("heads", tuple(PAPER_HEADS), "batch", (16,)),
            Sweep("batch@A1", ("A1",), "batch", (16, 256)),
        ),
        dtypes=("float32",),
        passes=("forward", "both"),
        min_time_s=0.1,
        rounds=3,
        max_call_s=0.5,
        # a smoke run (and the regression gate's runs) stays short: the torch backend is
        # its only peer
    ),
    Preset(
        name="first-run",
        description="what `nox -s bench` runs, sized for about 15 minutes on 2 CPU cores: "
                    "the six heads at the paper's batch (16; C2 32), float32, the passes auto "
                    "dispatches (forward, forward+backward, train), every backend and the "
                    "peers; the kept fraction at each "
                    "head's matched μ and at 1%, 10%, 50%, 100% (paper batch; sparse "
                    "against dense against the MLP, forward and training step); then the "
                    "pipeline's first-run preset",
        sweeps=(
            *paper_batch_sweeps(),
            KeptSweep("kept_fraction", tuple(PAPER_HEADS), batches=(), mus=FIRST_RUN_MUS),
        ),
        # bfloat16 doubles the heads' time (`--dtypes float32,bfloat16` adds it), and the
        # backward pass alone serves no mode of auto: both left to the long preset
        dtypes=("float32",),
        passes=("forward", "both", "train"),
        min_time_s=0.1,
        rounds=5,
        max_call_s=0.5,
        peers=ALL_PEERS,
        # a fresh clone's `nox -s bench` on a quiet 2-core AMD Zen 5: 339 s of cases for
        # 3.82e10 of case_cost (docs/notes/benchmarks.md, "The bars' estimates on a quiet first
        # run (stop 51)"; 5.3e-8 a unit of the former case_cost, from a run at load 5-8 of
        # older code, had the bar open at 19 min 37 s); a loaded machine is slower, and the
        # measured rate outweighs it as shapes end
        seconds_per_cost=8.86e-9,
    ),
    Preset(
        name="long",
        description="the six heads at B in {16, 32, 256, 4096} (float32) and {16, 32} "
                    "(bfloat16), all passes; one-axis sweeps of B, I, P, O around A1 at "
                    "B = 256 (float32; forward and forward+backward); the kept fraction "
                    "μ swept at the six heads, B in {16, 256} and the paper batch "
                    "(sparse against dense against the MLP, forward and training step)",
        sweeps=(
            Sweep("heads", tuple(PAPER_HEADS), "batch", PAPER_BATCHES, dtypes=("float32",)),
            Sweep("heads", tuple(PAPER_HEADS), "batch", PAPER_BATCHES[:2],
                  dtypes=("bfloat16",)),
            *_axis_sweeps("A1", 256, _A1_AXES, dtypes=("float32",),
                          passes=("forward", "both")),
            KeptSweep("kept_fraction", tuple(PAPER_HEADS)),
        ),
        dtypes=("float32", "bfloat16"),
        min_time_s=0.2,
        rounds=5,
        max_call_s=0.5,
        peers=ALL_PEERS,
        pipeline="default",
    ),
    Preset(
        name="full",
        description="for GPUs: the six heads at B in {16, 32, 256, 4096}, one-axis sweeps "
                    "around A1 and B1 at B = 16 and 4096; float32, float16, bfloat16",
        sweeps=(
            Sweep("heads", tuple(PAPER_HEADS), "batch", PAPER_BATCHES),
            *_axis_sweeps("A1", 16, _A1_AXES),
            *_axis_sweeps("A1", 4096, {k: v for k, v in _A1_AXES.items() if k != "batch"}),
            *_axis_sweeps("B1", 16, {
                "batch": (1, 16, 64, 256, 1024, 4096, 16384),
                "inputs": (129, 385, 769, 1281, 2049, 4097),
                "paths": (32, 64, 128, 320, 640, 1280),
                "outputs": (1, 8, 32, 128, 512, 1024),
            }),
        ),
        dtypes=("float32", "float16", "bfloat16"),
        min_time_s=0.5,
        rounds=10,
        max_call_s=10.0,
        peers=ALL_PEERS,
    ),
)}


# `nox -s bench`'s preset, and the former name of `long` (scripts such as bench/tools/on_gpu.sh
# still say `--preset default`)
DEFAULT_PRESET = "first-run"
ALIASES: dict[str, str] = {"default": "long"}
PRESETS.update({alias: PRESETS[name] for alias, name in ALIASES.items()})


def expand(preset: Preset, dtypes: tuple[str, ...] | None = None,
           passes: tuple[str, ...] | None = None) -> list[Case]:
    """Every case of the preset, sweep by sweep; `dtypes`/`passes` override the preset's
    (a sweep that names its own dtypes keeps only those also asked for)."""
    cases = []
    for sweep in preset.sweeps:
        if isinstance(sweep, KeptSweep):
            cases += _kept_cases(sweep, dtypes, passes)
            continue
        sweep_dtypes = sweep.dtypes or preset.dtypes
        if dtypes is not None:
            sweep_dtypes = (tuple(d for d in sweep_dtypes if d in dtypes) if sweep.dtypes
                            else dtypes)
        sweep_passes = passes or sweep.passes or preset.passes
        for head, shape in sweep.shapes():
            for dtype in sweep_dtypes:
                cases.append(Case(sweep.name, head, shape, dtype, tuple(sweep_passes)))
    return cases


def _kept_cases(sweep: KeptSweep, dtypes: tuple[str, ...] | None,
                passes: tuple[str, ...] | None) -> list[Case]:
    """A kept-fraction sweep's cases: its own dtype and passes, kept only where the
    overrides ask for them."""
    if dtypes is not None and sweep.dtype not in dtypes:
        return []
    kept_passes = tuple(p for p in sweep.passes if passes is None or p in passes)
    if not kept_passes:
        return []
    return [Case(sweep.name, head, shape, sweep.dtype, kept_passes, mu)
            for head, shape, mu in sweep.points()]
