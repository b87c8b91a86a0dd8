"""Asana state mapping (configuration, not code): sections per project plus completion.

``AdapterConfig.state_mapping``::

    {
      "sections":  {"In Progress": "active", "Review": "review", "Waiting": "blocked"},  # section NAME, every project
      "completed": "terminal",                                   # category of a completed task (the default)
      "projects":  {"<project gid>": {"sections": {"Doing": "active"}}}   # per-project overrides
    }

A task's state is its section in the configured project it belongs to (``memberships``), unless it is
completed: then the state is ``Completed`` with the ``completed`` category. Lookup: project ``sections`` ->
``sections`` -> ``backlog``. A section no mapping entry names is ``backlog``; it is *reported* as unmapped
(§7.2) only when the mapping names sections for that project at all (an empty mapping ``{}`` is the
documented default: completed -> terminal, every section backlog, nothing reported).

The shape is Linear's (named states + per-container overrides under a key the outbound inverse skips), so the
setup mapping check (``workflow_metadata``: ``nameSections=["sections"]``, ``overrideSection="projects"``) and
the engine's category -> state inverse both read it as is; ``update_task_state`` takes a section name or
``Completed`` (also spelled ``completed``: the name the inverse finds for the ``completed`` key). When a
section is mapped to the same category as completion (a "Done" section and ``completed: terminal``), which
one the inverse picks follows the stored JSON's key order, which PostgreSQL's jsonb does not keep: name it
with ``config.outboundStates`` (``{"terminal": "Completed"}``)."""
from __future__ import annotations

from typing import Any, Callable, Mapping

from ..base import StateCategory, normalize_state_name
from ..http import check_categories, check_overrides, norm_names

COMPLETED_STATE = "Completed"  # the state name of a completed task (and update_task_state's target for it)
MAPPING_KEYS = ("sections", "completed", "projects")


class AsanaMapping:
    def __init__(self, raw: Mapping[str, Any] | None):
        raw = raw if isinstance(raw, Mapping) else {}
        self.sections = norm_names(raw.get("sections"))
        completed = normalize_state_name(raw.get("completed")) if isinstance(raw.get("completed"), str) else ""
        self.completed = completed if completed in StateCategory.ALL else StateCategory.TERMINAL
        self.projects: dict[str, dict[str, str]] = {}
        projects = raw.get("projects")
        for gid, value in projects.items() if isinstance(projects, Mapping) else ():
            if isinstance(value, Mapping):
                self.projects[str(gid).strip()] = norm_names(value.get("sections"))

    def names_sections(self, project: str | None) -> bool:
        return bool(self.sections or self.projects.get(str(project or "")))

    def section_category(self, section: str | None, project: str | None) -> str | None:
        """The mapped category of a section name in ``project``, or None when no entry names it."""
        name = normalize_state_name(section)
        override = self.projects.get(str(project or ""), {})
        if name in override:
            return override[name]
        return self.sections.get(name)

    def state(self, *, completed: bool, section: str | None, project: str | None) -> tuple[str, str, bool]:
        """(state name, category, mapped?) of a task."""
        if completed:
            return COMPLETED_STATE, self.completed, True
        name = section or "(no section)"
        category = self.section_category(section, project)
        if category in StateCategory.ALL:
            return name, category, True
        return name, StateCategory.BACKLOG, not self.names_sections(project)


def validate(mapping: Any) -> dict[str, list[str]]:
    errors: dict[str, list[str]] = {}

    def add(field_name: str, reason: str) -> None:
        errors.setdefault(field_name, []).append(reason)

    def check_sections(prefix: str, value: Any) -> None:
        check_categories(add, prefix, value, shape="section name", names="section names")

    if not isinstance(mapping, Mapping):
        return {"stateMapping": ["must be an object"]}
    checks: dict[str, Callable[[str, Any], None]] = {"sections": check_sections}
    for key, value in mapping.items():
        if key == "sections":
            check_sections("sections", value)
        elif key == "completed":
            if not isinstance(value, str) or normalize_state_name(value) not in StateCategory.ALL:
                add("completed", f"unknown category {value!r}; expected one of {', '.join(StateCategory.ALL)}")
        elif key == "projects":
            check_overrides(add, "projects", value, "project gid", checks)
        else:
            add(key, f"unknown key; expected {', '.join(MAPPING_KEYS)}")
    return errors
