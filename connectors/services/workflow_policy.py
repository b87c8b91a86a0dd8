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

An invalid document (bad YAML, front matter that is not a mapping, a Liquid syntax error) never
reaches an agent: the last good version of that source (stored in ``WorkflowDocumentCache``, so it
survives restarts and is shared by workers) stays in force, and one CONFIG health entry reports
each invalid version. With no good version yet, the source is skipped. Policy is additive guidance:
it only chooses the packet template and run guidance, never host rules (see ``task_packet``).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from django.utils import timezone
from liquid import Environment, StrictUndefined
from liquid.exceptions import LiquidError

from connectors.choices import ErrorCategory
from connectors.models import TaskLink
from issues.models import WorkflowDocumentCache

from .common import sync_error_record

log = logging.getLogger("connectors")

# The one strict environment for every packet template: unknown variables and filters raise.
ENV = Environment(undefined=StrictUndefined, strict_filters=True)

WORKFLOW_FILE = "WORKFLOW.md"
MAX_DOCUMENT_CHARS = 256 * 1024  # a prompt policy, not a data file
SOURCE_LABELS = {"project": "project workflow document", "repository": f"repository {WORKFLOW_FILE}",
                 "connector": "connector taskPacketTemplate", "default": "built-in default template"}


class PolicyInvalid(Exception):
    """A workflow document that cannot be used; ``code`` follows Symphony's error classes."""

    def __init__(self, code: str, reason: str):
        super().__init__(f"{code}: {reason}")
        self.code, self.reason = code, reason


@dataclass(frozen=True)
class WorkflowDocument:
    """Parsed WORKFLOW.md: the front matter root map and the trimmed prompt body."""

    config: dict
    template: str


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


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class _NoAliasLoader(yaml.SafeLoader):
    """``yaml.safe_load`` without anchors/aliases: an alias bomb would otherwise expand without bound
    when the front matter is stored as JSON."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, "YAML aliases are not allowed in front matter",
                                              event.start_mark)
        return super().compose_node(parent, index)


def _split(text: str) -> tuple[list[str], list[str]]:
    """Symphony's split: a first line ``---`` opens the front matter, the next ``---`` closes it (no
    closing line: everything is front matter); without an opening line all of it is the body."""
    lines = text.lstrip("\ufeff").replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if not lines or lines[0].rstrip() != "---":
        return [], lines
    rest = lines[1:]
    for i, line in enumerate(rest):
        if line.rstrip() == "---":
            return rest[:i], rest[i + 1:]
    return rest, []


def _first_line(exc: Exception) -> str:
    text = str(exc).strip()
    return " ".join(text.split("\n")[:3])[:300] if text else type(exc).__name__


def parse_document(text: str) -> WorkflowDocument:
    """Parse a WORKFLOW.md document; raises :class:`PolicyInvalid`. The body is syntax-checked here
    (a parse error is a policy error); unknown variables and filters only fail at render time."""
    if len(text) > MAX_DOCUMENT_CHARS:
        raise PolicyInvalid("workflow_parse_error", f"the document is larger than {MAX_DOCUMENT_CHARS} characters")
    front, body = _split(text)
    config: dict = {}
    yaml_text = "\n".join(front)
    if yaml_text.strip():
        try:
            data = yaml.load(yaml_text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader subclass
        except yaml.YAMLError as exc:
            raise PolicyInvalid("workflow_parse_error", f"invalid YAML front matter: {_first_line(exc)}") from exc
        if data is not None and not isinstance(data, dict):
            raise PolicyInvalid("workflow_front_matter_not_a_map",
                                f"the YAML front matter is a {type(data).__name__}, not a mapping")
        try:  # stored as JSON: dates become ISO strings, keys strings; NaN is refused (not JSON)
            config = json.loads(json.dumps(data or {}, default=str, allow_nan=False))
        except (TypeError, ValueError) as exc:
            raise PolicyInvalid("workflow_parse_error", f"front matter is not JSON-compatible: {exc}") from exc
    template = "\n".join(body).strip()
    if template:
        try:
            ENV.parse(template)
        except LiquidError as exc:
            raise PolicyInvalid("template_parse_error", _first_line(exc)) from exc
    return WorkflowDocument(config=config, template=template)


def repository_workflow(project) -> str | None:
    """``WORKFLOW.md`` committed at ``HEAD`` of the project's local repository (``None`` when there is
    no local git repository or no such file). Never touches the network: URLs are skipped."""
    from issues.workspaces import gitops
    from issues.workspaces.errors import WorkspaceGitFailed

    repository = (project.repository or "").strip()
    if not repository or gitops.is_url(repository):
        return None
    path = Path(os.path.expanduser(repository))
    if not path.is_absolute() or not path.is_dir():
        return None
    try:
        proc = gitops.git("show", f"HEAD:{WORKFLOW_FILE}", cwd=path, check=False)
    except (WorkspaceGitFailed, ValueError) as exc:  # timeout / git missing / not UTF-8
        log.warning("project %s: %s unreadable: %s", project.pk, WORKFLOW_FILE, exc)
        return None
    return proc.stdout if proc.returncode == 0 else None


@dataclass(frozen=True)
class _Loaded:
    source: str
    version: str
    document: WorkflowDocument
    stale: bool


def _load(*, project, source: str, text: str | None, link: TaskLink) -> _Loaded | None:
    """One workflow document through the last-good cache. A missing or blank document is absent
    (and forgets its cache, so a later invalid version cannot bring an old one back)."""
    cache = WorkflowDocumentCache.objects.filter(project=project, source=source)
    if not (text or "").strip():
        cache.delete()
        return None
    version = digest(text)
    row = cache.first()
    if row and row.content_hash == version:
        if row.error_hash:  # back to the good version: a later invalid edit is reported again
            cache.update(error_hash="", last_error="")
        return _Loaded(source, version, WorkflowDocument(row.front_matter or {}, row.template), stale=False)
    if row is None or row.error_hash != version:
        try:
            document = parse_document(text)
        except PolicyInvalid as exc:
            row = _report_invalid(project=project, source=source, version=version, exc=exc, row=row, link=link)
        else:
            WorkflowDocumentCache.objects.update_or_create(
                project=project, source=source,
                defaults={"company_id": project.company_id, "content_hash": version, "front_matter": document.config,
                          "template": document.template, "loaded_at": timezone.now(), "error_hash": "",
                          "last_error": ""})
            return _Loaded(source, version, document, stale=False)
    if row.content_hash:  # this version is invalid: keep the last good one
        return _Loaded(source, row.content_hash, WorkflowDocument(row.front_matter or {}, row.template), stale=True)
    return None


def _report_invalid(*, project, source, version, exc: PolicyInvalid, row, link: TaskLink) -> WorkflowDocumentCache:
    """One CONFIG health entry per invalid version of a source; remembered on the cache row."""
    kept = row.content_hash if row else ""
    outcome = (f"the last good version {kept[:12]} stays in force" if kept
               else "no valid version exists yet, so the next layer is used")
    sync_error_record(
        instance=link.instance, category=ErrorCategory.CONFIG, link=link,
        message=f"Workflow policy of project '{project.name}' from the {SOURCE_LABELS[source]} is invalid "
                f"({exc.code}: {exc.reason}); {outcome}.",
        details={"workflowSource": source, "projectId": str(project.pk), "code": exc.code,
                 "invalidVersion": version, "lastGoodVersion": kept or None})
    row, _ = WorkflowDocumentCache.objects.update_or_create(
        project=project, source=source,
        defaults={"company_id": project.company_id, "error_hash": version, "last_error": str(exc)[:2000],
                  **({} if row else {"content_hash": "", "loaded_at": timezone.now()})})
    return row


def _project(link: TaskLink, issue):
    from issues.models import Project

    project_id = getattr(issue, "project_id", None) or link.project_id
    if not project_id:
        return None
    return Project.objects.filter(pk=project_id, company_id=link.company_id).first()


def policy_for(*, link: TaskLink, issue, default_template: str) -> Policy:
    """Resolve the layered policy for one dispatch (§9.5). Reads the repository only when the project
    document does not already decide both the config and the template."""
    documents: list[_Loaded] = []
    project = _project(link, issue)
    if project is not None:
        loaded = _load(project=project, source="project", text=project.workflow_document, link=link)
        if loaded:
            documents.append(loaded)
        if not (loaded and loaded.document.template):
            loaded = _load(project=project, source="repository", text=repository_workflow(project), link=link)
            if loaded:
                documents.append(loaded)
    config = dict(documents[0].document.config) if documents else {}
    config_source = documents[0].source if documents else None
    stale = tuple(d.source for d in documents if d.stale)
    for loaded in documents:
        if loaded.document.template:
            return Policy(loaded.source, loaded.version, loaded.document.template, config, config_source, stale)
    configured = (link.instance.config or {}).get("taskPacketTemplate")
    if isinstance(configured, str) and configured.strip():
        return Policy("connector", digest(configured), configured, config, config_source, stale)
    return Policy("default", digest(default_template), default_template, config, config_source, stale)
