"""Background work that can get stuck, handled one way for every kind of job: chat turns,
introspection, compaction, consolidation, re-embedding and workflow runs. Each domain declares a JobKind; this
module claims, sends and sweeps, and the domain keeps only its own decisions.

A job is a row on kinsite.jobmodels.Job: `status` (pending → running → an end state,
`failed` among them), `created_at`, `started_at`, `finished_at` and `error` (and `attempts`,
if the kind counts starts), and a Celery task that takes the row's id:
- `job_send` sends the task and marks the job queued in the cache (the same Redis as the
  queue), for as long as the broker may hold the task unacknowledged;
- `job_claim` is the task's claim, a conditional UPDATE pending → running: of two
  deliveries of one task only one matches, so a redelivered task does nothing;
- `jobs_requeue` (beat, every minute) sends again the pending jobs without a queued
  marker: sent while the broker was down, or lost with Redis's data in a restart;
- `job_release` gives a job its task could not finish, for a reason outside the job (Redis,
  the broker, the domain's lock), back to pending, for jobs_requeue to send again once the
  service is back; the domain counts those and decides when to give up;
- `jobs_recover_stalled` (beat, every minute) takes over the jobs left running by a
  process that stopped, once nobody holds their domain's lock: the domain decides
  whether each runs again (back to pending, sent again) or is failed.
A job's Celery task gives up one way too (job_task): busy, it is retried, then the domain
skips the job; a failure the service recorded is not raised into an eager caller's request.
Domains register their kinds in their AppConfig.ready() (job_kinds_register), so the
sweeps (kinsite.tasks) reach every kind without this module importing any domain."""
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
# Set when a job's task is sent; a pending job without it has no task in the queue. A
# turn's is "kinsite:turn-queued:<id>", the key the turns used on their own, so markers set
# before a deploy still count.
QUEUED_KEY = "kinsite:{kind}-queued:{job_id}"
# What the sweeps give up on when Redis (the broker, the cache, a domain's lock) does not
# answer; beat runs them again a minute later. A domain's lock that cannot reach Redis
# raises a ServiceUnavailable (sessions_app.locks.LockUnavailable).
REDIS_OUTAGES = (BrokerUnreachable, RedisError, ServiceUnavailable)


def past_task_time_limit() -> timedelta:
    """JobKind.stalled_after's default: Celery's hard time limit, which ends any task still
    going (and with it, the lease of the domain's lock), plus a minute for clocks that
    differ between machines; 7 minutes by default. A job running for longer has no task
    left working on it. Read at sweep time, since it derives from settings."""
    return timedelta(seconds=settings.CELERY_TASK_TIME_LIMIT) + timedelta(minutes=1)


@dataclass(frozen=True)
class JobKind:
    """One kind of job, as the sweeps see it."""

    name: str  # in the queued marker's key: "turn", "introspection", ...
    label: str  # in logs: "turns", "introspection runs", ...
    model: str  # "app_label.Model"
    task: str  # dotted path of the Celery task, which takes the job's id
    # Whether nobody is working on a stalled job: a context manager yielding True to go
    # ahead, held while the job's fate is written (a lock taken without waiting, or a peek).
    free: Callable[[Model], AbstractContextManager[bool]]
    # The domain's decision on a stalled job nobody is working on: None runs it again,
    # a text fails it with that error.
    give_up: Callable[[Model], str | None]
    # Called once a stalled job was failed, for the domain to tidy the rows it owns.
    failed: Callable[[Model], None] | None = None
    # How long a job may be running before the stalled sweep looks at it (read at sweep time,
    # since it derives from settings).
    stalled_after: Callable[[], timedelta] = past_task_time_limit
    # Fields `free` and `give_up` read, besides pk and started_at.
    reads: tuple[str, ...] = ()
    counts_attempts: bool = False  # the model has `attempts`, one more at each claim
    # A datetime field job_release sets: a queued marker set before it is an earlier send's
    # (kept by a Redis that kept its data through the outage) and does not hold the job back.
    released_at_field: str = ""
    # A pending job younger than this may still have its task on the way (sent on commit).
    requeue_after: timedelta = timedelta(minutes=1)
    requeue_batch: int = 500
    # Stalled jobs looked at per sweep (each may cost a lock attempt in Redis).
    stalled_batch: int = 100

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
    """Another run holds the job's domain (its lock); the job is left pending. Its task tries
    again later, then gives up (job_task)."""

    code = "job_busy"


# --- sending and claiming --------------------------------------------------------------------


def job_send(kind: JobKind, job_id: int) -> None:
    """Send the job's task, then mark it queued. The broker not answering raises kombu's
    OperationalError (the job stays pending: the caller says so, jobs_requeue sends it)."""
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
    """For a request that reuses a pending job: send its task again (on commit) if the job
    is older than `after`. Its task may be lost, and the embedded mode (eager Celery) has no
    beat to run the requeue sweep; if it is not, the second delivery does nothing (job_claim)."""
    if job.created_at < timezone.now() - after:
        job_send_on_commit(kind, job.pk)


def job_claim(kind: JobKind, job_id: int, *, rerun: bool = False, now: datetime | None = None, **fields) -> bool:
    """Mark the job running, if it is pending (also if it is running, with `rerun`: the
    caller holds the domain's lock, so no live process has it). A conditional UPDATE:
    of two deliveries of the task one claims it, the other gets False and does nothing.
    `fields` are written with the claim; started_at is `now`."""
    statuses = (PENDING, RUNNING) if rerun else (PENDING,)
    if kind.counts_attempts:
        fields["attempts"] = F("attempts") + 1
    return bool(kind.objects.filter(pk=job_id, status__in=statuses).update(
        status=RUNNING, started_at=now or timezone.now(), **fields
    ))


def job_release(kind: JobKind, job_id: int, *, statuses: tuple[str, ...] = (RUNNING,), match: dict | None = None,
                now: datetime | None = None, **fields) -> bool:
    """Put the job back to pending, with `fields`, when its task could not finish it for a
    reason outside the job (Redis, the broker, the domain's lock, waited out): jobs_requeue
    sends it again (beat, every minute), once the broker answers. A conditional UPDATE from
    `statuses` and `match` (say the claim's started_at): a job someone else took meanwhile is
    left alone, and False says so. Its queued marker is dropped, so the sweep does not wait for
    it; with the cache down too, the kind's released_at_field tells the sweep the marker is old."""
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
    """Whether a queued marker stands for a task sent since the job's last release. A marker
    without a time (written before markers carried one) counts only for a job never released."""
    if released_at is None:
        return True
    return isinstance(marker, float) and marker >= released_at.timestamp()


# --- the sweeps ------------------------------------------------------------------------------


def jobs_requeue(kind: JobKind, *, now: datetime | None = None) -> list[int]:
    """Send again the pending jobs of `kind` that have no task in the queue (no queued
    marker) and are older than requeue_after; their ids. A job sent twice still runs once
    (job_claim), so a marker lost on its own costs a duplicate task, nothing more. It reads
    the pending jobs only (a partial index on status pending), the oldest requeue_batch
    first. With Redis down it stops, logs, and leaves the rest to the next minute."""
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
    """Take over the jobs of `kind` left running by a process that stopped: running for
    longer than kind.stalled_after() and free (kind.free: nobody holds the domain's lock).
    Holding that, the domain decides (kind.give_up): the job goes back to pending and is
    sent again, or is failed with the domain's error. Each write is conditional on the job
    still being the stalled running one, so a job that ended or was claimed again since it
    was read is left alone. It reads the running jobs only (a partial index on status
    running), the stalled_batch longest running first. With Redis down it stops, logs, and
    leaves the rest to the next minute."""
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
    """The give-up paths of a job's task, the same for every kind: decorates the body of a
    `shared_task(bind=True, max_retries=...)` that takes the job's id first.
    - JobBusy (with `skip`): tried again after busy_retry_seconds while retries are left, then
      `skip(job_id)`, the domain's one service call closing the job unrun; its return is the task's.
    - `recorded`, failures the service has recorded on the job's row: logged and raised, for
      the task's autoretry_for to retry or for Celery's log.
    Eager Celery runs a task inside the request that sent it (a turn, a /checkpoint), where
    a retry cannot wait: a busy job is skipped at once, and a recorded failure is not raised
    (it is on the row; the request itself succeeded)."""
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
