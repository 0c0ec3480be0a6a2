"""Template context shared by every dashboard page."""
from kinsite.llm.providers import chat_model_configured
from kinsite.selectors import team_for_user


def dashboard(request):
    # team_required has already looked the team up for most pages; reuse it.
    team = getattr(request, "team", None)
    if team is None:
        user = getattr(request, "user", None)
        team = team_for_user(user=user) if user is not None else None
    return {"current_team": team, "llm_configured": chat_model_configured()}
