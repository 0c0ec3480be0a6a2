"""Prompt templates of the background jobs: validation, safe rendering and resolution
(explicit → kin → team → built-in default); the syntax is in docs/concepts/prompt-templates.md.

Templates are admin-edited text, so they never reach str.format, which would let
`{max_words.__class__}` or `{x[0]}` reach into the values: the body is parsed into literal
text and plain named placeholders, and rendering pastes each value's text in."""
import difflib
import re
import string
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from django.db import transaction
from django.db.models import Q

from kinsite.errors import InvalidInput
from kinsite.models import Kin, PromptTemplate
from kinsite.prompt_template_kinds import _kind, template_default, template_sample_values
from kinsite.tokencount import count_tokens

Kind = PromptTemplate.Kind


class TemplateError(InvalidInput):
    """A template that does not validate, or values that do not fill it; `errors` (also in
    details["errors"]) lists each problem with where it is."""

    code = "invalid_template"

    def __init__(self, message: str, *, errors: list[str]):
        super().__init__(message, details={"errors": errors})
        self.errors = errors


# --- validation ----------------------------------------------------------------------------

LITERAL_BRACES = "write {{ and }} for literal braces"


def _where(body: str, position: int) -> str:
    line = body.count("\n", 0, position) + 1
    column = position - (body.rfind("\n", 0, position) + 1) + 1
    return f"line {line}, column {column}"


def _field_end(body: str, start: int) -> int:
    """The index just past the field opening at `start` (its matching '}')."""
    depth = 0
    for index in range(start, len(body)):
        if body[index] == "{":
            depth += 1
        elif body[index] == "}":
            depth -= 1
            if depth == 0:
                return index + 1
    return len(body)


def _stray_brace(body: str, start: int) -> str:
    """Describe the first unbalanced brace at or after `start` (the parser stopped there)."""
    index = start
    while index < len(body):
        pair = body[index : index + 2]
        if pair in ("{{", "}}"):
            index += 2
            continue
        if body[index] == "}":
            return f"{_where(body, index)}: '}}' without a matching '{{'; {LITERAL_BRACES}"
        if body[index] == "{":
            end = _field_end(body, index)
            shown = body[index:end] if end - index <= 40 else body[index : index + 40] + "…"
            return (
                f"{_where(body, index)}: '{{' is not closed as a placeholder ({shown!r}); "
                f"a placeholder is a name in braces, like {{kin_name}}; {LITERAL_BRACES}"
            )
        index += 1
    return f"unbalanced braces; {LITERAL_BRACES}"


def _check_field(kind: str, allowed: dict[str, str], field: str, spec: str, conversion: str | None) -> str | None:
    raw = "{" + field + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
    if field == "" or field.isdigit():
        return f"positional placeholder {raw} is not allowed: use a name, e.g. {{{next(iter(allowed))}}}"
    name = re.split(r"[.\[]", field, maxsplit=1)[0]
    if name != field and name.isidentifier():
        return f"{raw} reaches into an attribute or item; placeholders are plain names like {{{name}}}"
    if not field.isidentifier():
        return f"{raw} is not a placeholder (a name in braces, like {{kin_name}}); {LITERAL_BRACES}"
    if conversion is not None:
        return f"{raw} has a conversion (!{conversion}); placeholders are plain names like {{{field}}}"
    if spec:
        return f"{raw} has a format spec (:{spec}); placeholders are plain names like {{{field}}}"
    if field not in allowed:
        close = difflib.get_close_matches(field, allowed, n=1)
        hint = f" (did you mean {{{close[0]}}}?)" if close else ""
        names = ", ".join("{" + name + "}" for name in allowed)
        article = "an" if kind.startswith(("a", "e", "i", "o", "u")) else "a"
        return f"unknown placeholder {raw}{hint}; {article} {kind} template may use {names}"
    return None


def _parse_format_string(kind: str, body: str) -> tuple[list[tuple[str, str | None]], list[str]]:
    """The template as (literal text, placeholder name or None) pieces, and its errors,
    by Python's format-string rules."""
    allowed = _kind(kind).placeholders
    pieces: list[tuple[str, str | None]] = []
    errors: list[str] = []
    if not body.strip():
        return pieces, ["The template is empty."]
    offset = 0  # where the parser is in `body`: the literal pieces come back unescaped
    try:
        for literal, field, spec, conversion in string.Formatter().parse(body):
            offset += len(literal) + literal.count("{") + literal.count("}")
            if field is None:
                pieces.append((literal, None))
                continue
            start, offset = offset, _field_end(body, offset)
            problem = _check_field(kind, allowed, field, spec, conversion)
            if problem:
                errors.append(f"{_where(body, start)}: {problem}")
            pieces.append((literal, field))
    except ValueError:
        errors.append(_stray_brace(body, offset))
    return pieces, errors


# What the author meant as a placeholder: a name or number with nothing or attribute,
# index, conversion or spec syntax after it (one nested {...} for a spec like {x:{y}}),
# and no spaces inside but around it: "{max_words}", "{x.a}", "{x[0]}", "{x!r}", "{x:>10}",
# "{0}", "{ max_words }". A JSON object never matches: its first key is quoted.
_FIELD_LIKE = re.compile(r"\{(\s*\w*(?:[.\[!:](?:[^\s{}]|\{[^\s{}]*\})*)?\s*)\}")
_TAG_LIKE = re.compile(r"\{%[^\n]*?%\}")  # Django/Jinja tags: refused rather than shown literally
_OPEN_NAME = re.compile(r"\{\s*(\w+)")


def _parse_literal_braces(kind: str, body: str) -> tuple[list[tuple[str, str | None]], list[str]]:
    """The template as (literal text, placeholder name or None) pieces, and its errors,
    where braces that do not form a placeholder are literal (a JSON example in a
    consolidation template). Anything placeholder-like that is not a known plain name is an
    error, since a typo would otherwise reach the model silently. Outside literal braces `{{`
    and `}}` still mean one brace; inside, every brace is itself, so the `}}` closing a
    nested JSON object stays two."""
    allowed = _kind(kind).placeholders
    pieces: list[tuple[str, str | None]] = []
    errors: list[str] = []
    if not body.strip():
        return pieces, ["The template is empty."]
    literal: list[str] = []
    depth = 0  # how many literal '{' are open
    index = 0
    while index < len(body):
        char = body[index]
        if char == "{":
            field = _FIELD_LIKE.match(body, index)
            if field and field.group(1).strip():
                problem = _check_literal_brace_field(kind, allowed, field.group(1))
                if problem:
                    errors.append(f"{_where(body, index)}: {problem}")
                pieces.append(("".join(literal), field.group(1)))
                literal = []
                index = field.end()
                continue
            tag = _TAG_LIKE.match(body, index)
            if tag:
                errors.append(f"{_where(body, index)}: {tag.group()} is not a placeholder: template tags are not "
                              f"supported; a placeholder is a name in braces, like {{{next(iter(allowed))}}}")
                literal.append(tag.group())
                index = tag.end()
                continue
            opened = _OPEN_NAME.match(body, index)
            if opened and opened.group(1) in allowed:
                end = _field_end(body, index)
                shown = body[index:end] if end - index <= 40 else body[index : index + 40] + "…"
                errors.append(f"{_where(body, index)}: '{{' is not closed as a placeholder ({shown!r}); "
                              f"a placeholder is a name in braces, like {{{opened.group(1)}}}")
            if depth == 0 and body.startswith("{{", index):
                literal.append("{")
                index += 2
                continue
            depth += 1
        elif char == "}":
            if depth == 0 and body.startswith("}}", index):
                literal.append("}")
                index += 2
                continue
            depth = max(depth - 1, 0)
        literal.append(char)
        index += 1
    pieces.append(("".join(literal), None))
    return pieces, errors


def _check_literal_brace_field(kind: str, allowed: dict[str, str], inner: str) -> str | None:
    if inner != inner.strip():
        return (f"{{{inner}}} is not a placeholder: no spaces inside the braces, like {{{inner.strip()}}} "
                f"(or {LITERAL_BRACES})")
    try:
        [(_, field, spec, conversion)] = string.Formatter().parse("{" + inner + "}")
    except ValueError:
        return f"{{{inner}}} is not a placeholder (a name in braces, like {{kin_name}}); {LITERAL_BRACES}"
    return _check_field(kind, allowed, field, spec, conversion)


def _parse(kind: str, body: str) -> tuple[list[tuple[str, str | None]], list[str]]:
    """The template as (literal text, placeholder name or None) pieces, and its errors."""
    if _kind(kind).literal_braces:
        return _parse_literal_braces(kind, body)
    return _parse_format_string(kind, body)


def template_validate(kind: str, body: str) -> list[str]:
    """Every problem of `body` as a template of `kind`, each saying what and where; [] when valid."""
    return _parse(kind, body)[1]


def template_fields(kind: str, body: str) -> set[str]:
    """The placeholder names `body` uses (a caller may supply what a template leaves out)."""
    return {field for _, field in _parse(kind, body)[0] if field is not None}


# --- rendering -----------------------------------------------------------------------------


def template_render(kind: str, body: str, values: dict[str, str | int]) -> str:
    """`body` with each placeholder replaced by the text of its value (str or int, pasted in,
    never formatted or looked into). TemplateError when the body does not validate or a
    placeholder has no value."""
    pieces, errors = _parse(kind, body)
    if errors:
        raise TemplateError(f"The {kind} template is invalid: {errors[0]}", errors=errors)
    missing = sorted({field for _, field in pieces if field is not None and field not in values})
    if missing:
        names = ", ".join("{" + name + "}" for name in missing)
        raise TemplateError(f"No value for {names} in the {kind} template.", errors=[f"missing value for {names}"])
    out: list[str] = []
    for literal, field in pieces:
        out.append(literal)
        if field is not None:
            out.append(_text(field, values[field]))
    return "".join(out)


def _text(field: str, value: str | int) -> str:
    if isinstance(value, str):
        return str.__str__(value)  # a str subclass's own __str__ is not called
    if isinstance(value, int) and not isinstance(value, bool):
        return int.__repr__(value)
    raise TypeError(f"The value for {{{field}}} must be str or int, not {type(value).__name__}.")


def template_preview(kind: str, body: str) -> str:
    """`body` rendered with the sample values of its kind: what an admin checks before saving."""
    return template_render(kind, body, template_sample_values(kind))


# --- resolution ----------------------------------------------------------------------------

Source = Literal["explicit", "kin", "team", "default"]


@dataclass(frozen=True)
class ResolvedTemplate:
    body: str
    source: Source
    template_id: int | None = None


def template_resolve(*, kind: str, kin: Kin, explicit_body: str | None = None) -> ResolvedTemplate:
    """The template a job for `kin` uses: `explicit_body` (an API or command argument) → the
    kin's active template → its team's → the built-in default, in one query. Not validated
    here; template_render does that."""
    _kind(kind)
    if explicit_body is not None:
        return ResolvedTemplate(body=explicit_body, source="explicit")
    candidates = PromptTemplate.objects.filter(
        Q(kin_id=kin.pk) | Q(kin__isnull=True), team_id=kin.team_id, kind=kind, is_active=True
    ).values_list("pk", "kin_id", "body")
    by_scope = {("kin" if kin_id is not None else "team"): (pk, body) for pk, kin_id, body in candidates}
    for source in ("kin", "team"):
        if source in by_scope:
            pk, body = by_scope[source]
            return ResolvedTemplate(body=body, source=source, template_id=pk)
    return ResolvedTemplate(body=template_default(kind), source="default")


# --- writes --------------------------------------------------------------------------------
# Here rather than in kinsite/services.py: the only write, for the admin's actions.


@transaction.atomic
def prompt_template_set_active(*, template: PromptTemplate, active: bool) -> None:
    """Activate `template` (deactivating the one it replaces in the same team/kin/kind
    scope, so at most one is active) or deactivate it."""
    if active:
        PromptTemplate.objects.filter(
            team_id=template.team_id, kin_id=template.kin_id, kind=template.kind, is_active=True
        ).exclude(pk=template.pk).update(is_active=False)
    template.is_active = active
    template.save(update_fields=["is_active", "updated_at"])


# --- previews with a kin's real data ---------------------------------------------------------
# The admin previews a template, saved or not, as its job would send it for a chosen kin.
# The jobs live in apps above kinsite, so each registers its previewer in AppConfig.ready().


@dataclass(frozen=True)
class PreviewMessage:
    role: str
    content: str
    tokens: int


@dataclass(frozen=True)
class TemplatePreview:
    """What a job would send the model: its messages in order, each with its token count,
    and notes on what they were read from."""

    messages: list[PreviewMessage]
    notes: list[str]

    @property
    def total_tokens(self) -> int:
        return sum(message.tokens for message in self.messages)


def template_preview_of(messages: list[dict], notes: list[str]) -> TemplatePreview:
    """A TemplatePreview of chat `messages` ({"role", "content"}), their tokens counted."""
    return TemplatePreview(
        messages=[PreviewMessage(role=m["role"], content=m["content"], tokens=count_tokens(m["content"]))
                  for m in messages],
        notes=notes,
    )


@dataclass(frozen=True)
class TemplatePreviewer:
    # render(body=..., kin=..., session_id=...) -> TemplatePreview; writes nothing, calls no
    # model. TemplateError for an invalid body, InvalidInput for a session not the kin's.
    render: Callable[..., TemplatePreview]
    # The kin's sessions, (id, label), most recently active first; None if the job reads none.
    sessions: Callable[[Kin], list[tuple[int, str]]] | None = None


_PREVIEWERS: dict[str, TemplatePreviewer] = {}


def template_previewers_register(previewers: dict[str, TemplatePreviewer]) -> None:
    """Register the previewer of each kind in `previewers` (AppConfig.ready)."""
    for kind in previewers:
        _kind(kind)
    _PREVIEWERS.update(previewers)


def template_previewer(kind: str) -> TemplatePreviewer:
    _kind(kind)
    try:
        return _PREVIEWERS[kind]
    except KeyError:
        raise LookupError(f"No previewer is registered for {kind} templates.") from None
