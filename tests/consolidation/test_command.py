"""python manage.py consolidate (SPEC §8): --prepare prints the prompt without a model;
--llm "COMMAND" uses a shell command as the model; the outcome and a non-zero exit."""
import shlex
import sys
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from consolidation.models import ConsolidationRun
from consolidation.selectors import experience_current, facts_pending
from kinsite.models import LLMCall
from tests.consolidation.conftest import add_fact, answer, document, runs_of, state_of


def consolidate(*args):
    out, err = StringIO(), StringIO()
    call_command("consolidate", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def test_prepare_prints_the_rendered_prompt_and_calls_no_model(kin, model):
    fact = add_fact(kin, "Maria wants bullet points.", "preference")
    before = state_of(kin)

    out, err = consolidate("--kin", str(kin.pk), "--prepare", "--max-words", "400")

    run = ConsolidationRun.objects.get()
    assert run.status == "prepared" and run.trigger == "command"
    assert out.strip() == run.rendered_prompt.strip()
    assert f"[id {fact.pk}] (preference, " in out and "At most 400 words" in out
    assert "no model was called" in err
    assert model.calls == [] and not LLMCall.objects.exists() and state_of(kin) == before


def test_a_template_file_is_the_explicit_template(kin, model, tmp_path):
    path = tmp_path / "template.txt"
    path.write_text("Consolidate for {kin_name}:\n{pending_facts}\n", encoding="utf-8")
    add_fact(kin, "A fact.")
    out, _ = consolidate("--kin", str(kin.pk), "--prepare", "--template", str(path))
    assert out.startswith(f"Consolidate for {kin.name}:\n- [id ")
    assert ConsolidationRun.objects.get().template_source == "explicit"


def test_an_invalid_template_file_is_refused_with_its_errors(kin, model, tmp_path):
    path = tmp_path / "template.txt"
    path.write_text("{max_words.__class__} and {nope}", encoding="utf-8")
    with pytest.raises(CommandError) as refused:
        consolidate("--kin", str(kin.pk), "--template", str(path))
    assert "reaches into an attribute" in str(refused.value) and "{nope}" in str(refused.value)
    assert runs_of(kin) == [] and model.calls == []


def test_llm_command_answers_and_the_run_applies(kin, tmp_path):
    fact = add_fact(kin, "Never deploy on Fridays.", "decision")
    markdown = document([], ["Never deploy on Fridays."])
    path = tmp_path / "answer.json"
    path.write_text(answer(markdown, processed=[fact.pk], summary="Added the Friday rule."), encoding="utf-8")

    out, _ = consolidate("--kin", str(kin.pk), "--llm", f"cat {shlex.quote(str(path))}")

    run = ConsolidationRun.objects.get()
    assert run.status == "applied" and f"Run {run.pk}: applied" in out
    assert "Summary: Added the Friday rule." in out and "1 facts processed" in out
    assert experience_current(kin).markdown == markdown and list(facts_pending(kin)) == []
    assert not LLMCall.objects.exists()  # the command was the model


def test_llm_command_reads_the_prompt_on_stdin(kin):
    fact = add_fact(kin, "Use UTC in every report.")
    # Answers only if the prompt it reads names the fact: proves the prompt went to stdin.
    script = (
        "import json, re, sys; prompt = sys.stdin.read(); "
        "ids = [int(i) for i in re.findall(r'\\[id (\\d+)\\]', prompt)]; "
        "doc = '# Master AI Experience\\n## 1. User Directives & Preferences\\n- Use UTC.\\n"
        "## 2. Defensive Safeguards & Heuristics\\n## 3. Project-Specific Constraints\\n"
        "## 4. Anti-Patterns & Critical Gotchas\\n## 5. Mistake Corrections & Fixes\\n'; "
        "print(json.dumps({'updated_experience_markdown': doc, 'processed_pending_ids': ids, "
        "'superseded_fact_ids': [], 'summary_of_changes': 'UTC rule.'}))"
    )
    consolidate("--kin", str(kin.pk), "--llm", f"{shlex.quote(sys.executable)} -c {shlex.quote(script)}")
    run = ConsolidationRun.objects.get()
    assert run.status == "applied" and run.processed_fact_ids == [fact.pk]


def test_a_rejected_answer_prints_the_reasons_and_exits_non_zero(kin):
    add_fact(kin, "A fact.")
    before = state_of(kin)
    with pytest.raises(CommandError) as failed:
        consolidate("--kin", str(kin.pk), "--llm", "echo '{\"not\": \"it\"}'")
    run = ConsolidationRun.objects.get()
    assert run.status == "rejected" and len(run.raw_answers) == 2
    assert f"Consolidation run {run.pk} rejected" in str(failed.value)
    assert state_of(kin) == before


def test_a_failing_llm_command_is_a_failed_run(kin):
    add_fact(kin, "A fact.")
    with pytest.raises(CommandError):
        consolidate("--kin", str(kin.pk), "--llm", "echo broken >&2; exit 3")
    run = ConsolidationRun.objects.get()
    assert run.status == "failed" and "exited with status 3: broken" in run.error


def test_a_slow_llm_command_times_out(kin, settings):
    settings.CONSOLIDATION_LLM_COMMAND_TIMEOUT_SECONDS = 1
    add_fact(kin, "A fact.")
    with pytest.raises(CommandError):
        consolidate("--kin", str(kin.pk), "--llm", "sleep 30; echo late")
    assert "did not answer within 1 s" in ConsolidationRun.objects.get().error


def test_an_unknown_kin_is_an_error(db):
    with pytest.raises(CommandError, match="No kin with id 999999"):
        consolidate("--kin", "999999", "--prepare")


def test_nothing_to_consolidate_is_said_and_is_not_an_error(kin, model):
    out, _ = consolidate("--kin", str(kin.pk))

    assert out.strip() == f"Nothing to consolidate: {kin.name} has no pending facts."
    assert runs_of(kin) == [] and model.calls == []
