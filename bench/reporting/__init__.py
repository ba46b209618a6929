"""Reports from finished measurements: nothing here times anything.

What belongs here: summary.md (`summary`, with `ceilings_report` and `kept_report` for
their sections), charts (`plots`), the run history and the dashboard built from it
(`history`, `dashboard`), redrawing a finished run (`render`), merging runs of one machine
kind (`merge`), and the roofline predictions from datasheet peaks that the summary prints
beside the measurements (`predict`: computed, not measured, and read by `summary`, so it
lives with the reports rather than with the one-off studies).
"""
