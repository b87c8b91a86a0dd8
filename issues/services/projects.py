"""Projects (upstream Paperclip §5.5) and how upstream's workspace settings map onto this model.

Upstream gives a project workspaces (``workspace: {cwd, repoUrl, repoRef}``) and an
``executionWorkspacePolicy``; here a project has one repository and a workspace strategy:

* ``workspace.cwd`` (else ``workspace.repoUrl``) -> ``repository``; ``workspace.repoRef`` -> ``base_ref``;
* ``executionWorkspacePolicy``: ``enabled: false`` -> ``agent_default``; ``defaultMode``
  ``shared_workspace`` / ``isolated_workspace`` / ``adapter_default`` -> ``shared_workspace`` /
  ``isolated_workspace`` / ``agent_default``; without a mode, ``workspaceStrategy.type``
  ``project_primary`` / ``git_worktree`` / ``adapter_managed`` -> the same three; enabled with
  neither -> ``shared_workspace``. ``operator_branch`` and ``cloud_sandbox`` are not supported (422).
  ``workspaceStrategy.baseRef`` / ``branchTemplate`` -> ``base_ref`` / ``branch_template``. Its
  other keys (issue overrides, runtime services, environments, git policies) have no equivalent
  here and are not stored.
* this project's own names (``workspaceStrategy``, ``repository``, ``baseRef``,
  ``branchTemplate``, ``workflowDocument``) are accepted too; the same setting given two ways
  with different values is a 400 naming both.

Trust boundary (as for the Django admin, where only staff edit a project's repository): a folder
on this server (a path, or a ``file://``/ssh/scp URL, which use the server's files and keys) is
set only by a staff user; any other board user gives an ``https`` URL that the outbound guard
accepts (public address, no credentials in it). Hooks in ``workflowDocument``'s front matter are
shell commands on this server: only staff set or change them (403 ``hooks_staff_only``); anyone else
may write a document without hooks, or with the stored document's hooks unchanged
(issues.services.host_commands). Agents change a project's name, description and status only: its
workspace settings are the board's.
"""
from __future__ import annotations

import os
import string

from django.db import IntegrityError, transaction

from issues.actors import Actor
from issues.choices import WorkspaceStrategy
from issues.exceptions import Conflict, Forbidden, InvalidInput, Unprocessable
from issues.models import Agent, Goal, Project
from issues.workspaces import gitops
from paperclip.core.outbound_http import url_refusal

from .activity import activity_record
from .goals import ensure_org_write
from .host_commands import hooks_check, is_staff
from .lookups import company_object

PROJECT_STATUSES = ("backlog", "planned", "in_progress", "completed", "cancelled")
NAME_MAX, REPOSITORY_MAX, REF_MAX, TEMPLATE_MAX = 200, 1000, 200, 200  # the model's column sizes
BRANCH_PLACEHOLDERS = ("identifier", "key", "number", "issue_id")  # issues.workspaces.service._branch_name
WORKSPACE_FIELDS = ("workspace", "executionWorkspacePolicy", "workspaceStrategy", "repository", "baseRef",
                    "branchTemplate", "workflowDocument")
MODES = {"shared_workspace": WorkspaceStrategy.SHARED, "isolated_workspace": WorkspaceStrategy.ISOLATED,
         "adapter_default": WorkspaceStrategy.AGENT_DEFAULT}
STRATEGY_TYPES = {"project_primary": WorkspaceStrategy.SHARED, "git_worktree": WorkspaceStrategy.ISOLATED,
                  "adapter_managed": WorkspaceStrategy.AGENT_DEFAULT}
UNSUPPORTED = {"defaultMode": ("operator_branch",), "type": ("cloud_sandbox",)}
# model column -> the API name reported in errors and activity.
API_NAMES = {"name": "name", "description": "description", "status": "status", "repository": "repository",
             "base_ref": "baseRef", "branch_template": "branchTemplate", "workspace_strategy": "workspaceStrategy",
             "workflow_document": "workflowDocument", "lead_agent": "leadAgentId", "target_date": "targetDate",
             "color": "color", "icon": "icon", "goals": "goalIds"}


# --- reading upstream's shapes back ---------------------------------------------------------------
def execution_workspace_policy(project: Project) -> dict:
    strategy = project.workspace_strategy
    mode = {v: k for k, v in MODES.items()}.get(strategy, "adapter_default")
    kind = {v: k for k, v in STRATEGY_TYPES.items()}.get(strategy, "adapter_managed")
    return {"enabled": strategy != WorkspaceStrategy.AGENT_DEFAULT, "defaultMode": mode,
            "workspaceStrategy": {"type": kind, "baseRef": project.base_ref or None,
                                  "branchTemplate": project.branch_template or None}}


def primary_workspace(project: Project) -> dict | None:
    """The project's repository as upstream's one primary workspace (its id is the project's)."""
    repository = (project.repository or "").strip()
    if not repository:
        return None
    url = gitops.is_url(repository) and not repository.lower().startswith("file://")
    return {"id": str(project.pk), "projectId": str(project.pk), "name": project.name,
            "cwd": None if url else repository, "repoUrl": redact_url(repository) if url else None,
            "repoRef": project.base_ref or None, "isPrimary": True}


def redact_url(url: str) -> str:
    """``https://user:secret@host/x`` -> ``https://user:***@host/x`` (rows written before the check)."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest.split("/", 1)[0]:
        return url
    userinfo, _, host = rest.partition("@")
    return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{host}" if ":" in userinfo else url


# --- input ----------------------------------------------------------------------------------------------
def _inline_credentials(url: str) -> bool:
    """A token or password in the URL (``https://TOKEN@host``, ``ssh://user:pw@host``); an ssh user alone is fine."""
    scheme, sep, rest = url.partition("://")
    userinfo = rest.split("/", 1)[0].rpartition("@")[0] if sep else ""
    return bool(userinfo) and (scheme.lower() in ("http", "https") or ":" in userinfo)


def repository_check(actor: Actor, value: str, field: str) -> str:
    """A repository value this actor may set (see the module doc), stripped."""
    value = (value or "").strip()
    if not value:
        return ""
    if "\x00" in value or value.startswith("-") or len(value) > REPOSITORY_MAX:
        raise InvalidInput(details={field: ["Not a usable repository path or URL."]})
    if _inline_credentials(value):
        raise InvalidInput(details={field: ["Credentials in the URL are not allowed (credentials are never "
                                            "inline). An https repository must be public: the server's own git "
                                            "credentials never apply to it; for a private one, staff set an ssh "
                                            "URL whose key the server holds."]})
    if value.lower().startswith(("https://", "http://")):
        refusal = None if is_staff(actor) else url_refusal(value)
        if refusal:
            raise InvalidInput(details={field: [refusal]})
        return value
    if not is_staff(actor):
        raise Forbidden("A repository on this server (a folder, file://, ssh or scp-style URL) is set by a staff "
                        "user; give an https URL.", code="repository_staff_only",
                        details={field: ["Only staff users set a server folder or an ssh/file repository."]})
    if not gitops.is_url(value) and not os.path.isabs(os.path.expanduser(value)):
        raise InvalidInput(details={field: ["Must be an absolute path or a URL."]})
    return value


def _ref_check(value: str, field: str) -> str:
    value = (value or "").strip()
    if value and (value.startswith("-") or any(c.isspace() or c == "\x00" for c in value)):
        raise InvalidInput(details={field: ["Not a valid git ref."]})
    return value


def _template_check(value: str, field: str) -> str:
    value = (value or "").strip()
    if not value:
        raise InvalidInput(details={field: ["This field may not be blank."]})
    try:
        names = [name for _, name, _, _ in string.Formatter().parse(value) if name is not None]
    except ValueError as exc:
        raise InvalidInput(details={field: [str(exc)]}) from None
    unknown = [name for name in names if name not in BRANCH_PLACEHOLDERS]
    if unknown:
        raise InvalidInput(details={field: [f"Unknown placeholder(s) {', '.join(unknown)}; use "
                                            f"{', '.join('{' + p + '}' for p in BRANCH_PLACEHOLDERS)}."]})
    return value


def _mapped_from_upstream(data: dict) -> dict:
    """Model values from ``workspace`` and ``executionWorkspacePolicy``: {column: (value, source)}."""
    out = {}
    workspace = data.get("workspace")
    if workspace:
        source = "workspace.cwd" if workspace.get("cwd") else "workspace.repoUrl"
        out["repository"] = (workspace.get("cwd") or workspace.get("repoUrl"), source)
        if workspace.get("repoRef"):
            out["base_ref"] = (workspace["repoRef"], "workspace.repoRef")
    policy = data.get("executionWorkspacePolicy")
    if policy:
        strategy = policy.get("workspaceStrategy") or {}
        for key, value in (("defaultMode", policy.get("defaultMode")), ("type", strategy.get("type"))):
            if value in UNSUPPORTED[key]:
                raise Unprocessable(f"Workspace mode '{value}' is not supported here.", code="workspace_mode_unsupported",
                                    details={f"executionWorkspacePolicy.{key}": [
                                        f"Use one of {', '.join(MODES if key == 'defaultMode' else STRATEGY_TYPES)}."]})
        if not policy.get("enabled", True):
            mode = WorkspaceStrategy.AGENT_DEFAULT
        else:
            mode = (MODES.get(policy.get("defaultMode")) or STRATEGY_TYPES.get(strategy.get("type"))
                    or WorkspaceStrategy.SHARED)
        out["workspace_strategy"] = (mode, "executionWorkspacePolicy")
        for key, column in (("baseRef", "base_ref"), ("branchTemplate", "branch_template")):
            if strategy.get(key):
                out.setdefault(column, (strategy[key], f"executionWorkspacePolicy.workspaceStrategy.{key}"))
    return out


def _planning(company_id, data: dict) -> tuple[dict, list | None]:
    """Upstream's planning fields: (column -> value, the goals or None when not given). ``goalId``
    (deprecated upstream) counts only without ``goalIds``; the lead and goals are the company's own."""
    values = {}
    if "leadAgentId" in data:
        values["lead_agent"] = company_object(Agent, company_id, data["leadAgentId"], "leadAgentId")
    if "targetDate" in data:
        values["target_date"] = data["targetDate"]
    for name in ("color", "icon"):
        if name in data:
            values[name] = (data[name] or "").strip()
    if "goalIds" in data:
        ids = data["goalIds"] or []
    elif "goalId" in data:
        ids = [data["goalId"]] if data["goalId"] else []
    else:
        return values, None
    return values, [company_object(Goal, company_id, pk, "goalIds") for pk in dict.fromkeys(ids)]


def _values(actor: Actor, data: dict, project: Project | None = None) -> dict:
    """Model column -> value from the API input (already shape-checked by the serializer); ``project``
    is the one being updated (its stored document's hooks may be kept by anyone)."""
    given = [name for name in WORKSPACE_FIELDS if name in data]
    if given and actor.is_agent:
        raise Forbidden("Board access required", code="board_only",
                        details={name: ["Only board users change a project's workspace settings."] for name in given})
    values = {column: data[name] for column, name in (("name", "name"), ("description", "description"),
                                                     ("status", "status")) if name in data}
    if "name" in values:
        values["name"] = (values["name"] or "").strip()
        if not values["name"]:
            raise InvalidInput(details={"name": ["This field may not be blank."]})
    if "description" in values:
        values["description"] = values["description"] or ""
    if "status" in values and values["status"] not in PROJECT_STATUSES:
        raise InvalidInput(details={"status": [f"'{values['status']}' is not one of {', '.join(PROJECT_STATUSES)}."]})
    mapped = _mapped_from_upstream(data)
    sources = {column: source for column, (_, source) in mapped.items()}
    own = {"workspace_strategy": "workspaceStrategy", "repository": "repository", "base_ref": "baseRef",
           "branch_template": "branchTemplate", "workflow_document": "workflowDocument"}
    for column, name in own.items():
        if name not in data:
            continue
        value = data[name] if data[name] is not None else ""
        if column in mapped and mapped[column][0] != value:
            raise InvalidInput(details={name: [f"Disagrees with {mapped[column][1]}; give the setting once."],
                                        mapped[column][1]: [f"Disagrees with {name}."]})
        mapped[column], sources[column] = (value, name), name
    for column, (value, _) in mapped.items():
        field = sources[column]
        if column == "repository":
            value = repository_check(actor, value, field)
        elif column == "base_ref":
            value = _ref_check(value, field)
        elif column == "branch_template":
            value = _template_check(value, field)
        elif column == "workflow_document":
            value = hooks_check(actor, value, project.workflow_document if project is not None else "", field)
        values[column] = value
    return values


def _name_taken(company_id, name: str, exclude=None) -> bool:
    qs = Project.objects.filter(company_id=company_id, name__iexact=name)
    return qs.exclude(pk=exclude).exists() if exclude else qs.exists()


def _conflict(name: str) -> Conflict:
    return Conflict("A project with that name exists in this company.", code="project_name_taken",
                    details={"name": ["Project names are unique per company (case-insensitive)."]})


def project_create(*, actor: Actor, company, data: dict) -> Project:
    """``data`` uses the API names (see the module doc); status defaults to ``backlog``."""
    ensure_org_write(actor, company.pk)
    values = _values(actor, {"status": "backlog", **data})
    planning, goals = _planning(company.pk, data)
    values.update(planning)
    if _name_taken(company.pk, values["name"]):
        raise _conflict(values["name"])
    try:
        with transaction.atomic():
            project = Project.objects.create(company=company, **values)
            if goals:
                project.goals.set(goals)
            keys = [*values, *(["goals"] if goals else [])]
            activity_record(actor=actor, company_id=company.pk, action="project.created", entity_type="project",
                            entity_id=project.pk,
                            details={"name": project.name, "changedKeys": sorted(API_NAMES[k] for k in keys)})
    except IntegrityError:  # a concurrent create took the name
        raise _conflict(values["name"]) from None
    return project


def project_update(*, actor: Actor, project: Project, data: dict) -> Project:
    ensure_org_write(actor, project.company_id)
    values = _values(actor, data, project)
    planning, goals = _planning(project.company_id, data)
    values.update(planning)
    if "name" in values and _name_taken(project.company_id, values["name"], exclude=project.pk):
        raise _conflict(values["name"])
    try:
        with transaction.atomic():
            project = Project.objects.select_for_update().get(pk=project.pk)
            changed = sorted(k for k, v in values.items() if getattr(project, k) != v)
            goals_changed = goals is not None and {g.pk for g in goals} != set(
                project.goals.values_list("pk", flat=True))
            if not changed and not goals_changed:
                return project
            for column in changed:
                setattr(project, column, values[column])
            if changed:
                project.save()
            if goals_changed:
                project.goals.set(goals)
                changed.append("goals")
            activity_record(actor=actor, company_id=project.company_id, action="project.updated",
                            entity_type="project", entity_id=project.pk,
                            details={"changedKeys": sorted(API_NAMES[k] for k in changed)})
    except IntegrityError:
        raise _conflict(values.get("name", "")) from None
    return project
