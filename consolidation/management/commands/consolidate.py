"""python manage.py consolidate --kin ID [--template PATH] [--max-words N] [--prepare] [--llm "COMMAND"]"""
import contextlib
import os
import signal
import subprocess
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from consolidation.models import ConsolidationRun
from consolidation.services import NothingToConsolidate, consolidation_run
from kinsite.errors import KinsiteError
from kinsite.models import Kin
from kinsite.prompt_templates import TemplateError

STDERR_SHOWN_CHARS = 500


class CommandLLMError(RuntimeError):
    """The --llm command failed (non-zero exit, timeout, or it could not start)."""


def shell_answerer(command: str, timeout: float):
    """An answerer for consolidation_run(llm=...): runs `command` in a shell with the prompt
    on stdin and takes its stdout as the answer. This provider exists on the command line
    only: whoever types the command already runs commands on this machine."""

    def answer(prompt: str) -> str:
        try:
            # Its own process group, so a timeout stops everything the shell started, not only the shell.
            process = subprocess.Popen(command, shell=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True, start_new_session=True)
        except OSError as exc:
            raise CommandLLMError(f"the --llm command could not run: {exc}") from None
        try:
            stdout, stderr = process.communicate(prompt, timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise CommandLLMError(f"the --llm command did not answer within {timeout:g} s") from None
        if process.returncode != 0:
            raise CommandLLMError(f"the --llm command exited with status {process.returncode}: "
                                  f"{stderr.strip()[-STDERR_SHOWN_CHARS:]}")
        return stdout

    return answer


class Command(BaseCommand):
    help = ("Consolidate a kin's pending facts into a new version of its experience document. "
            "--prepare prints the prompt without calling a model; --llm runs a shell command as the model.")

    def add_arguments(self, parser):
        parser.add_argument("--kin", type=int, required=True, help="the kin's id")
        parser.add_argument(
            "--template", help="a file with the consolidation template to use (else kin → team → default)"
        )
        parser.add_argument("--max-words", type=int, help=f"word limit (default {settings.CONSOLIDATION_MAX_WORDS})")
        parser.add_argument("--prepare", action="store_true", help="render and print the prompt; call no model")
        parser.add_argument("--llm", metavar="COMMAND",
                            help="a shell command that reads the prompt on stdin and writes the JSON answer to stdout")

    def handle(self, *args, kin, template, max_words, prepare, llm, **options):
        kin_row = Kin.objects.select_related("team").filter(pk=kin).first()
        if kin_row is None:
            raise CommandError(f"No kin with id {kin}.")
        if max_words is not None and max_words < 1:
            raise CommandError("--max-words must be at least 1.")
        body = None
        if template:
            try:
                body = Path(template).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise CommandError(f"Cannot read the template {template}: {exc}") from exc
        answerer = shell_answerer(llm, settings.CONSOLIDATION_LLM_COMMAND_TIMEOUT_SECONDS) if llm else None
        try:
            run = consolidation_run(kin=kin_row, trigger=ConsolidationRun.Trigger.COMMAND, template_body=body,
                                    max_words=max_words, prepare=prepare, llm=answerer)
        except TemplateError as exc:
            raise CommandError(f"{exc.message}\n" + "\n".join(f"  - {error}" for error in exc.errors)) from exc
        except NothingToConsolidate as exc:
            # Not a failure: the kin is up to date (a script or cron job can go on).
            self.stdout.write(exc.message)
            return
        except KinsiteError as exc:
            raise CommandError(exc.message) from exc

        if run.status == ConsolidationRun.Status.PREPARED:
            self.stdout.write(run.rendered_prompt)
            self.stderr.write(f"Run {run.pk}: prepared (template: {run.template_source}); no model was called.")
            return
        self.stdout.write(f"Run {run.pk}: {run.status}")
        if run.status == ConsolidationRun.Status.APPLIED:
            self.stdout.write(
                f"Experience version {run.experience_version.version}, {run.word_count} words; "
                f"{len(run.processed_fact_ids)} facts processed, {len(run.superseded_fact_ids)} superseded."
            )
            self.stdout.write(f"Summary: {run.summary_of_changes}")
            return
        for error in run.validation_errors:
            self.stdout.write(f"  - {error}")
        if run.error:
            self.stdout.write(f"Error: {run.error}")
        raise CommandError(f"Consolidation run {run.pk} {run.status}; nothing changed.")
