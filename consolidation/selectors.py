"""Reads of the fact ledger, the experience document and consolidation runs."""
from __future__ import annotations

import re

from django.db.models import Q, QuerySet

from consolidation.models import ConsolidationRun, ExperienceVersion, Fact
from kinsite.errors import NotFound
from kinsite.models import Kin, Team

PENDING = Q(status=Fact.Status.ACTIVE, is_consolidated=False)


# --- facts -----------------------------------------------------------------------------------


def facts_pending(kin: Kin) -> QuerySet[Fact]:
    """The kin's pending facts (active, not consolidated), oldest first (the partial index fact_pending)."""
    return Fact.objects.filter(PENDING, kin=kin).order_by("created_at", "id")


def fact_list(*, team: Team, kin: Kin | None, status: str | None = None, pending: bool | None = None) -> QuerySet[Fact]:
    """The ledger of `kin` (None: every kin of `team`), newest first, always scoped to `team`.
    `status` filters on active/superseded; `pending` True keeps only pending facts
    (active, not consolidated), False only the others."""
    facts = Fact.objects.filter(kin__team=team)
    if kin is not None:
        facts = facts.filter(kin=kin)
    if status:
        facts = facts.filter(status=status)
    if pending is True:
        facts = facts.filter(PENDING)
    elif pending is False:
        facts = facts.exclude(PENDING)
    return facts.order_by("-created_at", "-id")


# --- the experience document -----------------------------------------------------------------


def experience_current(kin: Kin) -> ExperienceVersion | None:
    """The kin's newest experience version (None before its first consolidation)."""
    return ExperienceVersion.objects.filter(kin=kin).order_by("-version").first()


def experience_get(kin: Kin, version: int | None = None) -> ExperienceVersion:
    """Version `version` of the kin's experience document (None: the current one).
    Raises NotFound (404) when there is no such version."""
    found = experience_current(kin) if version is None else ExperienceVersion.objects.filter(
        kin=kin, version=version
    ).first()
    if found is None:
        what = "experience document yet" if version is None else f"experience version {version}"
        raise NotFound(f"Kin {kin.pk} has no {what}.", details={"kin": kin.pk, "version": version})
    return found


def experience_versions(kin: Kin) -> QuerySet[ExperienceVersion]:
    """Every version of the kin's document, newest first."""
    return ExperienceVersion.objects.filter(kin=kin).order_by("-version")


def experience_markdown_sql(kin_id_sql: str) -> str:
    """SQL for the current experience markdown of the kin whose id is the SQL expression
    `kin_id_sql` (NULL without a document): a scalar subquery the prompt builder puts
    in its session statement, so reading the document costs no query of its own."""
    table = ExperienceVersion._meta.db_table
    return f"(SELECT x.markdown FROM {table} x WHERE x.kin_id = {kin_id_sql} ORDER BY x.version DESC LIMIT 1)"


_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")
_NUMBERING = re.compile(r"^\d+[.)]\s*")


def _normalise(heading: str) -> str:
    return " ".join(heading.split()).casefold()


def experience_section(markdown: str, number_or_heading: int | str) -> str | None:
    """One section of an experience document, its heading line included; None when absent:

    - 0, "0" or "title": the `# ` heading line and what follows up to the first `## `;
    - N ≥ 1 (or "N"): the Nth `## ` section by position, up to the next `## ` or `# `
      heading (its `###` subsections included);
    - other text: the `## ` section whose heading matches it, ignoring case, extra spaces
      and a leading number ("Project-Specific Constraints" finds "## 3. Project-Specific
      Constraints"). Heading-like lines inside fenced code blocks are not headings."""
    if isinstance(number_or_heading, str) and number_or_heading.strip().isdigit():
        number_or_heading = int(number_or_heading.strip())
    if isinstance(number_or_heading, str) and number_or_heading.strip().casefold() == "title":
        number_or_heading = 0

    lines = markdown.splitlines()
    # (start line, level, heading text) of each level-1 and level-2 heading.
    headings: list[tuple[int, int, str]] = []
    in_fence = False
    for index, line in enumerate(lines):
        if _FENCE.match(line):
            in_fence = not in_fence
            continue
        match = None if in_fence else _HEADING.match(line)
        if match and len(match.group(1)) <= 2:
            headings.append((index, len(match.group(1)), match.group(2)))

    def span(position: int) -> str:
        start = headings[position][0]
        end = headings[position + 1][0] if position + 1 < len(headings) else len(lines)
        return "\n".join(lines[start:end]).strip()

    if number_or_heading == 0:
        for position, (_, level, _) in enumerate(headings):
            if level == 1:
                return span(position)
        return None
    if isinstance(number_or_heading, int):
        if number_or_heading < 0:
            return None
        seconds = [position for position, (_, level, _) in enumerate(headings) if level == 2]
        return span(seconds[number_or_heading - 1]) if number_or_heading <= len(seconds) else None
    wanted = _normalise(_NUMBERING.sub("", number_or_heading.strip().lstrip("#").strip()))
    for position, (_, level, text) in enumerate(headings):
        if level == 2 and wanted and wanted in (_normalise(text), _normalise(_NUMBERING.sub("", text))):
            return span(position)
    return None


def experience_nested(markdown: str, levels: int = 2) -> str:
    """The document with every heading `levels` deeper (at most ######), for the prompt: the
    system prompt's own sections are `## ` headings, so the document's must sit below its
    Experience section instead of looking like sections of the prompt. Fences are left alone."""
    out, in_fence = [], False
    for line in markdown.splitlines():
        if _FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and _HEADING.match(line):
            hashes = len(line) - len(line.lstrip("#"))
            line = "#" * min(hashes + levels, 6) + line[hashes:]
        out.append(line)
    return "\n".join(out).strip()


# --- runs ------------------------------------------------------------------------------------


def consolidation_runs(kin: Kin) -> QuerySet[ConsolidationRun]:
    """The kin's consolidation runs, newest first (the audit trail)."""
    return ConsolidationRun.objects.filter(kin=kin).order_by("-created_at", "-id")
