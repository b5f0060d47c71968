"""Benchmarks of bolide against the raw clients it wraps (not part of the installed package).

Each ``bench_<name>.py`` module offers ``bench(context) -> Report`` for ``run_all`` and
``main(argv) -> int`` to run it alone, both from one ``Command`` (``_common.py``): ``main``
prints a Markdown table, or one JSON document with ``--json``; ``--quick`` runs tiny counts;
``--bootstrap HOST:PORT`` points it at an existing Kafka (modules that need no broker accept
and ignore it). ``run_all`` runs them all; ``bolide bench`` is the same from the command line.
Run from the repository root: ``python -m benchmarks.run_all`` or
``python -m benchmarks.bench_facade --help``.
"""
