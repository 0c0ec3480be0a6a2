"""python manage.py reembed_memories [--start]: the re-embedding status for the current
embedding model; with --start, start a run when memories lack a vector of it (with eager
Celery, the embedded mode that has no beat, the run works to its end inside the command)."""
from django.core.management.base import BaseCommand, CommandError

from memories.embeddings import embedding_model_current
from memories.models import EmbeddingRun
from memories.reembed import memories_to_reembed, reembed_run_active, reembed_start


class Command(BaseCommand):
    help = "Show the re-embedding status of memories for the current embedding model, or start a run (--start)."

    def add_arguments(self, parser):
        parser.add_argument("--start", action="store_true",
                            help="start a run now if memories lack a vector of the current model "
                                 "(beat's check does so every 5 minutes, but waits 30 after a failed run)")

    def handle(self, *args, start, **options):
        model = embedding_model_current()
        if not model:
            raise CommandError("Embeddings are off (EMBEDDINGS=off, or EMBEDDINGS=endpoint without "
                               "LLM_EMBEDDING_MODEL): nothing to re-embed.")
        missing = memories_to_reembed(model).count()
        if start and missing and reembed_run_active(model) is None:
            run = reembed_start(model=model)
            self.stdout.write(f"Started run {run.pk}.")
            missing = memories_to_reembed(model).count()
        self.stdout.write(f"Embedding model: {model}")
        self.stdout.write(f"Active memories without a vector of it: {missing}")
        run = EmbeddingRun.objects.filter(model=model).first()
        if run is None:
            self.stdout.write("No re-embedding run for this model yet.")
            return
        self.stdout.write(f"Latest run {run.pk}: {run.status}, {min(run.done, run.total)} of {run.total}"
                          + (f", error: {run.error}" if run.error else ""))
