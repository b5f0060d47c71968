"""The ``bolide`` command: one module per command group, shared helpers in ``common``."""

from bolide.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
