"""python manage.py export_kin ID [--sessions] [-o FILE]: the kin document of one kin, to
stdout or a file (the same document as GET /api/v1/kins/{id}/export/)."""
import json

from django.core.management.base import BaseCommand, CommandError

from kinsite.models import Kin
from transfer.selectors import kin_export_document


class Command(BaseCommand):
    help = "Write a kin (memories, facts, experience, templates; sessions with --sessions) as one JSON kin document."

    def add_arguments(self, parser):
        parser.add_argument("kin_id", type=int, help="The kin's id (any team: this is the operator's command).")
        parser.add_argument("--sessions", action="store_true", help="Include sessions, events, turns and summaries.")
        parser.add_argument("-o", "--output", help="Write to this file instead of stdout.")

    def handle(self, *args, kin_id, sessions, output, **options):
        kin = Kin.objects.filter(pk=kin_id).first()
        if kin is None:
            raise CommandError(f"No kin with id {kin_id}.")
        text = json.dumps(kin_export_document(kin=kin, include_sessions=sessions), ensure_ascii=False, indent=1)
        if not output:
            self.stdout.write(text)
            return
        try:
            with open(output, "w", encoding="utf-8") as file:
                file.write(text + "\n")
        except OSError as exc:
            raise CommandError(f"Could not write {output}: {exc}") from None
        self.stderr.write(f"Wrote kin {kin.pk} ({kin.name}) to {output}.")
