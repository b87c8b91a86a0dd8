"""Rows built once per test module and shared by its tests, as Django's ``TestCase.setUpTestData``.

The rows are written inside an outer transaction that stays open while the module's tests run and
is rolled back when they end. Each test runs in its own savepoint inside it (pytest-django's ``db``
fixture nests its atomic blocks), so what one test writes never reaches the next; each test takes
a deep copy of the built objects, so neither do changes made to them in memory.

Only for modules of ``db`` tests on the default database: a ``transactional_db`` test, another
connection or a thread would not see rows that were never committed.
"""
from contextlib import contextmanager
from copy import deepcopy

from django.core.cache import cache
from django.db import transaction


@contextmanager
def rows_for_module(django_db_blocker, build):
    """Yield what ``build()`` returns, its rows written in a transaction rolled back at the end."""
    with django_db_blocker.unblock(), transaction.atomic():
        try:
            yield build()
        finally:
            transaction.set_rollback(True)


def fresh_copy(built):
    """The module's objects for one test: a deep copy, with the process cache cleared (entries one
    test cached against the shared rows must not answer the next)."""
    cache.clear()
    return deepcopy(built)
