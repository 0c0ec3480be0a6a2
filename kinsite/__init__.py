"""Kinsite project package: settings, URLs, Celery and the cross-cutting pieces."""
from kinsite.celery import app as celery_app

__all__ = ["celery_app"]
