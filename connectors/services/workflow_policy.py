"""Workflow policy lookup (§9.5) for the Symphony profile's task packet.

Layers, highest precedence first:

1. ``project``: the Paperclip project's ``workflow_document``.
2. ``repository``: ``WORKFLOW.md`` at ``HEAD`` of the project's repository, only when that is a
   local folder (a URL is never fetched here: no network on the dispatch path).
3. ``connector``: the instance's ``config.taskPacketTemplate``, else ``default``: the built-in
   template. These two are plain Liquid, not WORKFLOW.md documents.

Layers 1–2 use Symphony's WORKFLOW.md format: optional YAML front matter between ``---`` lines
(must be a mapping) and a Liquid body, trimmed. The front matter of the highest document present
is the policy config (``workflow.config`` in the packet); the template is the body of the highest
layer whose body is not empty, so a document with front matter only keeps the next layer's prompt.

With no document, the instance's ``config.workflowDefaults`` (a front matter mapping) is the
config; the host applies the same defaults to runs of linked issues (registered in ``apps.py``).

The format, the cache and the settings' types live in ``issues.workflow``. An invalid document (bad
YAML, front matter that is not a mapping, a known setting of the wrong type, a Liquid syntax error)
never reaches an agent: the last good version of that source (stored in ``WorkflowDocumentCache``,
so it survives restarts and is shared by workers) stays in force, and one CONFIG health entry (plus
the host's ``project.workflow_invalid`` activity) reports each invalid version, whichever of the
dispatch path or the host's run admission sees it first. With no good version yet, the source is
skipped. Policy is additive guidance: it only chooses the packet template and run guidance, never
host rules (see ``task_packet``).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from connectors.choices import ErrorCategory, LinkStatus
from connectors.models import ConnectorInstance, SyncError, TaskLink
from issues.services.host_commands import hooks_set
from issues.workflow.cache import load_cached
from issues.workflow.document import ENV  # noqa: F401 (the one strict environment task_packet renders with)
from issues.workflow.document import SOURCE_LABELS as DOCUMENT_LABELS
from issues.workflow.document import digest, repository_workflow
from issues.workflow.effective import record_invalid_activity
from issues.workflow.errors import PolicyInvalid
from issues.workflow.settings import validate_front_matter

from .common import sync_error_record

log = logging.getLogger("connectors")

SOURCE_LABELS = {**DOCUMENT_LABELS, "connector": "connector taskPacketTemplate",
                 "default": "built-in default template"}
DEFAULTS_KEY = "workflowDefaults"  # instance config: front matter for projects without a document


@dataclass(frozen=True)
class Policy:
    """The policy one packet is rendered with: the template and where it came from, plus the
    config (front matter) of the highest workflow document present."""

    source: str  # project | repository | connector | default (of the template)
    version: str  # SHA-256 of the source text the template came from
    template: str
    config: dict = field(default_factory=dict)
    config_source: str | None = None
    stale: tuple[str, ...] = ()  # sources kept at their last good version (a newer one is invalid)

    @property
    def label(self) -> str:
        return SOURCE_LABELS[self.source]


def _health_entry(*, link: TaskLink, project, source, version, exc: PolicyInvalid, kept_version: str):
    """One CONFIG health entry for an invalid version of a project's workflow document."""
    outcome = (f"the last good version {kept_version[:12]} stays in force" if kept_version
               else "no valid version exists yet, so the next layer is used")
    sync_error_record(
        instance=link.instance, category=ErrorCategory.CONFIG, link=link,
        message=f"Workflow policy of project '{project.name}' from the {SOURCE_LABELS[source]} is invalid "
                f"({exc.code}: {exc.reason}); {outcome}.",
        details={"workflowSource": source, "projectId": str(project.pk), "code": exc.code, "key": exc.key,
                 "invalidVersion": version, "lastGoodVersion": kept_version or None})


def _reporter(link: TaskLink):
    """Seen first on the dispatch path: the link's health entry, and the host's audit row."""
    def on_invalid(*, project, source, version, exc, kept_version):
        _health_entry(link=link, project=project, source=source, version=version, exc=exc, kept_version=kept_version)
        record_invalid_activity(project=project, source=source, version=version, exc=exc, kept_version=kept_version)

    return on_invalid


def _project(link: TaskLink, issue):
    from issues.models import Project

    project_id = getattr(issue, "project_id", None) or link.project_id
    if not project_id:
        return None
    return Project.objects.filter(pk=project_id, company_id=link.company_id).first()


def policy_for(*, link: TaskLink, issue, default_template: str) -> Policy:
    """Resolve the layered policy for one dispatch (§9.5). Reads the repository only when the project
    document does not already decide both the config and the template."""
    documents = []
    project = _project(link, issue)
    if project is not None:
        on_invalid = _reporter(link)
        loaded = load_cached(project=project, source="project", text=project.workflow_document, on_invalid=on_invalid)
        if loaded:
            documents.append(loaded)
        if not (loaded and loaded.document.template):
            loaded = load_cached(project=project, source="repository", text=repository_workflow(project),
                                 on_invalid=on_invalid)
            if loaded:
                documents.append(loaded)
    config = dict(documents[0].document.config) if documents else {}
    config_source = documents[0].source if documents else None
    if not documents:
        defaults = instance_workflow_defaults(link.instance)
        if defaults is not None:
            config, config_source = defaults, "connector"
    stale = tuple(d.source for d in documents if d.stale)
    for loaded in documents:
        if loaded.document.template:
            return Policy(loaded.source, loaded.version, loaded.document.template, config, config_source, stale)
    configured = (link.instance.config or {}).get("taskPacketTemplate")
    if isinstance(configured, str) and configured.strip():
        return Policy("connector", digest(configured), configured, config, config_source, stale)
    return Policy("default", digest(default_template), default_template, config, config_source, stale)


# --- the host side: connector defaults and health for the host's run settings (issues.workflow) ----

def workflow_defaults_errors(config: dict | None) -> dict:
    """Field errors of ``config.workflowDefaults`` (a front matter mapping checked like a document's)."""
    value = (config or {}).get(DEFAULTS_KEY)
    if value is None:
        return {}
    if not isinstance(value, dict):
        return {f"config.{DEFAULTS_KEY}": ["Must be an object (WORKFLOW.md front matter)."]}
    try:
        validate_front_matter(value)
    except PolicyInvalid as exc:
        return {f"config.{DEFAULTS_KEY}.{exc.key}": [exc.reason]}
    return {}


def workflow_defaults_hook_errors(config: dict | None) -> dict:
    """Hooks are shell commands on this server, and connector configuration is a company admin's: a
    staff user sets hooks on the project instead (when read, a connector's hooks are ignored:
    issues.services.run_policy)."""
    value = (config or {}).get(DEFAULTS_KEY)
    hooks = value.get("hooks") if isinstance(value, dict) else None
    if not isinstance(hooks, dict):
        return {}
    return {f"config.{DEFAULTS_KEY}.hooks.{name}": ["Hooks are commands on this server: a staff user sets them "
                                                    "in the project's workflow document, not here."]
            for name in hooks_set(hooks)}


def instance_workflow_defaults(instance: ConnectorInstance) -> dict | None:
    """The instance's ``workflowDefaults`` when valid. An invalid value is skipped and reported once
    per version as a CONFIG health entry (it never reaches a run)."""
    value = (instance.config or {}).get(DEFAULTS_KEY)
    if value is None:
        return None
    errors = workflow_defaults_errors(instance.config)
    if not errors:
        return dict(value)
    version = digest(repr(value))
    if not SyncError.objects.filter(instance=instance, category=ErrorCategory.CONFIG,
                                    details__workflowDefaultsVersion=version).exists():
        field_name, reasons = next(iter(errors.items()))
        sync_error_record(instance=instance, category=ErrorCategory.CONFIG,
                          message=f"{field_name} is invalid ({'; '.join(reasons)}); the connector's workflow "
                                  "defaults are not applied.",
                          details={"workflowDefaultsVersion": version, "field": field_name})
    return None


def _links_of(issue):
    return (TaskLink.objects.select_related("instance").filter(issue_id=issue.pk)
            .exclude(status=LinkStatus.UNLINKED).order_by("created_at", "pk"))


def host_workflow_defaults(issue) -> dict | None:
    """Registered with ``issues.workflow.effective``: the defaults of the issue's connector instance."""
    for link in _links_of(issue):
        defaults = instance_workflow_defaults(link.instance)
        if defaults is not None:
            return defaults
    return None


def host_workflow_invalid(*, issue, project, source, version, exc, kept_version):
    """Registered with ``issues.workflow.effective``: the host found an invalid version first; a
    tracker-driven issue's link gets the health entry the dispatch path would have recorded."""
    if issue is None:
        return
    link = _links_of(issue).first()
    if link is not None:
        _health_entry(link=link, project=project, source=source, version=version, exc=exc, kept_version=kept_version)
