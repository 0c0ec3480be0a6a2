"""Kinsite project package: settings, URLs, Celery and the cross-cutting pieces."""
import os

# numpy's BLAS (OpenBLAS) runs on one thread unless the environment says otherwise: the local
# embedder's small products ran several times slower, not faster, with a thread per core on a
# busy machine (docs/configuration.md). OpenBLAS reads it when numpy is first imported.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from kinsite.celery import app as celery_app  # noqa: E402

__all__ = ["celery_app"]
