"""The measuring harness: everything a run needs to produce its result table.

What belongs here: code that decides what to measure (`sweeps`), makes and times the calls
(`passes`, `peers`, `kept`, `calls`, `timing`, `runner`), measures beside the time
(`memory`, `energy`, `oracle` for correctness), finds the machine's ceilings (`physical`,
`native_peak`, `ceilings`, with `shares` refusing a share above 100%), records where it ran
(`provenance`), turns raw measurements into the table (`results`) and the dispatch table the
package reads (`dispatch_table`: a measured output, not a report), guards the process
(`onednn_guard`), and runs it all end to end (`suite`).

What does not: turning a finished table into Markdown, charts or history (bench/reporting/);
one-off experiments (bench/studies/).
"""
