"""Shared pieces of the consolidation tests: the scripted model, facts, valid documents and answers."""
import json

from consolidation.models import ConsolidationRun, ExperienceVersion, Fact
from consolidation.services import fact_record
from memories.models import Memory, MemoryChange

SECTIONS = [
    "# Master AI Experience",
    "## 1. User Directives & Preferences",
    "## 2. Defensive Safeguards & Heuristics",
    "## 3. Project-Specific Constraints",
    "## 4. Anti-Patterns & Critical Gotchas",
    "## 5. Mistake Corrections & Fixes",
]


# model, the scripted fake model every gateway call goes to, is in tests/conftest.py.


def add_fact(kin, statement, category="fact", **extra):
    return fact_record(kin=kin, statement=statement, category=category, source=extra.pop("source", "api"), **extra)


def document(*bullets_per_section, sections=SECTIONS) -> str:
    """A document with the given sections; bullets_per_section[i] are the lines under sections[i+1]."""
    lines = [sections[0]]
    for index, heading in enumerate(sections[1:]):
        lines.append(heading)
        lines.extend(f"- {text}" for text in (bullets_per_section[index] if index < len(bullets_per_section) else ()))
    return "\n".join(lines) + "\n"


def answer(markdown=None, processed=(), superseded=(), summary="Folded in the new facts.", **extra) -> str:
    data = {
        "updated_experience_markdown": markdown if markdown is not None else document(["Maria wants bullet points."]),
        "processed_pending_ids": list(processed),
        "superseded_fact_ids": list(superseded),
        "summary_of_changes": summary,
    }
    data.update(extra)
    return json.dumps(data)


def state_of(kin):
    """Everything a consolidation may change, to compare before and after."""
    return {
        "facts": list(Fact.objects.filter(kin=kin).order_by("pk").values_list(
            "pk", "status", "is_consolidated", "consolidated_by_run", "superseded_by_run")),
        "versions": list(ExperienceVersion.objects.filter(kin=kin).values_list("version", "markdown")),
        "memories": list(Memory.objects.filter(kin=kin).order_by("pk").values_list("pk", "status", "content")),
        "memory_changes": MemoryChange.objects.filter(memory__kin=kin).count(),
    }


def runs_of(kin):
    return list(ConsolidationRun.objects.filter(kin=kin).order_by("pk"))
