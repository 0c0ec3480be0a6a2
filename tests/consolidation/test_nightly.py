"""The nightly consolidation (SPEC §8, §12): a beat entry every 15 minutes whose task
consolidates each kin with pending facts once per night, at 02:00 in its team's time zone."""
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from celery.schedules import crontab
from django.core.cache import cache
from django.utils import timezone

from consolidation.models import ConsolidationRun, ExperienceVersion, Fact
from consolidation.services import (
    LOCK_KEY,
    NightAlreadyConsolidated,
    consolidation_nightly,
    consolidation_request,
    consolidation_run,
    scheduled_night,
)
from consolidation.tasks import consolidate_kin_task, consolidate_nightly_task
from kinsite.celery import app
from tests.consolidation.conftest import add_fact, answer, runs_of
from tests.factories import KinFactory, TeamFactory

UTC = UTC


def at(*args) -> datetime:
    return datetime(*args, tzinfo=UTC)


def backdate(kin, days=2):
    Fact.objects.filter(kin=kin).update(created_at=timezone.now() - timedelta(days=days))


def test_the_nightly_task_is_in_the_beat_schedule_every_15_minutes():
    [entry] = [
        e for e in app.conf.beat_schedule.values() if e["task"] == "consolidation.tasks.consolidate_nightly_task"
    ]
    assert entry["schedule"] == crontab(minute="*/15")
    assert consolidate_nightly_task.name == "consolidation.tasks.consolidate_nightly_task"


def test_the_task_consolidates_only_kins_with_pending_facts(team, model):
    busy = KinFactory(team=team)
    idle = KinFactory(team=team)
    done = KinFactory(team=team)
    fact = add_fact(busy, "Never deploy on Fridays.")
    consolidated = add_fact(done, "Old news.")
    Fact.objects.filter(pk=consolidated.pk).update(is_consolidated=True)
    backdate(busy), backdate(done)
    model.add(answer(processed=[fact.pk]))

    made = consolidate_nightly_task.apply().get()

    assert made == 1
    [run] = runs_of(busy)
    assert (run.trigger, run.status) == ("nightly", "applied")
    assert run.night == scheduled_night(now=timezone.now(), zone=ZoneInfo("UTC"))[0]
    assert runs_of(idle) == [] and runs_of(done) == []


def test_running_it_twice_for_the_same_night_consolidates_once(kin, model):
    fact = add_fact(kin, "Never deploy on Fridays.")
    model.add(answer(processed=[fact.pk]))
    now = at(2031, 5, 6, 3, 0)

    first = consolidation_nightly(now=now)
    add_fact(kin, "A fact that arrived after the run; it waits for tomorrow.")
    backdate(kin, days=1)  # even an old pending fact: the night is done
    second = consolidation_nightly(now=now + timedelta(minutes=15))

    assert [r.status for r in first] == ["applied"] and second == []
    assert [(r.trigger, r.night) for r in runs_of(kin)] == [("nightly", datetime(2031, 5, 6).date())]
    assert len(model.calls) == 1


def test_the_unique_night_holds_even_when_two_beats_race(kin, model):
    fact = add_fact(kin, "A fact.")
    model.add(answer(processed=[fact.pk]))
    night = datetime(2031, 5, 6).date()
    consolidation_run(kin=kin, trigger="nightly", night=night)
    add_fact(kin, "A later fact.")
    with pytest.raises(NightAlreadyConsolidated):
        consolidation_run(kin=kin, trigger="nightly", night=night)
    assert len(runs_of(kin)) == 1 and len(model.calls) == 1


def test_each_team_is_consolidated_at_2am_in_its_own_time_zone(db, model):
    tokyo = KinFactory(team=TeamFactory(timezone="Asia/Tokyo"))  # UTC+9
    los_angeles = KinFactory(team=TeamFactory(timezone="America/Los_Angeles"))  # UTC-8 in January
    for kin in (tokyo, los_angeles):
        add_fact(kin, f"A fact of {kin.name}.")

    def answers_for(*kins):
        for kin in kins:
            model.add(answer(processed=[f.pk for f in Fact.objects.filter(kin=kin, is_consolidated=False)]))

    # 16:00 UTC: Tokyo 01:00 on Jan 11, Los Angeles 08:00 on Jan 10: both are in the night of Jan 10.
    answers_for(tokyo, los_angeles)
    runs = consolidation_nightly(now=at(2031, 1, 10, 16, 0))
    assert sorted((r.kin_id, str(r.night)) for r in runs) == sorted(
        [(tokyo.pk, "2031-01-10"), (los_angeles.pk, "2031-01-10")])

    for kin in (tokyo, los_angeles):
        add_fact(kin, f"Another fact of {kin.name}.")
    # 17:30 UTC: 02:30 in Tokyo (its night of Jan 11 is due); still 09:30 on Jan 10 in Los Angeles.
    answers_for(tokyo)
    runs = consolidation_nightly(now=at(2031, 1, 10, 17, 30))
    assert [(r.kin_id, str(r.night), r.status) for r in runs] == [(tokyo.pk, "2031-01-11", "applied")]

    # 10:30 UTC the next day: 02:30 in Los Angeles (night of Jan 11); Tokyo's Jan 11 is done.
    add_fact(tokyo, "A Tokyo fact from the afternoon.")
    answers_for(los_angeles)
    runs = consolidation_nightly(now=at(2031, 1, 11, 10, 30))
    assert [(r.kin_id, str(r.night)) for r in runs] == [(los_angeles.pk, "2031-01-11")]
    assert model.script == []


def test_facts_logged_after_the_nights_time_wait_for_the_next_night(kin, model):
    add_fact(kin, "Logged in the afternoon.")
    now = timezone.now()
    _, moment = scheduled_night(now=now, zone=ZoneInfo("UTC"))
    Fact.objects.update(created_at=moment + timedelta(seconds=1))
    assert consolidation_nightly(now=max(now, moment + timedelta(seconds=2))) == []
    assert runs_of(kin) == []


def test_the_hour_is_a_setting(kin, model, settings):
    settings.CONSOLIDATION_HOUR, settings.CONSOLIDATION_MINUTE = 4, 30
    night, moment = scheduled_night(now=at(2031, 5, 6, 4, 29), zone=ZoneInfo("UTC"))
    assert (str(night), moment) == ("2031-05-05", at(2031, 5, 5, 4, 30))
    night, moment = scheduled_night(now=at(2031, 5, 6, 4, 30), zone=ZoneInfo("UTC"))
    assert (str(night), moment) == ("2031-05-06", at(2031, 5, 6, 4, 30))


def test_a_failed_nightly_run_is_recorded_and_its_facts_stay_pending(kin, model):
    fact = add_fact(kin, "A fact.")
    model.add("not json", "still not json")
    [run] = consolidation_nightly(now=at(2031, 5, 6, 3, 0))
    assert run.status == "rejected"
    assert Fact.objects.get(pk=fact.pk).is_consolidated is False
    assert consolidation_nightly(now=at(2031, 5, 6, 3, 15)) == []  # once per night, whatever the outcome
    model.add(answer(processed=[fact.pk]))
    assert [r.status for r in consolidation_nightly(now=at(2031, 5, 7, 3, 0))] == ["applied"]


def test_the_on_demand_task_runs_a_requested_run(kin, model, django_capture_on_commit_callbacks):
    fact = add_fact(kin, "A fact.")
    model.add(answer(processed=[fact.pk]))
    with django_capture_on_commit_callbacks(execute=True):  # enqueued after commit; eager here
        requested = consolidation_request(kin=kin, trigger="admin", max_words=500)
    assert requested.status == "pending"
    run = ConsolidationRun.objects.get(pk=requested.pk)
    assert (run.trigger, run.status, run.max_words) == ("admin", "applied", 500)
    assert consolidate_kin_task.apply(args=[999_999]).get() is None


def test_a_redelivered_task_finds_its_run_done_and_does_nothing(kin, model, django_capture_on_commit_callbacks):
    fact = add_fact(kin, "A fact.")
    model.add(answer(processed=[fact.pk]))
    with django_capture_on_commit_callbacks(execute=True):
        run = consolidation_request(kin=kin, trigger="api")
    late = add_fact(kin, "Arrived after the run.")
    model.add(answer(processed=[late.pk]))  # what a second run would apply

    assert consolidate_kin_task.apply(args=[run.pk]).get() == run.pk  # the broker delivers it again

    assert runs_of(kin) == [run] and ConsolidationRun.objects.get(pk=run.pk).status == "applied"
    assert list(ExperienceVersion.objects.filter(kin=kin).values_list("version", flat=True)) == [1]
    assert Fact.objects.get(pk=late.pk).is_consolidated is False
    assert len(model.script) == 1  # the second answer was never asked for


def test_a_requested_run_with_nothing_pending_is_closed_without_a_model_call(kin, model,
                                                                            django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        requested = consolidation_request(kin=kin, trigger="api")

    run = ConsolidationRun.objects.get(pk=requested.pk)
    assert run.status == "skipped" and run.error == f"Nothing to consolidate: {kin.name} has no pending facts."
    assert run.finished_at is not None and model.calls == []
    assert not ExperienceVersion.objects.filter(kin=kin).exists()


def test_a_requested_run_that_meets_another_run_of_its_kin_is_skipped(kin, model, django_capture_on_commit_callbacks):
    add_fact(kin, "A fact.")
    key = LOCK_KEY.format(kin_id=kin.pk)
    cache.add(key, "another-run", timeout=60)
    try:
        with django_capture_on_commit_callbacks(execute=True):  # eager: no retry later, so it closes now
            requested = consolidation_request(kin=kin, trigger="api")
    finally:
        cache.delete(key)

    run = ConsolidationRun.objects.get(pk=requested.pk)
    assert run.status == "skipped" and "Another consolidation" in run.error and model.calls == []
    assert Fact.objects.get(kin=kin).is_consolidated is False
