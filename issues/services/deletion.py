"""Deleting rows that other rows may still hold (PROTECT and RESTRICT foreign keys): one answer for
every service that deletes, so a held deletion is a 409 naming what holds it and changes nothing."""
from contextlib import contextmanager

from django.db import transaction
from django.db.models import ProtectedError, RestrictedError

from issues.exceptions import Conflict


def holders(exc: ProtectedError | RestrictedError) -> list:
    """The rows that refused the deletion."""
    return list(exc.protected_objects if isinstance(exc, ProtectedError) else exc.restricted_objects)


@contextmanager
def unless_held(message: str, code: str, *, key: str = "referencedBy", **details):
    """Run the deletions in the block in a savepoint; if a reference holds one, nothing of the block
    is kept and the caller gets a 409 ``code`` whose ``details[key]`` names the kinds holding it."""
    try:
        with transaction.atomic():
            yield
    except (ProtectedError, RestrictedError) as exc:
        kinds = sorted({obj._meta.verbose_name for obj in holders(exc)})
        raise Conflict(message, code=code, details={**details, key: kinds}) from None
