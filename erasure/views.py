"""Dashboard page: erase a person (team owners and admins). The form's Preview shows the dry
run, Erase runs it and shows the receipt; the team's receipts are listed below. It calls what
the API calls: erasure.services."""
from django import forms
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods

from erasure import selectors, services
from erasure.api.views import FOUND_SHOWN
from erasure.matching import Person
from kinsite.actors import user_ref
from kinsite.errors import KinsiteError
from kinsite.models import Kin
from kinsite.views import can_manage, managers_only, team_required

RECEIPTS_SHOWN = 50


class ErasureForm(forms.Form):
    sender = forms.CharField(max_length=200, required=False, label="Sender name",
                             help_text="The name their messages carry.")
    subject = forms.CharField(max_length=200, required=False, label="Name in text",
                              help_text="Text naming them (whole words, any case).")
    kin = forms.ModelChoiceField(queryset=Kin.objects.all(), required=False, empty_label="Every kin of the team")

    def __init__(self, *args, team, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["kin"].queryset = Kin.objects.filter(team=team)

    def clean(self):
        cleaned = super().clean()
        names = [cleaned.get(key, "").strip() for key in ("sender", "subject")]
        if not any(names):
            raise forms.ValidationError("Give the person's sender name, a name in text, or both.")
        if any(name and len(name) < 2 for name in names):
            raise forms.ValidationError("A name needs at least 2 characters.")
        cleaned["person"] = Person(sender=names[0], subject=names[1])
        return cleaned


@team_required
@require_http_methods(["GET", "POST"])
def erasure_page(request):
    if not can_manage(request):
        return managers_only("erase people's data")
    form = ErasureForm(request.POST or None, team=request.team)
    plan, error, status = None, None, 200
    if request.method == "POST":
        if not form.is_valid():
            status = 400
        else:
            person, kin = form.cleaned_data["person"], form.cleaned_data["kin"]
            if request.POST.get("action") == "erase":
                try:
                    receipt = services.erasure_run(team=request.team, kin=kin, person=person,
                                                   actor=user_ref(request.user), actor_user=request.user)
                except KinsiteError as exc:
                    error, status = exc, exc.status
                else:
                    return redirect(f"{reverse('dashboard:erasures')}?receipt={receipt.pk}#receipt-{receipt.pk}")
            plan = services.erasure_plan(team=request.team, kin=kin, person=person)
    receipts = list(selectors.erasure_list(team=request.team)[:RECEIPTS_SHOWN])
    shown = request.GET.get("receipt", "")
    context = {"form": form, "plan": plan, "shown": plan.findings[:FOUND_SHOWN] if plan else [], "error": error,
               "receipts": receipts, "shown_receipt": int(shown) if shown.isdigit() else None}
    return render(request, "erasure/erasures.html", context, status=status)
