"""Dashboard pages: download a kin as a kin document (the kin page's Export button) and
import one as a new kin (the kins page's import form; team owners and admins, like New
kin). Both call what the API calls: transfer.selectors and transfer.services."""
import json

from django import forms
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods

from kinsite.errors import KinsiteError
from kinsite.selectors import kin_get
from kinsite.views import can_manage, managers_only, team_required
from transfer.api.views import document_filename
from transfer.parsing import document_read
from transfer.selectors import kin_export_document
from transfer.services import kin_import

TRUE_VALUES = ("1", "on", "true", "yes")


@team_required
@require_GET
def kin_export_download(request, kin_id: int):
    kin = kin_get(team=request.team, kin_id=kin_id)
    document = kin_export_document(kin=kin, include_sessions=request.GET.get("sessions", "") in TRUE_VALUES)
    response = HttpResponse(json.dumps(document, ensure_ascii=False), content_type="application/json; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{document_filename(kin)}"'
    return response


class KinImportForm(forms.Form):
    document = forms.FileField(label="Kin document (.json)",
                               help_text="A file made by a kin's Export button or GET /api/v1/kins/{id}/export/.")


@team_required
@require_http_methods(["GET", "POST"])
def kin_import_form(request):
    """GET: the form alone; POST: import, then the new kin's page (or the kin this document
    made before). A refused document shows the form again with every problem by its path."""
    if not can_manage(request):
        return managers_only("import kins")
    form = KinImportForm(request.POST or None, request.FILES or None)
    error, status = None, 200
    if request.method == "POST":
        if form.is_valid():
            try:
                result = kin_import(team=request.team, document=document_read(form.cleaned_data["document"]))
            except KinsiteError as exc:
                error, status = exc, exc.status
            else:
                outcome = "new" if result.created else "again"
                return redirect(f"{reverse('dashboard:kin_detail', args=[result.kin.pk])}?imported={outcome}")
        else:
            status = 400
    return render(request, "transfer/kin_import.html", {"form": form, "error": error}, status=status)
