"""One mechanism for all background work that can get stuck (turns, introspection, compaction,
consolidation, re-embedding, workflow runs): send, claim and sweep. Each domain registers a
JobKind holding only its own decisions; see docs/architecture.md#background-jobs."""
from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.apps import apps
from django.conf import settings
from django.core.cache import cache
from django.db import transaction
from django.db.models import F, Model
from django.utils import timezone
from django.utils.module_loading import import_string
from kombu.exceptions import OperationalError as BrokerUnreachable
from redis.exceptions import RedisError

from kinsite.errors import Conflict, ServiceUnavailable

logger = logging.getLogger(__name__)

PENDING, RUNNING, FAILED = "pending", "running", "failed"
# Set when a job's task is sent; a pending job without it has no task in the queue. The
# format keeps turns' older "kinsite:turn-queued:<id>", so markers set before a deploy count.
QUEUED_KEY = "kinsite:{kind}-queued:{job_id}"
# Redis not answering (as broker, cache, or a domain's lock, which raises ServiceUnavailable):
# the sweeps stop and beat runs them again a minute later.
REDIS_OUTAGES = (BrokerUnreachable, RedisError, ServiceUnavailable)


def past_task_time_limit() -> timedelta:
    """JobKind.stalled_after's default: Celery's hard time limit (which also ends the domain
    lock's lease) plus a minute of clock skew; past it no task is working on the job."""
    return timedelta(seconds=settings.CELERY_TASK_TIME_LIMIT) + timedelta(minutes=1)


@dataclass(frozen=True)
class JobKind:
    """One kind of job, as the sweeps see it."""

    name: str  # in the queued marker's key: "turn", "introspection", ...
    label: str  # in logs: "turns", "introspection runs", ...
    model: str  # "app_label.Model"
    task: str  # dotted path of the Celery task, which takes the job's id
    # A context manager yielding True when nobody works on a stalled job (a lock taken
    # without waiting, or a peek), held while the job's fate is written.
    free: Callable[[Model], AbstractContextManager[bool]]
    # For a stalled, free job: None runs it again, a text fails it with that error.
    give_up: Callable[[Model], str | None]
    # Called after a stalled job is failed, to tidy the domain's rows.
    failed: Callable[[Model], None] | None = None
    # Running longer than this, a job is stalled (a callable: it derives from settings).
    stalled_after: Callable[[], timedelta] = past_task_time_limit
    # Fields `free` and `give_up` read, besides pk and started_at.
    reads: tuple[str, ...] = ()
    counts_attempts: bool = False  # the model has `attempts`, one more at each claim
    # A datetime field job_release sets: a queued marker older than it is an earlier send's
    # (Redis kept it through the outage) and does not hold the job back.
    released_at_field: str = ""
    # A pending job younger than this may still have its task on the way (sent on commit).
    requeue_after: timedelta = timedelta(minutes=1)
    requeue_batch: int = 500
    stalled_batch: int = 100  # each may cost a lock attempt in Redis

    @property
    def objects(self):
        return apps.get_model(self.model).objects


@dataclass
class Recovered:
    """What a stalled sweep did: jobs made pending and sent again, and jobs failed."""

    requeued: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)


_kinds: dict[str, JobKind] = {}


def job_kinds_register(*kinds: JobKind) -> None:
    """Called by each app's ready(): the sweeps look after these kinds."""
    for kind in kinds:
        _kinds[kind.name] = kind


def job_kinds() -> list[JobKind]:
    return list(_kinds.values())


def job_queued_key(kind: JobKind, job_id: int) -> str:
    return QUEUED_KEY.format(kind=kind.name, job_id=job_id)


class JobBusy(Conflict):
    """Another run holds the job's domain lock; the job stays pending and its task retries,
    then gives up (job_task)."""

    code = "job_busy"


# --- sending and claiming --------------------------------------------------------------------


def job_send(kind: JobKind, job_id: int) -> None:
    """Send the job's task, then mark it queued. An unreachable broker raises kombu's
    OperationalError; the job stays pending, for jobs_requeue."""
    # Taken before the send, for jobs_requeue to compare with the job's last release: a fast
    # worker (or eager Celery) may run the task, and release the job, before the marker is set.
    sent_at = time.time()
    import_string(kind.task).delay(job_id)
    visibility = settings.CELERY_BROKER_TRANSPORT_OPTIONS.get("visibility_timeout", 3600)
    try:
        cache.set(job_queued_key(kind, job_id), sent_at, timeout=visibility)
    except RedisError as exc:
        # The task is queued; without its marker the sweep merely sends it once more.
        logger.warning("%s %s is queued but not marked so: %s", kind.name.capitalize(), job_id, exc)


def job_send_on_commit(kind: JobKind, job_id: int) -> None:
    """Send the job's task once the transaction that wrote the job commits (a worker must
    find the row). A broker error is raised from the commit, to the caller of atomic()."""
    transaction.on_commit(lambda: job_send(kind, job_id))


def job_send_if_stale(kind: JobKind, job: Model, *, after: timedelta) -> None:
    """For a request reusing a pending job: send its task again (on commit) if older than
    `after`, since the task may be lost and eager Celery has no beat to requeue it. A
    duplicate delivery does nothing (job_claim)."""
    if job.created_at < timezone.now() - after:
        job_send_on_commit(kind, job.pk)


def job_claim(kind: JobKind, job_id: int, *, rerun: bool = False, now: datetime | None = None, **fields) -> bool:
    """Mark the job running if it is pending (or running, with `rerun`: the caller holds the
    domain's lock, so no live process has it). A conditional UPDATE, so of two deliveries of
    the task only one claims it; the other gets False."""
    statuses = (PENDING, RUNNING) if rerun else (PENDING,)
    if kind.counts_attempts:
        fields["attempts"] = F("attempts") + 1
    return bool(kind.objects.filter(pk=job_id, status__in=statuses).update(
        status=RUNNING, started_at=now or timezone.now(), **fields
    ))


def job_release(kind: JobKind, job_id: int, *, statuses: tuple[str, ...] = (RUNNING,), match: dict | None = None,
                now: datetime | None = None, **fields) -> bool:
    """Put the job back to pending, with `fields`, when its task could not finish it for a
    reason outside the job (Redis, the broker, the domain's lock); jobs_requeue sends it again.
    Conditional on `statuses` and `match` (say the claim's started_at): a job someone else took
    meanwhile is left alone, and False says so. Drops the queued marker; with the cache down
    too, released_at_field tells the sweep the marker is old."""
    now = now or timezone.now()
    if kind.released_at_field:
        fields[kind.released_at_field] = now
    released = kind.objects.filter(pk=job_id, status__in=statuses, **(match or {})).update(
        status=PENDING, started_at=None, **fields
    )
    if released:
        try:
            cache.delete(job_queued_key(kind, job_id))
        except RedisError as exc:
            logger.warning("%s %s is pending again but still marked queued: %s", kind.name.capitalize(), job_id, exc)
    return bool(released)


def _marker_current(marker, released_at: datetime | None) -> bool:
    """Whether a queued marker stands for a task sent since the job's last release (an untimed
    marker, from before markers carried one, counts only for a job never released)."""
    if released_at is None:
        return True
    return isinstance(marker, float) and marker >= released_at.timestamp()


# --- the sweeps ------------------------------------------------------------------------------


def jobs_requeue(kind: JobKind, *, now: datetime | None = None) -> list[int]:
    """Send again the pending jobs of `kind` older than requeue_after with no queued marker;
    their ids. A marker lost on its own costs only a duplicate task (job_claim)."""
    cutoff = (now or timezone.now()) - kind.requeue_after
    released_at = (kind.released_at_field,) if kind.released_at_field else ()
    rows = (kind.objects.filter(status=PENDING, created_at__lte=cutoff)
            .order_by("id").values_list("pk", *released_at)[: kind.requeue_batch])
    pending = {row[0]: row[1] if released_at else None for row in rows}  # id: its last release
    if not pending:
        return []
    keys = {job_id: job_queued_key(kind, job_id) for job_id in pending}
    requeued = []
    try:
        queued = cache.get_many(list(keys.values()))
        for job_id, key in keys.items():
            if key not in queued or not _marker_current(queued[key], pending[job_id]):
                job_send(kind, job_id)
                requeued.append(job_id)
    except REDIS_OUTAGES as exc:
        logger.warning("Requeueing pending %s stopped, Redis is unreachable (next try in a minute): %s",
                       kind.label, exc)
    if requeued:
        logger.info("Queued %d pending %s again: %s", len(requeued), kind.label, requeued)
    return requeued


def jobs_recover_stalled(kind: JobKind, *, now: datetime | None = None) -> Recovered:
    """Take over the jobs of `kind` left running by a process that stopped (running longer than
    stalled_after(), and kind.free): kind.give_up decides whether each is sent again or failed.
    Each write is conditional on the job still being stalled, so one that ended or was claimed
    since it was read is left alone."""
    now = now or timezone.now()
    cutoff = now - kind.stalled_after()
    candidates = list(
        kind.objects.filter(status=RUNNING, started_at__lte=cutoff)
        .order_by("started_at", "id").only("pk", "started_at", *kind.reads)[: kind.stalled_batch]
    )
    recovered = Recovered()
    try:
        for job in candidates:
            with kind.free(job) as free:
                if not free:
                    continue  # someone is working on it (maybe on this very job); the next sweep looks again
                error = kind.give_up(job)
                still_stalled = kind.objects.filter(pk=job.pk, status=RUNNING, started_at__lte=cutoff)
                if error is None:
                    taken_over = still_stalled.update(status=PENDING, started_at=None)
                else:
                    taken_over = still_stalled.update(status=FAILED, error=error, finished_at=now)
            if not taken_over:
                continue  # it ended, or was run again, since it was read
            if error is None:
                recovered.requeued.append(job.pk)
                # Outside `free`: an eager task runs here, and takes the domain's lock itself.
                job_send(kind, job.pk)  # the broker down: the job is pending, jobs_requeue sends it
            else:
                recovered.failed.append(job.pk)
                if kind.failed is not None:
                    kind.failed(job)
    except REDIS_OUTAGES as exc:
        logger.warning("Recovering stalled %s stopped, Redis is unreachable (next try in a minute): %s",
                       kind.label, exc)
    if recovered.requeued or recovered.failed:
        logger.warning("Stalled %s taken over: queued again %s, failed %s", kind.label, recovered.requeued,
                       recovered.failed)
    return recovered


# --- a job task's give-up paths ------------------------------------------------------------


def job_task_last_try(task) -> bool:
    """Whether the running task has no retry left (or runs eagerly, where a retry cannot wait)."""
    return task.request.is_eager or task.request.retries >= task.max_retries


def job_task(*, label: str, skip: Callable[[int], object] | None = None, busy_retry_seconds: int = 30,
             recorded: tuple[type[Exception], ...] = ()):
    """The give-up paths of every job task; decorates the body of a
    `shared_task(bind=True, max_retries=...)` that takes the job's id first.
    - JobBusy (with `skip`): retried after busy_retry_seconds, then `skip(job_id)`, the
      domain's call closing the job unrun (its return is the task's).
    - `recorded` (failures the service recorded on the row): logged and raised.
    Eager Celery runs the task inside the request that sent it, where a retry cannot wait: a
    busy job is skipped at once, and a recorded failure is not raised (the request succeeded)."""
    def decorate(body):
        @functools.wraps(body)
        def run(task, job_id: int, *args, **kwargs):
            try:
                return body(task, job_id, *args, **kwargs)
            except JobBusy as exc:
                if skip is None:
                    raise
                if not job_task_last_try(task):
                    raise task.retry(countdown=busy_retry_seconds) from exc
                return skip(job_id)
            except recorded as exc:
                logger.warning("%s %s failed: %s", label, job_id, exc)
                if task.request.is_eager:
                    return None
                raise  # for the task's autoretry_for (which wraps this body) or Celery's log
        return run
    return decorate


# --- `free` for domains whose lock lives in the cache ----------------------------------------


@contextmanager
def cache_key_free(key: str) -> Iterator[bool]:
    """For JobKind.free: True when the cache lock `key` (kinsite.cachelock) is not held. A
    peek, not a hold: a job claimed again meanwhile has a newer started_at, which the
    sweep's conditional write does not match."""
    yield cache.get(key) is None
