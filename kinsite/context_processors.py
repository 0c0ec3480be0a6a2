"""Template context shared by every dashboard page."""
from django.conf import settings

from kinsite.selectors import team_for_user


def dashboard(request):
    user = getattr(request, "user", None)
    return {
        "current_team": team_for_user(user=user) if user is not None else None,
        "llm_configured": bool(settings.LLM_BASE_URL),
    }
