"""python manage.py vector_index [--enable] [--build]: the vector search mode ("pgvector" or
"exact") and, with pgvector, the state of the HNSW index for the current embedding model's
vector size (ready, building, failed, missing). --enable adds the pgvector column where the
extension can be created (e.g. after installing pgvector on a database migrated without it);
--build builds the index now, waiting for it (minutes on a large table; beat's task does the
same every 15 minutes once re-embedding is done)."""
from django.core.management.base import BaseCommand, CommandError

from memories import vectorindex
from memories.embeddings import embedding_model_current
from memories.reembed import reembed_run_active


class Command(BaseCommand):
    help = "Show the vector search mode and its HNSW index; enable pgvector (--enable) or build the index (--build)."

    def add_arguments(self, parser):
        parser.add_argument("--enable", action="store_true",
                            help="create the pgvector extension if the database allows it, and the vector column")
        parser.add_argument("--build", action="store_true",
                            help="build the HNSW index for the current model's vectors now (CONCURRENTLY)")

    def handle(self, *args, enable, build, **options):
        model = embedding_model_current()
        if enable and not vectorindex.pgvector_enable():
            raise CommandError("pgvector is not available on this database: vector search stays exact.")
        if build:
            self._build(model)
        report = vectorindex.vector_index_report(model)
        self.stdout.write(f"Vector search mode: {report['mode']}")
        if report["mode"] != vectorindex.MODE_PGVECTOR:
            return
        index = report["index"]
        if index is None:
            self.stdout.write(f"No vectors of the current embedding model ({model or 'none'}) yet: no index to build.")
            return
        rows = f", {index['rows']} rows" if index["state"] == vectorindex.READY else ""
        self.stdout.write(f"HNSW index {index['name']} ({index['dims']} dimensions, model {model}): "
                          f"{index['state']}{rows}")

    def _build(self, model: str) -> None:
        if vectorindex.vector_mode() != vectorindex.MODE_PGVECTOR:
            raise CommandError("The vector search mode is exact (no pgvector column): nothing to build. "
                               "Try --enable once pgvector is installed.")
        dims = vectorindex.current_model_dims(model)
        if dims is None:
            raise CommandError(f"No vectors of the current embedding model ({model or 'none'}) yet: "
                               "nothing to index.")
        if reembed_run_active(model) is not None:
            self.stdout.write("Note: a re-embedding run is still going; its later vectors join the index as written.")
        self.stdout.write(f"Building {vectorindex.hnsw_index_name(dims)}...")
        outcome = vectorindex.hnsw_index_build(dims)
        if outcome == "busy":
            raise CommandError("Another connection is building an HNSW index right now; try again later.")
        self.stdout.write({"built": "Built.", "ready": "It was ready already."}[outcome])
