"""Nudge the dispatcher after a commit. Without a broker the in-process worker polls instead,
so a kick is never needed for correctness (the periodic sweep picks up anything missed)."""
from django.conf import settings
from django.db import transaction


def kick_dispatcher():
    if settings.PAPERCLIP.get("KICK_ON_COMMIT"):
        from issues import tasks

        transaction.on_commit(lambda: tasks.dispatch_runs.delay())
