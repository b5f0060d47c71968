"""bolide on asyncio: ``AsyncPublisher`` and ``AsyncSubscriber``.

They wrap the sync ``Publisher`` and ``Subscriber`` (one implementation of the semantics) and
never block the event loop: blocking calls run, in order per client, on one small pool of
helper threads shared by every client of the process. See docs/asyncio.md.
"""

from bolide.facade.aio.publisher import AsyncPublisher
from bolide.facade.aio.subscriber import AsyncSubscriber

__all__ = ["AsyncPublisher", "AsyncSubscriber"]
