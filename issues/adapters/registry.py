from __future__ import annotations

from issues.choices import AdapterType

from .base import Adapter, AdapterConfigError
from .http import HttpAdapter
from .none import NoneAdapter
from .process import ProcessAdapter
from .prp import PrpAdapter
from .runner import RunnerAdapter

ADAPTERS: dict[str, type[Adapter]] = {
    AdapterType.PROCESS: ProcessAdapter,
    AdapterType.HTTP: HttpAdapter,
    AdapterType.NONE: NoneAdapter,
    AdapterType.RUNNER: RunnerAdapter,
    AdapterType.PRP: PrpAdapter,
}


def get_adapter(adapter_type: str) -> Adapter:
    try:
        return ADAPTERS[adapter_type or AdapterType.NONE]()
    except KeyError:
        raise AdapterConfigError(f"unknown adapter type {adapter_type!r}") from None
