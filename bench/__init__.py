"""Benchmarks: ``python -m bench`` (= ``make bench``) measures our numbers against baselines
taken in the same run and writes ``bench/results/report.md`` and ``report.json``.

Modules: :mod:`bench.common` (timing helpers, result records, the report), one ``bench_*``
module per area (command line, data, training, checkpoints, preemption, GPU). See
``bench/README.md`` for how to read the report.
"""

from __future__ import annotations
