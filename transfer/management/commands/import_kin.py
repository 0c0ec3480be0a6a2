"""python manage.py import_kin FILE --team SLUG: a kin document (from export_kin, the API or
the dashboard) as a new kin of the team; the same file again reports the kin it made."""
import sys

from django.core.management.base import BaseCommand, CommandError

from kinsite.errors import KinsiteError
from kinsite.models import Team
from transfer.parsing import document_read
from transfer.services import kin_import


class Command(BaseCommand):
    help = "Import a kin document as a new kin of a team (all or nothing; idempotent per document)."

    def add_arguments(self, parser):
        parser.add_argument("file", help="The kin document (JSON); - reads stdin.")
        parser.add_argument("--team", required=True, help="The slug of the team that gets the kin.")

    def handle(self, *args, file, team, **options):
        team_row = Team.objects.filter(slug=team).first()
        if team_row is None:
            raise CommandError(f"No team with slug {team!r}.")
        try:
            if file == "-":
                document = document_read(sys.stdin.buffer)
            else:
                with open(file, "rb") as stream:
                    document = document_read(stream)
            result = kin_import(team=team_row, document=document)
        except OSError as exc:
            raise CommandError(f"Could not read {file}: {exc}") from None
        except KinsiteError as exc:
            problems = "".join(f"\n  {problem['path']}: {problem['message']}"
                               for problem in exc.details.get("errors", [])[1:])
            raise CommandError(exc.message + problems) from None
        if result.created:
            self.stdout.write(f"Imported kin {result.kin.pk} ({result.kin.name}) into team {team_row.slug}.")
        else:
            self.stdout.write(f"Already imported: kin {result.kin.pk} ({result.kin.name}) in team {team_row.slug}; "
                              "nothing changed.")
