"""The effective workflow document of an issue on the host side (§9.5 layers, highest first):

1. the project's ``workflow_document``,
2. ``WORKFLOW.md`` at ``HEAD`` of the project's local repository (read only when layer 1 is absent,
   and again only when HEAD moved),
3. connector defaults: apps above ``issues`` register a provider here (``issues`` never imports
   them); the connectors app returns its instance's ``config.workflowDefaults`` for a linked issue.

The front matter of the highest document present applies (the rule the task packet uses for its
``workflow.config``), even when its own body is empty. An invalid version keeps the last good one
(:mod:`issues.workflow.cache`); the host reports it once as an activity row
``project.workflow_invalid`` naming the source, the error and, for a wrong-typed setting, the key,
and tells registered listeners (the connectors add a health entry on the issue's link).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from issues.models import WorkflowDocumentCache

from .cache import load_cached
from .document import SOURCE_LABELS, repository_workflow_memo
from .errors import PolicyInvalid

log = logging.getLogger("paperclip.workflow")

# fn(issue) -> front matter mapping (already validated) or None
DEFAULTS_PROVIDERS: list = []
# fn(*, issue, project, source, version, exc, kept_version) -> None
INVALID_LISTENERS: list = []


def register_defaults_provider(fn):
    """Register a connector-defaults provider (from an ``AppConfig.ready()``)."""
    if fn not in DEFAULTS_PROVIDERS:
        DEFAULTS_PROVIDERS.append(fn)
    return fn


def register_invalid_listener(fn):
    """Register a listener told once per invalid document version the host found."""
    if fn not in INVALID_LISTENERS:
        INVALID_LISTENERS.append(fn)
    return fn


@dataclass(frozen=True)
class EffectiveDocument:
    config: dict = field(default_factory=dict)  # the front matter in force ({} when none)
    source: str | None = None  # project | repository | connector | None
    version: str = ""
    stale: bool = False  # the source's newest version is invalid; its last good one applies


def record_invalid_activity(*, project, source: str, version: str, exc: PolicyInvalid, kept_version: str):
    """The audit row of one invalid version (also written by the connectors when they see it first)."""
    from issues.actors import SYSTEM
    from issues.services.activity import activity_record

    activity_record(actor=SYSTEM, company_id=project.company_id, action="project.workflow_invalid",
                    entity_type="project", entity_id=project.pk,
                    details={"source": source, "sourceLabel": SOURCE_LABELS.get(source, source), "code": exc.code,
                             "key": exc.key, "error": exc.reason[:1000], "invalidVersion": version,
                             "lastGoodVersion": kept_version or None})


def _reporter(issue):
    def on_invalid(*, project, source, version, exc, kept_version):
        log.warning("project %s: the %s is invalid (%s); %s", project.pk, SOURCE_LABELS.get(source, source), exc,
                    f"version {kept_version[:12]} stays in force" if kept_version else "no good version yet")
        record_invalid_activity(project=project, source=source, version=version, exc=exc, kept_version=kept_version)
        for listener in INVALID_LISTENERS:
            try:
                listener(issue=issue, project=project, source=source, version=version, exc=exc,
                         kept_version=kept_version)
            except Exception:  # a listener never breaks run admission
                log.exception("workflow invalid listener %r failed", listener)

    return on_invalid


def _connector_defaults(issue) -> dict | None:
    for provider in DEFAULTS_PROVIDERS:
        try:
            config = provider(issue)
        except Exception:  # a provider never breaks run admission
            log.exception("workflow defaults provider %r failed", provider)
            continue
        if isinstance(config, dict):
            return config
    return None


def effective_document(*, issue=None, project=None) -> EffectiveDocument:
    """The workflow front matter in force for a run of ``issue`` (or in ``project``)."""
    if project is None and issue is not None and issue.project_id:
        project = issue.project
    if project is not None:
        on_invalid = _reporter(issue)
        loaded = load_cached(project=project, source="project", text=project.workflow_document,
                             on_invalid=on_invalid)
        if loaded is None:
            loaded = load_cached(project=project, source="repository", text=repository_workflow_memo(project),
                                 on_invalid=on_invalid)
        if loaded is not None:
            return EffectiveDocument(dict(loaded.document.config), loaded.source, loaded.version, loaded.stale)
    if issue is not None:
        defaults = _connector_defaults(issue)
        if defaults is not None:
            return EffectiveDocument(dict(defaults), "connector")
    return EffectiveDocument()


def last_errors(project) -> list[dict]:
    """Per source, the invalid version last reported and its error (for the admin)."""
    rows = WorkflowDocumentCache.objects.filter(project=project).exclude(error_hash="")
    return [{"source": row.source, "label": SOURCE_LABELS.get(row.source, row.source), "error": row.last_error,
             "invalidVersion": row.error_hash, "lastGoodVersion": row.content_hash or None} for row in rows]
