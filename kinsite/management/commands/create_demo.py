"""python manage.py create_demo: demo team, user, kin, session and messages, and a demo
workflow (run once) that the session is attached to, so its prompt carries CURRENT CANVAS.
Idempotent (a second run reuses the rows); the last line of output is one JSON
object with a freshly issued API token, for scripts."""
import json

from django.core.management.base import BaseCommand
from django.db import transaction

from kinsite.models import Kin, Team
from kinsite.services import api_token_issue, demo_user_ensure, membership_ensure, team_create
from memories.models import Memory
from memories.services import Actor, memory_add
from sessions_app.models import Session
from sessions_app.services import ImportItem, kin_create, messages_import, session_create
from workflows.models import Workflow
from workflows.services import document_clean, workflow_create, workflow_run_start

DEMO_TEAM_SLUG = "demo"
DEMO_USERNAME = "demo"
DEMO_PASSWORD = "kinsite-demo"
DEMO_KIN_NAME = "Ada"
DEMO_SESSION_TITLE = "Welcome chat"
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
]

DEMO_MEMORIES = [
    ("preference", "Maria", 8, "Maria prefers short answers."),
    ("decision", "Customer export", 7, "Customer CSV exports are deduplicated by customer id, not by email."),
    ("fact", "Maria", 5, "Maria runs the data team at Northwind."),
    ("knowledge", "Quarterly report", 4, "The quarterly report is built from the cleaned customer CSV exports."),
]


class Command(BaseCommand):
    help = "Create (or reuse) the demo team, user, kin and session, and print a fresh API token as JSON."

    @transaction.atomic
    def handle(self, *args, **options):
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
        session = Session.objects.filter(kin=kin, title=DEMO_SESSION_TITLE).first()
        if session is None:
            session = session_create(kin=kin, title=DEMO_SESSION_TITLE, workflow=workflow)
        messages_import(
            session=session,
            items=[
                ImportItem(content=text, sender=sender, role=role, platform="web", external_id=f"demo-{index}")
                for index, (sender, role, text) in enumerate(DEMO_MESSAGES, start=1)
            ],
        )
        for category, subject, importance, content in DEMO_MEMORIES:
            if not Memory.objects.filter(team=team, kin=kin, content=content).exists():
                memory_add(
                    team=team, kin=kin, content=content, category=category, subject=subject,
                    importance=importance, source=Memory.Source.ADMIN, source_ref="create_demo",
                    actor=Actor(label="command:create_demo"),
                )
        _, raw_token = api_token_issue(team=team, name="create_demo", user=user)
        self.stdout.write(f"Demo team {team.slug!r}, kin {kin.name!r} (id {kin.pk}), session {session.pk}, "
                          f"workflow {workflow.pk}.")
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
