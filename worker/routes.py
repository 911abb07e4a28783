"""Which queue a received message belongs to: the tiers' distinct queues (`tier_urls`),
and each receipt handle's.

With priority tiers a worker receives from several queues, but the calls that settle a
message (delete, visibility, requeue, heartbeat extension) name it by receipt handle
only. The receiver notes each handle's queue as it receives it; every later call looks
it up here, so none of the settling code has to carry the queue along. A handle this
worker did not note (a test driving the parts directly) belongs to the default queue.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Final

from agentq.config import Settings

# Far more handles than a worker holds at once (slots + prefetch): an old handle that
# falls out belongs to a message settled long ago.
MAX_ROUTES: Final = 10_000


class QueueRoutes:
    def __init__(self, default_url: str, *, limit: int = MAX_ROUTES) -> None:
        self.default_url = default_url
        self._limit = limit
        self._routes: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def note(self, receipt_handle: str, queue_url: str) -> None:
        if queue_url == self.default_url:
            return  # the default needs no entry (single-queue workers keep none)
        with self._lock:
            self._routes[receipt_handle] = queue_url
            self._routes.move_to_end(receipt_handle)
            while len(self._routes) > self._limit:
                self._routes.popitem(last=False)

    def queue_of(self, receipt_handle: str) -> str:
        with self._lock:
            return self._routes.get(receipt_handle, self.default_url)

    def forget(self, receipt_handle: str) -> None:
        with self._lock:
            self._routes.pop(receipt_handle, None)


def tier_urls(settings: Settings) -> dict[str, str]:
    """Distinct queues by tier, highest first; tiers sharing a URL keep the highest."""
    urls: dict[str, str] = {}
    for tier, url in settings.tier_queue_urls().items():
        if url not in urls.values():
            urls[tier] = url
    return urls
