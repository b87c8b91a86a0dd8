"""Nudge the dispatcher after a commit. Without a broker the in-process worker polls instead,
so a kick is never needed for correctness (the periodic sweep picks up anything missed)."""
import atexit

from django.conf import settings
from django.db import transaction

from paperclip.core.kicker import Kicker


def _send_dispatch(keys):
    from issues import tasks

    tasks.dispatch_runs.delay()  # one pass starts every queued run: the kicks waiting together need one


_DISPATCH = "dispatch"
dispatch_kicker = Kicker(_send_dispatch, batch=1, name="dispatch-kicks",
                         linger=float(settings.PAPERCLIP.get("DISPATCH_KICK_LINGER_MS", 10.0)) / 1000)
atexit.register(dispatch_kicker.flush, 2.0)  # best effort: the worker's poll and the sweep cover the rest


def kick_dispatcher():
    if settings.PAPERCLIP.get("KICK_ON_COMMIT"):
        transaction.on_commit(lambda: dispatch_kicker.put(_DISPATCH))
