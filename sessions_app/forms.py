"""The dashboard's forms for kins and sessions. They parse what a browser posts, then run the
API's serializers, so the dashboard refuses exactly what the API refuses, with the same
messages on the same fields. A valid form's `validated` holds what the service takes."""
from django import forms
from django.conf import settings
from django.utils.html import escape

from kinsite.models import Kin, Team
from sessions_app.api.serializers import KIN_TEXT_MAX_CHARS, KinSerializer, SessionSerializer
from sessions_app.models import Session
from sessions_app.overrides import HISTORY_TOKEN_BUDGET_RANGE, OVERRIDE_RULES, Boolean, IntegerRange, OptionalText
from workflows.selectors import workflow_list

KIN_FORM_FIELDS = ("name", "role", "character", "expertise", "model", "history_token_budget")
# A per-kin setting's form field is named "<section>__<key>" ("introspection__max_tool_calls").
OVERRIDE_FIELD_SEPARATOR = "__"
ON, OFF = "on", "off"


def _max_length(model, name: str) -> int:
    return model._meta.get_field(name).max_length


def _add_serializer_errors(form: forms.Form, errors: dict) -> None:
    """The serializer's errors on the form's fields of the same name (the rest above the
    form), skipping fields that already failed to parse: one message per problem."""
    for name, messages in errors.items():
        if name in form.errors:
            continue
        if name == "overrides":
            _add_override_errors(form, messages)
            continue
        target = name if name in form.fields else None
        for message in messages if isinstance(messages, list) else [messages]:
            form.add_error(target, str(message))


def _add_override_errors(form: forms.Form, messages) -> None:
    # sessions_app.overrides names each problem's path: "introspection.max_tool_calls: must be ...".
    for message in messages if isinstance(messages, list) else [messages]:
        path, _, problem = str(message).partition(": ")
        field = path.replace(".", OVERRIDE_FIELD_SEPARATOR)
        if problem and field in form.fields and field not in form.errors:
            form.add_error(field, problem[0].upper() + problem[1:] + ".")
        else:
            form.add_error(None, f"Per-kin settings: {message}")


def _setting_label(key: str) -> str:
    return key.replace("_", " ").capitalize()


def _override_field(section: str, key: str, rule) -> forms.Field:
    """A form field for one per-kin setting, its bounds in its hint; empty: the default.
    (Django does not escape help texts: settings' values are escaped here.)"""
    default = settings.INTROSPECTION.get(key) if section == "introspection" else None
    # "Model" twice on one form would be ambiguous: the kin's own field comes first.
    label = f"{section.capitalize()} {key.replace('_', ' ')}" if key in KIN_FORM_FIELDS else _setting_label(key)
    if isinstance(rule, Boolean):
        shown = "default" if default is None else (ON if default else OFF)
        return forms.ChoiceField(label=label, required=False,
                                 choices=[("", f"Default ({shown})"), (ON, "On"), (OFF, "Off")])
    if isinstance(rule, IntegerRange):
        hint = f"A whole number from {rule.low:,} to {rule.high:,}; empty: the default"
        return forms.IntegerField(
            label=label, required=False, help_text=hint + ("" if default is None else f" ({default})") + ".",
            widget=forms.NumberInput(attrs={"min": rule.low, "max": rule.high}),
        )
    if isinstance(rule, OptionalText):
        # The only optional text is a model name, whose empty default means the kin's own model.
        shown = escape(default or ("the kin's own model" if key == "model" else "none"))
        return forms.CharField(label=label, required=False,
                               help_text=f"At most {rule.max_chars:,} characters; empty: the default ({shown}).",
                               widget=forms.TextInput(attrs={"maxlength": rule.max_chars}))
    raise TypeError(f"no form field for the override rule {rule!r}")  # a new kind of rule needs one here


class KinForm(forms.Form):
    """A kin's identity, model, history budget and per-kin settings (one field per rule of
    OVERRIDE_RULES); other keys of the kin's overrides are kept as they are."""

    name = forms.CharField(max_length=_max_length(Kin, "name"), error_messages={"required": "Give the kin a name."})
    role = forms.CharField(max_length=_max_length(Kin, "role"), required=False,
                           help_text="One line, e.g. “Data assistant”.")
    character = forms.CharField(label="Character and instructions", required=False, max_length=KIN_TEXT_MAX_CHARS,
                                widget=forms.Textarea(attrs={"rows": 5}),
                                help_text="Who the kin is and how it should work; part of every prompt.")
    expertise = forms.CharField(required=False, max_length=KIN_TEXT_MAX_CHARS, widget=forms.Textarea(attrs={"rows": 3}))
    model = forms.CharField(
        max_length=_max_length(Kin, "model"), required=False,
        help_text=f"Empty: the gateway's default model ({escape(settings.LLM_MODEL or 'LLM_MODEL')}).",
    )
    history_token_budget = forms.IntegerField(
        required=False, label="History token budget",
        help_text=(f"Tokens of conversation history in a prompt, {HISTORY_TOKEN_BUDGET_RANGE.low:,} to "
                   f"{HISTORY_TOKEN_BUDGET_RANGE.high:,}; empty: the default ({settings.HISTORY_TOKEN_BUDGET:,})."),
        widget=forms.NumberInput(attrs={"min": HISTORY_TOKEN_BUDGET_RANGE.low,
                                        "max": HISTORY_TOKEN_BUDGET_RANGE.high}),
    )

    def __init__(self, *args, team: Team, instance: Kin | None = None, **kwargs):
        if instance is not None and "initial" not in kwargs:
            kwargs["initial"] = self.initial_for(instance)
        super().__init__(*args, **kwargs)
        self.team = team
        self.instance = instance
        self.validated: dict = {}
        for section, rules in OVERRIDE_RULES.items():
            for key, rule in rules.items():
                self.fields[f"{section}{OVERRIDE_FIELD_SEPARATOR}{key}"] = _override_field(section, key, rule)

    @staticmethod
    def initial_for(kin: Kin) -> dict:
        initial = {name: getattr(kin, name) for name in KIN_FORM_FIELDS}
        overrides = kin.overrides if isinstance(kin.overrides, dict) else {}
        for section in OVERRIDE_RULES:
            values = overrides.get(section)
            for key, value in (values.items() if isinstance(values, dict) else []):
                initial[f"{section}{OVERRIDE_FIELD_SEPARATOR}{key}"] = (
                    (ON if value else OFF) if isinstance(value, bool) else value
                )
        return initial

    def override_fields(self):
        """The per-kin settings' bound fields, for the template's fieldset."""
        return [self[name] for name in self.fields if OVERRIDE_FIELD_SEPARATOR in name]

    def identity_fields(self):
        return [self[name] for name in KIN_FORM_FIELDS]

    def _overrides(self, cleaned: dict) -> dict:
        current = self.instance.overrides if self.instance is not None else {}
        overrides = dict(current) if isinstance(current, dict) else {}
        for section, rules in OVERRIDE_RULES.items():
            values = overrides.get(section)
            values = dict(values) if isinstance(values, dict) else {}
            for key in rules:
                value = cleaned.get(f"{section}{OVERRIDE_FIELD_SEPARATOR}{key}")
                if value in (None, ""):
                    values.pop(key, None)  # empty: the default
                else:
                    values[key] = {ON: True, OFF: False}.get(value, value) if isinstance(rules[key], Boolean) else value
            if values:
                overrides[section] = values
            else:
                overrides.pop(section, None)
        return overrides

    def clean(self):
        cleaned = super().clean()
        data = {name: cleaned[name] for name in KIN_FORM_FIELDS if name in cleaned}
        data["overrides"] = self._overrides(cleaned)
        serializer = KinSerializer(self.instance, data=data, team=self.team, partial=self.instance is not None)
        if serializer.is_valid():
            self.validated = dict(serializer.validated_data)
        else:
            _add_serializer_errors(self, serializer.errors)
        return cleaned


class SessionCreateForm(forms.Form):
    title = forms.CharField(max_length=_max_length(Session, "title"), required=False,
                            help_text="Optional; shown in the kin's session list.")
    workflow = forms.ModelChoiceField(
        queryset=None, required=False, empty_label="No workflow",
        help_text="Optional: each turn's prompt then carries the workflow's current canvas.",
    )

    def __init__(self, *args, team: Team, **kwargs):
        super().__init__(*args, **kwargs)
        self.team = team
        self.validated: dict = {}
        # The team's workflows only: another team's id is "not one of the available choices".
        self.fields["workflow"].queryset = workflow_list(team=team).order_by("name", "id")

    def clean(self):
        cleaned = super().clean()
        if "workflow" not in cleaned:
            return cleaned
        workflow = cleaned["workflow"]
        data = {"title": cleaned.get("title", ""), "workflow": workflow.pk if workflow is not None else None}
        serializer = SessionSerializer(data=data, team=self.team)
        if serializer.is_valid():
            self.validated = dict(serializer.validated_data)
        else:
            _add_serializer_errors(self, serializer.errors)
        return cleaned


class SessionRenameForm(forms.Form):
    title = forms.CharField(max_length=_max_length(Session, "title"), required=False)

    def __init__(self, *args, session: Session, **kwargs):
        kwargs.setdefault("initial", {"title": session.title})
        super().__init__(*args, **kwargs)
        # Help texts are not escaped: only the (integer) id goes in.
        self.fields["title"].help_text = f"Empty: the session is shown as “Session {int(session.pk)}”."
        self.session = session
        self.validated: dict = {}

    def clean(self):
        cleaned = super().clean()
        if "title" not in cleaned:
            return cleaned
        serializer = SessionSerializer(self.session, data={"title": cleaned["title"]}, partial=True)
        if serializer.is_valid():
            self.validated = {"title": serializer.validated_data.get("title", "")}
        else:
            _add_serializer_errors(self, serializer.errors)
        return cleaned
