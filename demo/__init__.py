"""The end-to-end demo (``bolide demo``): an order book on an embedded broker and SQLite."""

from bolide.demo.run import DemoOptions, DemoSummary, Progress, run_demo

__all__ = ["DemoOptions", "DemoSummary", "Progress", "run_demo"]
