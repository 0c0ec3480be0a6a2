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

    Since kombu 5.3.2 (celery/kombu#1733) `Channel.close` first reads the reply of a BRPOP in
    flight, so that a task popped at that moment is not lost. When Redis has gone away that
    read raises a connection error and `close` stops there, the channel left open with its
    unacknowledged tasks. Celery's consumer, reconnecting, closes the connection twice: in
    `connection.collect()`, which swallows that error and then detaches the transport from
    the connection (`client = None`), and in `connection.close()`, where the channel gets as
    far as restoring its unacknowledged tasks, needs a new Redis pool, and kombu builds its
    parameters from the detached `client`: AttributeError("'NoneType' object has no
    attribute 'hostname'"). That is not a connection error, so the worker stops with
    "Unrecoverable error" instead of reconnecting. It happens whenever Redis drops while a
    worker holds a task (acks_late) and waits for another (a free process: BRPOP in flight).

    Here a connection error from that read is taken for what it is, a BRPOP whose reply will
    never come, and the channel goes on closing while its connection still knows Redis's
    address. Restoring its unacknowledged tasks then fails as a connection error, which the
    consumer ignores: they stay recorded in Redis, if Redis kept its data, until the running
    task acknowledges them or the visibility timeout delivers them again (tasks are
    idempotent); if Redis lost its data, the running tasks still finish and store their
    outcome, and beat's sweeps take over what Redis lost (kinsite.jobs)."""
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
