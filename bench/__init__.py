"""The benchmark suite: which backend is fastest for each head, how far from the machine's
ceilings, at what memory and energy cost, and whether its answer is right.

    python -m bench [--preset quick|default|full] [--backends a,b] [--device cpu|cuda] ...
    pytest bench/                 # the suite's own tests and pytest-benchmark cases

Modules: `sweeps` (what to measure, as data), `passes` (the timed calls and their costs),
`ceilings` (the machine's measured peaks: `physical` chooses the compute ceiling,
`native_peak` runs the peak kernels, `shares` guards against shares above 100%,
`ceilings_report` writes them into the summary), `timing`, `memory`, `energy`, `oracle`
(correctness of every timed output), `provenance`, `runner` (measures), `results` (the
tidy table), `suite` (end to end), `plots`, `summary`.
"""
