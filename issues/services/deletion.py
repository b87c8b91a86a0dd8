"""Deleting rows that other rows may still hold (PROTECT and RESTRICT foreign keys): one answer for
every service that deletes, so a held deletion is a 409 naming what holds it and changes nothing."""
from contextlib import contextmanager

from django.db import transaction
from django.db.models import ProtectedError, RestrictedError

from issues.exceptions import Conflict


def _kind(obj) -> str:
    return obj._meta.verbose_name


@contextmanager
def unless_held(message: str, code: str, *, detail: str = "referencedBy", name=_kind, **details):
    """Run the deletions in the block in a savepoint; if a reference holds one, nothing of the block
    is kept and the caller gets a 409 ``code`` whose ``details[detail]`` names what holds it: each
    holding row by ``name`` (its kind by default; e.g. its id where the caller can act on it)."""
    try:
        with transaction.atomic():
            yield
    except (ProtectedError, RestrictedError) as exc:
        rows = exc.protected_objects if isinstance(exc, ProtectedError) else exc.restricted_objects
        raise Conflict(message, code=code, details={**details, detail: sorted({name(obj) for obj in rows})}) from None
