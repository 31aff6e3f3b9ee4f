"""``fogshift bench``: the thesis's experiments (E1-E3) and a high-load run, on real clusters.

Every experiment brings clusters up through the real CLI (``python -m fogshift.cli.main up``),
runs Case 1 pipelines on them, checks every run's output against the independent reference
(:mod:`fogshift.verify.reference`) and appends one CSV row per run. Plots and ``results.md``
are rendered from those CSVs only (:mod:`fogshift.bench.report`), next to the thesis's
figures (:mod:`fogshift.bench.thesis`).
"""
