"""Importing this module registers every provider adapter (one module per provider)."""
from . import github  # noqa: F401
from . import jira, linear  # noqa: F401
from . import trello  # noqa: F401
from . import asana  # noqa: F401
from . import notion  # noqa: F401
