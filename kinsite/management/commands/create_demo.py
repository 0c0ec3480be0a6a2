"""python manage.py create_demo: demo data, written through the services, that gives every
dashboard page something to show. The consolidations are real runs whose answers are the
demo's own, given as `consolidate --llm` gives one. Idempotent: a second run creates only a
new API token (revoking the previous one). The last line of output is one JSON object with
that token, for scripts."""
import contextlib
import json

from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.urls import reverse

from consolidation.models import ConsolidationRun, Fact
from consolidation.services import consolidation_run, fact_record
from kinsite.actors import writer_ref
from kinsite.models import ApiToken, Kin, Team
from kinsite.services import api_token_issue, api_token_revoke, demo_user_ensure, membership_ensure, team_create
from memories.models import Memory
from memories.services import Actor, memory_add
from sessions_app.models import Event, Session
from sessions_app.services import ImportItem, kin_create, messages_import, session_create
from sessions_app.turns.services import TurnFailed, turn_post
from workflows.models import Workflow
from workflows.services import document_clean, workflow_create, workflow_run_start

DEMO_TEAM_SLUG = "demo"
DEMO_USERNAME = "demo"
DEMO_PASSWORD = "kinsite-demo"
DEMO_KIN_NAME = "Ada"
DEMO_SESSION_TITLE = "Welcome chat"
DEMO_BASE_URL = "http://127.0.0.1:8000"
DEMO_WORKFLOW = {
    "name": "Customer export cleanup",
    "description": "Keeps the active customers of the CSV export for the quarterly report.",
    "nodes": [
        {"id": "customers", "type": "inline_records", "label": "Customer export", "config": {"records": [
            {"customer_id": 1, "name": "Northwind Traders", "active": True},
            {"customer_id": 2, "name": "Contoso", "active": False},
            {"customer_id": 3, "name": "Fabrikam", "active": True},
            {"customer_id": 4, "name": "Tailspin Toys", "active": True},
        ]}},
        {"id": "active", "type": "filter", "label": "Active customers",
         "config": {"conditions": [{"field": "active", "op": "eq", "value": True}]}},
        {"id": "report", "type": "table_output", "label": "Quarterly report",
         "config": {"columns": ["customer_id", "name"]}},
    ],
    "edges": [{"source": "customers", "target": "active"}, {"source": "active", "target": "report"}],
}

DEMO_MESSAGES = [
    ("Maria", "user", "Hi Ada! I'm Maria, I run the data team at Northwind."),
    ("Ada", "assistant", "Hello Maria, nice to meet you. What are you working on?"),
    ("Maria", "user", "We are cleaning the customer CSV exports before the quarterly report."),
    ("Ada", "assistant", "Got it. Do you deduplicate by email or by customer id?"),
    ("Maria", "user", "By customer id. Emails change too often. Also, please keep answers short."),
    ("Ada", "assistant", "Noted: deduplicate by customer id, and short answers."),
    ("Maria", "user", "One more thing: bullet points, please. And inactive customers stay out of the report."),
    ("Ada", "assistant", "Will do: short bullet points, and only active customers in the report."),
]

# One chat turn and a /checkpoint (which requests an introspection run), posted once like
# any chat message: the configured model answers, or the offline provider when none is.
DEMO_TURNS = ["What did we decide about dedupe?", "/checkpoint"]

DEMO_MEMORIES = [
    ("preference", "Maria", 8, "Maria prefers short answers."),
    ("decision", "Customer export", 7, "Customer CSV exports are deduplicated by customer id, not by email."),
    ("fact", "Maria", 5, "Maria runs the data team at Northwind."),
    ("knowledge", "Quarterly report", 4, "The quarterly report is built from the cleaned customer CSV exports."),
]

# Learnings from the demo chat, recorded as the record_learning tool records them (source_ref:
# the message's external_id). Each round folds its facts into a new experience version; the
# facts after the last round stay pending, for the facts page and "Consolidate now".
DEMO_CONSOLIDATIONS = [
    {
        "facts": [
            ("demo-5", "preference", "Maria wants short answers."),
            ("demo-5", "decision", "Customer CSV exports are deduplicated by customer id, not by email."),
        ],
        "supersedes": [],
        "summary": "First version: Maria's preference for short answers and the dedupe rule.",
        "markdown": """# Master AI Experience
## 1. User Directives & Preferences
- Maria wants short answers.
## 2. Defensive Safeguards & Heuristics
- Deduplicate customer CSV exports by customer id, never by email.
## 3. Project-Specific Constraints
## 4. Anti-Patterns & Critical Gotchas
## 5. Mistake Corrections & Fixes
""",
    },
    {
        "facts": [
            ("demo-7", "preference", "Maria wants short answers as bullet points."),
            ("demo-3", "knowledge", "The quarterly report is built from the cleaned customer CSV exports."),
        ],
        # The newer preference replaces the first round's "short answers".
        "supersedes": [(0, 0)],
        "summary": "Answers are now short bullet points; added where the quarterly report comes from.",
        "markdown": """# Master AI Experience
## 1. User Directives & Preferences
- Maria wants short answers as bullet points.
## 2. Defensive Safeguards & Heuristics
- Deduplicate customer CSV exports by customer id, never by email.
## 3. Project-Specific Constraints
- The quarterly report is built from the cleaned customer CSV exports.
## 4. Anti-Patterns & Critical Gotchas
- Deduplicating by email: customers' emails change too often, so one customer becomes several.
## 5. Mistake Corrections & Fixes
""",
    },
]
DEMO_PENDING_FACTS = [
    ("demo-7", "decision", "Inactive customers stay out of the quarterly report."),
    ("demo-1", "fact", "Maria runs the data team at Northwind."),
]


DEMO_TOKEN_NAME = "create_demo"


class Command(BaseCommand):
    help = ("Create (or reuse) the demo team, user, kin, session, memories, facts, experience versions and "
            "workflow; list the dashboard pages to open and print a fresh API token as JSON.")

    def add_arguments(self, parser):
        parser.add_argument("--base-url", default=DEMO_BASE_URL,
                            help=f"where the dashboard is served, for the page links (default {DEMO_BASE_URL})")

    def handle(self, *args, base_url, **options):
        with transaction.atomic():
            team, kin, session, workflow, user = self._ensure_demo()
            # One live demo token at a time: the one printed last (scripts/serve runs this at every start).
            for earlier in ApiToken.objects.filter(team=team, name=DEMO_TOKEN_NAME, revoked_at__isnull=True):
                api_token_revoke(token=earlier)
            _, raw_token = api_token_issue(team=team, name=DEMO_TOKEN_NAME, user=user)
        # After the commit, so eager tasks queued by the demo (the workflow run, the
        # introspection of /checkpoint) have run and their rows exist.
        self.stdout.write(f"Demo team {team.slug!r}, kin {kin.name!r} (id {kin.pk}), session {session.pk}, "
                          f"workflow {workflow.pk}.")
        self.stdout.write("Dashboard pages worth opening:")
        for label, url in demo_pages(kin=kin, session=session, workflow=workflow):
            self.stdout.write(f"  {label:<12} {base_url.rstrip('/')}{url}")
        self.stdout.write(
            json.dumps(
                {
                    "token": raw_token,
                    "team": team.slug,
                    "kin_id": kin.pk,
                    "session_id": session.pk,
                    "workflow_id": workflow.pk,
                    "dashboard_user": DEMO_USERNAME,
                    "dashboard_password": DEMO_PASSWORD,
                }
            )
        )

    def _ensure_demo(self):
        user = demo_user_ensure(username=DEMO_USERNAME, password=DEMO_PASSWORD)
        team = Team.objects.filter(slug=DEMO_TEAM_SLUG).first()
        if team is None:
            team = team_create(name="Demo team", slug=DEMO_TEAM_SLUG)
        membership_ensure(team=team, user=user, role="owner")

        kin = Kin.objects.filter(team=team, name=DEMO_KIN_NAME).first()
        if kin is None:
            kin = kin_create(
                team=team,
                name=DEMO_KIN_NAME,
                role="Data assistant",
                character="Calm, precise, brief.",
                expertise="Data cleaning, CSV workflows, reporting.",
            )
        workflow = Workflow.objects.filter(team=team, name=DEMO_WORKFLOW["name"]).first()
        if workflow is None:
            workflow = workflow_create(team=team, document=document_clean(DEMO_WORKFLOW))
            # Enqueued after commit: with eager Celery (the embedded default) the run is
            # finished when the command returns; with a broker a worker runs it.
            workflow_run_start(workflow=workflow)
        # Before the turns, which may store memories of their own: the README's examples use memory 1.
        for category, subject, importance, content in DEMO_MEMORIES:
            if not Memory.objects.filter(team=team, kin=kin, content=content).exists():
                memory_add(
                    team=team, kin=kin, content=content, category=category, subject=subject,
                    importance=importance, source=Memory.Source.ADMIN, source_ref=writer_ref("command", "create_demo"),
                    actor=Actor(label=writer_ref("command", "create_demo")),
                )
        session = Session.objects.filter(kin=kin, title=DEMO_SESSION_TITLE).first()
        if session is None:
            session = session_create(kin=kin, title=DEMO_SESSION_TITLE, workflow=workflow)
        if session.archived_at is None:  # an archived session takes no messages; its history stays as it is
            messages_import(
                session=session,
                items=[
                    ImportItem(content=text, sender=sender, role=role, platform="web", external_id=f"demo-{index}")
                    for index, (sender, role, text) in enumerate(DEMO_MESSAGES, start=1)
                ],
            )
        # Before the turns, whose model (a configured one) may record facts of its own.
        if not kin.facts.exists() and not kin.experience_versions.exists():
            _facts_and_experience_ensure(kin=kin, session=session)
        if session.archived_at is None and not session.turns.exists():
            for content in DEMO_TURNS:
                # A configured model that fails leaves the turn recorded as failed, which the
                # activity page then shows: the demo goes on.
                with contextlib.suppress(TurnFailed):
                    turn_post(session=session, content=content, sender="Maria", platform=Event.Platform.WEB)
        return team, kin, session, workflow, user


def _facts_and_experience_ensure(*, kin: Kin, session: Session) -> None:
    """The demo's consolidation rounds and pending facts, on a kin that has none of either."""
    message_ids = dict(
        Event.objects.filter(session=session, external_id__startswith="demo-").values_list("external_id", "pk")
    )

    def record(facts):
        return [
            fact_record(kin=kin, statement=statement, category=category, source=Fact.Source.TOOL,
                        source_ref=writer_ref("event", message_ids[external_id]) if external_id in message_ids else "")
            for external_id, category, statement in facts
        ]

    rounds = []
    for round_ in DEMO_CONSOLIDATIONS:
        facts = record(round_["facts"])
        rounds.append(facts)
        answer = json.dumps({
            "updated_experience_markdown": round_["markdown"],
            "processed_pending_ids": [fact.pk for fact in facts],
            "superseded_fact_ids": [rounds[index][position].pk for index, position in round_["supersedes"]],
            "summary_of_changes": round_["summary"],
        })
        run = consolidation_run(kin=kin, trigger=ConsolidationRun.Trigger.COMMAND, llm=lambda prompt, a=answer: a)
        if run.status != ConsolidationRun.Status.APPLIED:
            raise CommandError(f"The demo consolidation run {run.pk} was not applied ({run.status}): "
                               f"{run.error or run.validation_errors}")
    record(DEMO_PENDING_FACTS)


def demo_pages(*, kin: Kin, session: Session, workflow: Workflow) -> list[tuple[str, str]]:
    """(label, path) of the dashboard pages that show the demo data."""
    return [
        ("Kins", reverse("dashboard:kins")),
        ("Kin", reverse("dashboard:kin_detail", args=[kin.pk])),
        ("Session", reverse("dashboard:session_detail", args=[session.pk])),
        ("Memories", reverse("dashboard:memory_list", args=[kin.pk])),
        ("Experience", reverse("dashboard:experience", args=[kin.pk])),
        ("Facts", reverse("dashboard:fact_list", args=[kin.pk])),
        ("Workflow", reverse("dashboard:workflow_detail", args=[workflow.pk])),
        ("Activity", reverse("dashboard:kin_activity", args=[kin.pk])),
        ("Admin", reverse("admin:index")),
    ]
