"""The dashboard's shell (team_required, the htmx partial-or-page helper, who may manage) and
kinsite's own pages: home, a model call, the model help page and API tokens. Every read is
scoped to the signed-in user's team; other teams' objects answer 404."""
from functools import wraps

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponseBadRequest, HttpResponseForbidden
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_http_methods

from kinsite.llm.gateway import embedding_model_current
from kinsite.llm.providers import chat_model_configured, get_default_provider
from kinsite.models import Membership
from kinsite.selectors import api_token_list, llm_call_get, team_for_user
from kinsite.services import api_token_issue, api_token_revoke

NUL_REFUSED = "The request contains a NUL character (\\0), which Kinsite cannot store or look up."


def _has_nul(request, kwargs: dict) -> bool:
    values = [str(value) for value in kwargs.values()]
    for data in (request.GET, request.POST):
        for key, items in data.lists():
            values.append(key)
            values.extend(str(item) for item in items)
    return any("\x00" in value for value in values)


def team_required(view):
    """login_required, plus the user's team as `request.team` (a user in no team gets a page
    saying so). Also refuses (400) any parameter or path part holding a NUL, for every page:
    PostgreSQL text cannot hold one, so a query reached with it would fail with a 500."""

    @login_required
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if _has_nul(request, kwargs):
            return HttpResponseBadRequest(NUL_REFUSED, content_type="text/plain; charset=utf-8")
        request.team = team_for_user(user=request.user)
        if request.team is None:
            return render(request, "base.html", {"no_team": True})
        return view(request, *args, **kwargs)

    return wrapper


def wants_partial(request) -> bool:
    # htmx restoring a page from history after a cache miss needs the full page.
    return bool(request.htmx) and not request.htmx.history_restore_request


def render_partial_or_page(request, *, partial: str, page: str, context: dict, status: int = 200):
    """The htmx partial or the full page for the same URL; caches must keep them apart."""
    response = render(request, partial if wants_partial(request) else page, context, status=status)
    patch_vary_headers(response, ["HX-Request"])
    return response


# Members chat (post, start sessions); owners and admins also manage: kins, session titles
# and archiving, API tokens.
MANAGER_ROLES = {Membership.Role.OWNER, Membership.Role.ADMIN}


def can_manage(request) -> bool:
    """Whether the signed-in user is an owner or admin of `request.team` (team_required
    read the role with the team)."""
    return getattr(request.team, "member_role", None) in MANAGER_ROLES


def managers_only(what: str):
    return HttpResponseForbidden(f"Only team owners and admins can {what}.")


@login_required
def home(request):
    return redirect("dashboard:kins")


@team_required
def model_help(request):
    """What needs a language model, what works without one, and how to connect one; whether
    one is connected now (never its address, which is internal)."""
    # The provider's own answers (as search and chat see it), not a second reading of settings.
    provider = get_default_provider()
    chat_configured = chat_model_configured()
    context = {
        "chat_configured": chat_configured,
        "embeddings": settings.EMBEDDINGS,
        "embedding_model": embedding_model_current(),
        "model_name": getattr(provider, "model", "") if chat_configured else "",
    }
    return render(request, "dashboard/model_help.html", context)


@team_required
def model_call_detail(request, model_call_id: int):
    """One logged model call (kinsite.models.LLMCall), where an activity row of a model call leads."""
    call = llm_call_get(team=request.team, call_id=model_call_id)
    return render(request, "dashboard/model_call_detail.html", {"call": call})


TOKEN_NAME_MAX_CHARS = 100


@team_required
def token_list(request):
    """The team's API tokens. Owners and admins issue and revoke them; a new
    token's raw value is shown on this response only and never again."""
    context = {"can_manage": can_manage(request), "new_token": None, "error": ""}
    if request.method == "POST":
        if not context["can_manage"]:
            return HttpResponseForbidden("Only team owners and admins can issue tokens.")
        name = request.POST.get("name", "").strip()
        if not name:
            context["error"] = "Give the token a name, so you can recognise it later."
        elif len(name) > TOKEN_NAME_MAX_CHARS:
            context["error"] = f"The name can be at most {TOKEN_NAME_MAX_CHARS} characters."
        else:
            token, raw = api_token_issue(team=request.team, name=name, user=request.user)
            context["new_token"] = {"row": token, "raw": raw}
    context["tokens"] = api_token_list(team=request.team)
    return render(request, "dashboard/tokens.html", context, status=400 if context["error"] else 200)


@require_http_methods(["GET", "POST"])
@team_required
def token_revoke(request, token_id: int):
    """GET asks for confirmation, naming the token; POST revokes it. Revoking a revoked
    token changes nothing and says so."""
    if not can_manage(request):
        return managers_only("revoke tokens")
    token = get_object_or_404(api_token_list(team=request.team), pk=token_id)
    if request.method == "GET":
        return render(request, "dashboard/token_revoke.html", {"token": token})
    if token.revoked_at is not None:
        messages.info(request, f"The token “{token.name}” was already revoked; nothing changed.")
    else:
        api_token_revoke(token=token)
        messages.success(request, f"The token “{token.name}” is revoked: clients using it are now refused.")
    return redirect("dashboard:tokens")
