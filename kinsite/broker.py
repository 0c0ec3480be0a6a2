"""A mend to kombu's Redis transport (kombu 5.7.0): without it a worker that holds an
unacknowledged task when Redis goes away exits instead of reconnecting."""
from __future__ import annotations

import functools
import logging
from queue import Empty

from kombu.transport import redis as kombu_redis

logger = logging.getLogger(__name__)


def mend_redis_channel_close() -> None:
    """Let a Redis channel close when its BRPOP connection is already dead.

    kombu's `Channel.close` first reads the reply of a BRPOP in flight (celery/kombu#1733);
    with Redis gone that read raises and close stops, and the consumer's second close later
    fails with an AttributeError that is not a connection error, so the worker exits
    ("Unrecoverable error") instead of reconnecting. Here that read's connection error ends
    the BRPOP and closing goes on; the unacknowledged tasks stay in Redis for the visibility
    timeout, or, if Redis lost them, the job sweeps take over (kinsite.jobs)."""
    channel = kombu_redis.Channel
    if getattr(channel.close, "mends_dead_brpop", False):
        return
    close = channel.close

    @functools.wraps(close)
    def close_after_a_dead_brpop(self):
        if getattr(self, "_in_poll", None):  # a kombu without it has changed close(): nothing to do
            try:
                self._brpop_read()  # clears _in_poll whatever happens
            except Empty:
                pass
            except self.connection_errors as exc:
                logger.info("Closing a Redis channel whose BRPOP connection was lost: %r", exc)
        close(self)

    close_after_a_dead_brpop.mends_dead_brpop = True
    channel.close = close_after_a_dead_brpop
