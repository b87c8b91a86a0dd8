"""Setup validation of a connector's state mapping against the provider's live workflow (§7.2: "mapping is
configuration, validated at setup against live provider workflow metadata where available"; A.2: per-project
workflow variance is Jira's main mapping risk).

``validate_state_mapping`` only checks the mapping's *shape* offline. This check reads each configured
container's workflow through ``TaskSourceAdapter.workflow_metadata`` and reports

- **errors**: state names the configuration relies on that the container's workflow does not have —
  per-container overrides (``stateMapping.projects.PC.statuses.Shipped``), top-level named overrides
  that match no container at all, and ``config.outboundStates`` names (outbound writes would fail);
- **warnings**: live states that end up unmapped (inert ``backlog``, §7.2), top-level named overrides
  missing from only some containers, overrides keyed by a container the connector does not have.

Errors become a CONFIG health entry (the health surface shows it); provider failures (auth, rate limit,
network) are part of the result and recorded as health with their own category, never raised. Runs on
demand (API, ``connector_check_mapping``) and after a configuration update (``instances.instance_update``)."""
from __future__ import annotations

import logging
from typing import Any, Mapping

from django.db import transaction
from django.utils import timezone

from connectors import secrets
from connectors.choices import ErrorCategory
from connectors.models import ConnectorInstance
from connectors.providers.base import ProviderError, TaskSourceAdapter, normalize_state_name
from issues.actors import Actor
from issues.services.activity import activity_record

from .common import adapter_class, adapter_for, sync_error_record
from .interventions import require_writer

log = logging.getLogger("connectors.mapping_check")

OK, INVALID, UNAVAILABLE, NOT_APPLICABLE = "ok", "invalid", "unavailable", "not_applicable"
INSTANCE_WIDE = (ErrorCategory.PROVIDER_AUTH, ErrorCategory.PROVIDER_RATE_LIMITED, ErrorCategory.PROVIDER_REQUEST)
# instance fields whose change re-runs the check after an update
CHECKED_FIELDS = ("state_mapping", "config", "containers", "base_url")


def state_mapping_check(*, actor: Actor, instance: ConnectorInstance, trigger: str = "manual") -> dict:
    """Check ``instance``'s state mapping against each container's live workflow (board writers).
    Returns the report (``status``: ok | invalid | unavailable | not_applicable) and records it."""
    require_writer(actor, instance.company_id)
    report = mapping_report(instance)
    _record(actor, instance, report, trigger)
    return report


def check_after_update(*, actor: Actor, instance_id, changed: set[str], trigger: str = "update") -> dict | None:
    """The post-commit hook of ``instance_update`` (and of ``instance_create``, ``trigger="create"``): re-check
    when the mapping-relevant configuration changed. Never raises (the change is committed already); a
    failure of the check itself becomes a health entry."""
    if not changed & set(CHECKED_FIELDS):
        return None
    instance = ConnectorInstance.objects.filter(pk=instance_id).first()
    if instance is None:
        return None
    try:
        return state_mapping_check(actor=actor, instance=instance, trigger=trigger)
    except Exception as exc:  # noqa: BLE001 — an update must never break because its check did
        log.exception("state mapping check after the %s of connector %s failed", trigger, instance_id)
        try:
            sync_error_record(instance=instance, category=ErrorCategory.CONFIG,
                              message=f"State mapping check after the {trigger} failed: {type(exc).__name__}: {exc}",
                              details={"check": "state_mapping", "trigger": trigger})
        except Exception:  # noqa: BLE001
            log.exception("could not record the failed mapping check of connector %s", instance_id)
        return None


# ---------------------------------------------------------------------------------------- the report
def mapping_report(instance: ConnectorInstance) -> dict:
    """The check itself, without permission checks or recording (reads the provider, writes nothing)."""
    report = {"instanceId": str(instance.pk), "providerKey": instance.provider_key, "status": OK,
              "checkedAt": timezone.now(), "message": "", "containers": [], "errors": [], "warnings": [],
              "providerErrors": []}
    try:
        cls = adapter_class(instance.provider_key)
    except LookupError:
        return _not_applicable(report, f"Unknown provider '{instance.provider_key}'.")
    if cls.workflow_metadata is TaskSourceAdapter.workflow_metadata:  # decided before resolving any secret
        return _not_applicable(report, f"The {instance.provider_key} provider has no workflow metadata to check "
                                       "the state mapping against.")
    containers = [str(c) for c in instance.containers or ()]
    if not containers:
        report["warnings"].append(_issue("containers", None, "No containers are configured; nothing to check."))
        return _finish(report)
    try:
        adapter = adapter_for(instance)
    except secrets.SecretUnavailable as exc:
        report["providerErrors"].append({"container": None, "category": ErrorCategory.CONFIG,
                                         "message": f"Credentials unavailable: {exc}", "retryAfter": None})
        return _finish(report)

    workflows: dict[str, Mapping[str, Any]] = {}
    stopped = False
    for container in containers:
        if stopped:
            report["containers"].append({"container": container, "checked": False, "states": []})
            continue
        try:
            meta = adapter.workflow_metadata(container)
        except ProviderError as exc:
            report["containers"].append({"container": container, "checked": False, "states": []})
            if exc.category == ErrorCategory.PROVIDER_STATUS and exc.status == 404:  # a configuration mistake
                report["errors"].append(_issue("containers", container, f"{container} was not found (or the "
                                                                        f"credentials cannot see it): {exc}"))
                continue
            report["providerErrors"].append({"container": container, "category": exc.category, "message": str(exc),
                                             "retryAfter": exc.retry_after})
            # auth, rate limit and network failures hold for every container: do not hammer or wait again
            stopped = exc.category in INSTANCE_WIDE
            continue
        if meta is None:
            return _not_applicable(report, f"The {instance.provider_key} provider has no workflow metadata.")
        workflows[container] = meta
        report["containers"].append({
            "container": container, "checked": True,
            "states": [{"name": s.get("name"), "category": s.get("category"), "mapped": bool(s.get("mapped", True))}
                       for s in meta.get("states") or ()]})
    if workflows:
        _compare(report, instance, workflows, complete=len(workflows) == len(containers))
    return _finish(report)


def _compare(report: dict, instance: ConnectorInstance, workflows: dict[str, Mapping], *, complete: bool):
    errors, warnings = report["errors"], report["warnings"]
    any_meta = next(iter(workflows.values()))
    kind = any_meta.get("containerKind") or "container"
    sections = list(any_meta.get("nameSections") or ())
    override_section = any_meta.get("overrideSection")
    names = {c: {normalize_state_name(s.get("name")): s.get("name") for s in m.get("states") or () if s.get("name")}
             for c, m in workflows.items()}

    def missing(container, name, field, *, note=""):
        available = ", ".join(str(n) for n in names[container].values()) or "none"
        return _issue(field, container, f"no status named '{name}' in {kind} {container}{note}; available: {available}")

    mapping = instance.state_mapping if isinstance(instance.state_mapping, Mapping) else {}
    # top-level named overrides apply to every container: an error only when no container has the name
    for section in sections:
        for name in _keys(mapping.get(section)):
            field = f"stateMapping.{section}.{name}"
            absent = [c for c in workflows if normalize_state_name(name) not in names[c]]
            if not absent:
                continue
            if len(absent) < len(workflows):
                present = ", ".join(c for c in workflows if c not in absent)
                note = f" (only in {present}; the override does not apply here)"
            elif not complete:  # the containers that could not be read may have it
                note = " (the other containers could not be read)"
            else:
                errors.extend(missing(c, name, field) for c in absent)
                continue
            warnings.extend(missing(c, name, field, note=note) for c in absent)
    # per-container overrides must name states of that container's workflow
    overrides = mapping.get(override_section) if override_section else None
    for key, override in (overrides.items() if isinstance(overrides, Mapping) else ()):
        matched = [c for c, m in workflows.items()
                   if normalize_state_name(key) in {normalize_state_name(k) for k in m.get("keys") or (c,)}]
        if not matched:
            if complete:
                warnings.append(_issue(f"stateMapping.{override_section}.{key}", None,
                                       f"{kind} {key} is not one of this connector's containers; the override "
                                       "never applies"))
            continue
        for section in sections:
            for name in _keys(override.get(section) if isinstance(override, Mapping) else None):
                field = f"stateMapping.{override_section}.{key}.{section}.{name}"
                errors.extend(missing(c, name, field) for c in matched if normalize_state_name(name) not in names[c])
    # outbound targets are used for links in every container: each must exist everywhere
    outbound = (instance.config or {}).get("outboundStates") if isinstance(instance.config, Mapping) else None
    for category, name in (outbound.items() if isinstance(outbound, Mapping) else ()):
        if not isinstance(name, str) or not name.strip():
            continue
        errors.extend(missing(c, name.strip(), f"config.outboundStates.{category}",
                              note=f" (outbound changes to {category} would fail there)")
                      for c in workflows if normalize_state_name(name) not in names[c])
    # live states no mapping entry covers are inert backlog (§7.2): worth a look, not an error
    for container, meta in workflows.items():
        for state in meta.get("states") or ():
            if not state.get("mapped", True):
                warnings.append(_issue("stateMapping", container,
                                       f"status '{state.get('name')}' in {kind} {container} is unmapped "
                                       f"(type {state.get('type') or state.get('statusCategory') or 'unknown'}); "
                                       "tasks in it are treated as backlog"))


def _keys(section) -> list[str]:
    return [str(k) for k in section] if isinstance(section, Mapping) else []


def _issue(field: str, container: str | None, reason: str) -> dict:
    return {"field": field, "container": container, "reason": reason}


def _not_applicable(report: dict, message: str) -> dict:
    report.update(status=NOT_APPLICABLE, message=message)
    return report


def _finish(report: dict) -> dict:
    errors, warnings, failures = report["errors"], report["warnings"], report["providerErrors"]
    if errors:
        report["status"] = INVALID
    elif failures:
        report["status"] = UNAVAILABLE
    parts = [f"{len(errors)} error(s)", f"{len(warnings)} warning(s)"]
    if failures:
        parts.append(f"{len(failures)} container(s) could not be read")
    report["message"] = "State mapping check: " + ", ".join(parts) + "."
    if errors:
        report["message"] += f" First: {errors[0]['field']}: {errors[0]['reason']}"
    return report


# ---------------------------------------------------------------------------------------- recording
def _record(actor: Actor, instance: ConnectorInstance, report: dict, trigger: str):
    """Errors and unreadable workflows go to health (§12.2); every check is in the activity log."""
    with transaction.atomic():
        if report["errors"]:
            sync_error_record(instance=instance, category=ErrorCategory.CONFIG, message=report["message"],
                              details={"check": "state_mapping", "trigger": trigger, "errors": report["errors"],
                                       "warnings": report["warnings"]})
        for failure in report["providerErrors"]:
            category = failure["category"] if failure["category"] in ErrorCategory.values \
                else ErrorCategory.PROVIDER_REQUEST
            where = f" of {failure['container']}" if failure["container"] else ""
            sync_error_record(instance=instance, category=category,
                              message=f"State mapping check could not read the workflow{where}: {failure['message']}",
                              details={"check": "state_mapping", "trigger": trigger})
        if report["status"] != NOT_APPLICABLE:
            activity_record(actor=actor, company_id=instance.company_id, action="connector.mapping_checked",
                            entity_type="connector", entity_id=instance.pk,
                            details={"status": report["status"], "trigger": trigger, "errors": len(report["errors"]),
                                     "warnings": len(report["warnings"]),
                                     "unreadable": [f["container"] for f in report["providerErrors"]]})
