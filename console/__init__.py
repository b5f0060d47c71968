"""``bolide.console``: a web console over a Kafka cluster and bolide's history store.

``bolide console`` serves it (``command.py``). ``bolide.console.app.create_app`` gives the
ASGI application to serve some other way, and ``bolide.console.app.serve`` runs it with
uvicorn; both need the ``bolide[console]`` extra, which this package's face does not import
(``bolide --help`` works without it). docs/console.md describes the pages, the API and the
safety rules.
"""

from bolide.console.settings import TOKEN_ENV, ConsoleSettings

__all__ = ["TOKEN_ENV", "ConsoleSettings"]
