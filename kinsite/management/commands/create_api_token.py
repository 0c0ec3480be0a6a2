"""python manage.py create_api_token --team SLUG [--user NAME] [--name LABEL]: prints a new token once."""
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from kinsite.models import Team
from kinsite.services import api_token_issue


class Command(BaseCommand):
    help = "Issue an API token for a team. The raw token is printed once and never stored."

    def add_arguments(self, parser):
        parser.add_argument("--team", required=True, help="team slug")
        parser.add_argument("--user", help="username the token acts for (optional)")
        parser.add_argument("--name", default="cli", help="a label to recognise the token by")

    def handle(self, *args, team, user, name, **options):
        team_row = Team.objects.filter(slug=team).first()
        if team_row is None:
            raise CommandError(f"No team with slug {team!r}.")
        user_row = None
        if user:
            user_row = get_user_model().objects.filter(username=user).first()
            if user_row is None:
                raise CommandError(f"No user named {user!r}.")
        token, raw = api_token_issue(team=team_row, name=name, user=user_row)
        self.stderr.write(
            f"Token {token.prefix}… issued for team {team_row.slug}; store it now, it is not shown again."
        )
        self.stdout.write(raw)
