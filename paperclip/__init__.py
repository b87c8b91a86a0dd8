from .core.hardening import deny_environ_readers

# First, in every process that loads the project (web, gunicorn's master, manage.py, workers, Celery):
# agent processes and hooks run as this user and must not read this process's environment.
deny_environ_readers()

from .celery import app as celery_app  # noqa: E402

__all__ = ("celery_app",)
