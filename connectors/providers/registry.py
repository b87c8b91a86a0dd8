"""Importing this module registers every provider adapter (one module per provider)."""
from . import github  # noqa: F401
from . import jira, linear  # noqa: F401
