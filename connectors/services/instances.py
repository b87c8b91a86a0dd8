"""Connector instance set-up and configuration (admin/owner only)."""
from __future__ import annotations

import logging
from urllib.parse import urlencode

from django.db import IntegrityError, transaction
from django.utils import timezone

from connectors.choices import ClosePolicy, CommandPolicy, ReopenPolicy, RunMode, SyncMode
from connectors.models import ConnectorInstance, RoutingRule
from issues.actors import Actor
from issues.exceptions import Conflict, InvalidInput, Unprocessable
from issues.models import Agent, Company, Goal, Project
from issues.services.activity import activity_record
from issues.services.lookups import company_object

from .common import adapter_class, adapter_for, conf, provider_known
from .interventions import require_admin, secret_input
from .mapping_check import CHECKED_FIELDS
from .routing_rules import rule_errors, rules_check
from .workflow_policy import workflow_defaults_errors, workflow_defaults_hook_errors

log = logging.getLogger("connectors.instances")

SECRET_WORDS = ("token", "secret", "password", "apikey", "api_key", "private_key", "credential")
CONFIG_FIELDS = {
    "base_url", "containers", "state_mapping", "config", "default_sync_mode", "default_run_mode", "field_policy",
    "write_policy", "wake_on_external_comment", "auto_import", "command_policy", "routing_aliases",
    "poll_interval_seconds", "reconcile_interval_seconds", "reconcile_batch_size", "project_id", "goal_id",
    "triage_agent_id", "service_account_id", "service_account_name", "name", "close_policy", "reopen_policy",
}


def webhook_url(instance: ConnectorInstance, scope: str | None = None) -> str:
    """The absolute URL a provider calls: ``PAPERCLIP_PUBLIC_URL`` + the webhook path (+ ``?scope=`` for a
    per-container registration). Signature checks that cover the URL (Trello) use exactly this, never the
    request's Host header, which a proxy or an attacker decides."""
    url = f"{conf('PUBLIC_BASE_URL').rstrip('/')}/api/connectors/{instance.pk}/webhook"
    return f"{url}?{urlencode({'scope': scope})}" if scope else url


def _no_inline_secrets(value, path="config") -> dict:
    errors = {}
    if isinstance(value, dict):
        for k, v in value.items():
            if any(word in str(k).lower().replace("-", "_") for word in SECRET_WORDS):
                errors[f"{path}.{k}"] = ["Secrets are never stored in configuration; use credentials/webhookSecret."]
            errors.update(_no_inline_secrets(v, f"{path}.{k}"))
    return errors


def _validate(company: Company, data: dict, provider_key: str) -> dict:
    errors = {}
    for field, enum in (("default_sync_mode", SyncMode), ("default_run_mode", RunMode),
                        ("command_policy", CommandPolicy), ("close_policy", ClosePolicy),
                        ("reopen_policy", ReopenPolicy)):
        if field in data and data[field] not in enum.values:
            errors[field] = [f"Must be one of {', '.join(enum.values)}."]
    if isinstance(data.get("config"), dict) and "autoCloseWhenIdle" in data["config"]:
        # migration 0005 moved it: a setting that would silently do nothing is refused
        errors["config.autoCloseWhenIdle"] = ["Replaced by closePolicy: 'auto_close' or 'conflict'."]
    if data.get("base_url") and provider_known(provider_key):
        refusal = (adapter_class(provider_key).base_url_refusal(data["base_url"]) if isinstance(data["base_url"], str)
                   else "Must be an https:// URL.")
        if refusal:
            errors["baseUrl"] = [refusal]
    if "containers" in data and (not isinstance(data["containers"], list)
                                 or not all(isinstance(c, str) and c.strip() for c in data["containers"])):
        errors["containers"] = ["A list of container names."]
    for field in ("state_mapping", "config", "field_policy", "write_policy", "routing_aliases"):
        if field in data and not isinstance(data[field], dict):
            errors[field] = ["Must be an object."]
    if isinstance(data.get("config"), dict):
        errors.update(_no_inline_secrets(data["config"]))
        errors.update(workflow_defaults_errors(data["config"]))
        errors.update(workflow_defaults_hook_errors(data["config"]))
        if provider_known(provider_key):
            errors.update(adapter_class(provider_key).config_errors(data["config"]))
    if isinstance(data.get("state_mapping"), dict) and provider_known(provider_key):
        for field, reasons in adapter_class(provider_key)(_blank_config()).validate_state_mapping(
                data["state_mapping"]).items():
            errors[f"stateMapping.{field}"] = reasons
    for field in ("poll_interval_seconds", "reconcile_interval_seconds", "reconcile_batch_size"):
        if field in data and (not isinstance(data[field], int) or data[field] <= 0):
            errors[field] = ["A positive integer."]
    if isinstance(data.get("routing_aliases"), dict):
        for alias, agent_id in data["routing_aliases"].items():
            try:
                ok = Agent.objects.filter(company=company, pk=agent_id).exists()
            except Exception:
                ok = False
            if not ok:
                errors[f"routingAliases.{alias}"] = ["No such agent in this company."]
    if errors:
        raise InvalidInput(details=errors)
    return data


def _run_mode_check(instance: ConnectorInstance):
    """A run mode the provider cannot drive with this configuration is refused (e.g. the Symphony profile
    on a Notion database without a status property: nothing would say a task became active)."""
    reason = adapter_for(instance, with_credentials=False).run_mode_refusal(instance.default_run_mode)
    if reason:
        raise Unprocessable(f"This connector cannot run {instance.default_run_mode}: {reason}",
                            code="run_mode_unsupported", details={"defaultRunMode": [reason]})


def _blank_config():
    from connectors.providers.base import AdapterConfig

    return AdapterConfig(base_url="", containers=(), state_mapping={})


def _resolve_references(company_id, fields: dict, routing_rules) -> dict:
    """Ids in the body resolve inside the company first: another company's id is a 404 (before any
    role check, so it answers exactly like an id that does not exist)."""
    resolved = {}
    for field, model, label in (("project_id", Project, "projectId"), ("goal_id", Goal, "goalId"),
                                ("triage_agent_id", Agent, "triageAgentId")):
        if field in fields:
            resolved[field] = company_object(model, company_id, fields[field], label)
    for rule in routing_rules or []:
        company_object(Agent, company_id, rule.get("agentId"), "agentId")
    return resolved


def instance_create(*, actor: Actor, company: Company, name: str, provider_key: str, credentials=None,
                    webhook_secret=None, routing_rules: list[dict] | None = None, **fields) -> ConnectorInstance:
    refs = _resolve_references(company.pk, fields, routing_rules)
    require_admin(actor, company.pk)
    if not (name or "").strip():
        raise InvalidInput(details={"name": ["This field may not be blank."]})
    if not provider_known(provider_key):
        raise InvalidInput(details={"provider": [f"Unknown provider '{provider_key}'."]})
    unknown = set(fields) - CONFIG_FIELDS
    if unknown:
        raise InvalidInput(details={k: ["Unknown field."] for k in unknown})
    _validate(company, fields, provider_key)
    rules_check(provider_key, routing_rules)
    default_poll = adapter_class(provider_key).default_poll_interval_seconds
    if default_poll and "poll_interval_seconds" not in fields:
        fields["poll_interval_seconds"] = default_poll
    with transaction.atomic():
        for field in ("project_id", "goal_id", "triage_agent_id"):
            fields.pop(field, None)
        project, goal, triage = refs.get("project_id"), refs.get("goal_id"), refs.get("triage_agent_id")
        instance = ConnectorInstance(company=company, name=name.strip(), provider_key=provider_key, project=project,
                                     goal=goal, triage_agent=triage,
                                     created_by_user=actor.user if actor.is_board else None, **fields)
        instance.credentials_ref = secret_input(credentials or "", company=company, name=f"{name} credentials",
                                                field="credentials")
        instance.webhook_secret_ref = secret_input(webhook_secret or "", company=company,
                                                   name=f"{name} webhook secret", field="webhookSecret")
        if not instance.webhook_secret_ref:  # the provider's first handshake may hand one over (Notion, Asana)
            from .webhook_setup import CREATION_WINDOW

            instance.handshake_open_until = timezone.now() + CREATION_WINDOW
        _run_mode_check(instance)
        try:
            with transaction.atomic():
                instance.save()
        except IntegrityError:
            raise Conflict("A connector with this name already exists in the company.", code="connector_name_taken",
                           details={"name": [name]})
        for order, rule in enumerate(routing_rules or []):
            routing_rule_create(instance=instance, order=rule.get("order", order), kind=rule.get("kind"),
                                match=rule.get("match") or {}, target_agent_id=rule.get("agentId"),
                                target_alias=rule.get("routingAlias") or "", enabled=rule.get("enabled", True))
        activity_record(actor=actor, company_id=company.pk, action="connector.created", entity_type="connector",
                        entity_id=instance.pk, details={"name": instance.name, "provider": provider_key,
                                                        "containers": instance.containers})
        # §7.2 "validated at setup": the mapping's shape was refused above (_validate); its check against
        # the live workflow reads the provider, so it runs after commit, as after an update.
        user_id = actor.user.pk if actor.is_board else None
        transaction.on_commit(lambda: _check_later(instance.pk, set(CHECKED_FIELDS), user_id, trigger="create"),
                              robust=True)
    return instance


def routing_rule_create(*, instance: ConnectorInstance, order: int, kind: str, match: dict, target_agent_id=None,
                        target_alias: str = "", enabled: bool = True) -> RoutingRule:
    errors = rule_errors(instance.provider_key, kind=kind, match=match, target_agent_id=target_agent_id,
                         target_alias=target_alias)
    if errors:
        raise InvalidInput(details={"routingRules": [errors]})
    agent = company_object(Agent, instance.company_id, target_agent_id, "agentId")
    return RoutingRule.objects.create(instance=instance, order=order, kind=kind, match=match, target_agent=agent,
                                      target_alias=target_alias or "", enabled=enabled)


def instance_update(*, actor: Actor, instance: ConnectorInstance, changes: dict,
                    routing_rules: list[dict] | None = None) -> ConnectorInstance:
    refs = _resolve_references(instance.company_id, changes, routing_rules)
    require_admin(actor, instance.company_id)
    unknown = set(changes) - CONFIG_FIELDS
    if unknown:
        raise InvalidInput(details={k: ["Unknown field."] for k in unknown})
    _validate(instance.company, changes, instance.provider_key)
    rules_check(instance.provider_key, routing_rules)
    with transaction.atomic():
        row = ConnectorInstance.objects.select_for_update().get(pk=instance.pk)
        before = {field: getattr(row, field) for field in CHECKED_FIELDS}
        for field, value in changes.items():
            if field in refs:
                setattr(row, field.removesuffix("_id"), refs[field])
            else:
                setattr(row, field, value)
        _run_mode_check(row)
        try:
            with transaction.atomic():
                row.save()
        except IntegrityError:
            raise Conflict("A connector with this name already exists in the company.", code="connector_name_taken",
                           details={"name": [changes.get("name")]})
        if routing_rules is not None:
            RoutingRule.objects.filter(instance=row).delete()
            for order, rule in enumerate(routing_rules):
                routing_rule_create(instance=row, order=rule.get("order", order), kind=rule.get("kind"),
                                    match=rule.get("match") or {}, target_agent_id=rule.get("agentId"),
                                    target_alias=rule.get("routingAlias") or "", enabled=rule.get("enabled", True))
        activity_record(actor=actor, company_id=row.company_id, action="connector.updated", entity_type="connector",
                        entity_id=row.pk, details={"fields": sorted(changes),
                                                   "routingRulesReplaced": routing_rules is not None})
        # §7.2 setup validation against the live workflow, after commit: it reads the provider, and its
        # outcome (health entries included) must never undo or fail the update itself.
        changed = {field for field in CHECKED_FIELDS if getattr(row, field) != before[field]}
        if changed:
            user_id = actor.user.pk if actor.is_board else None
            transaction.on_commit(lambda: _check_later(row.pk, changed, user_id), robust=True)
    return row


def _check_later(instance_id, changed: set, user_id, trigger: str = "update"):
    """Queue the mapping check (it calls the provider); with no broker the operator can run it on demand."""
    from connectors import tasks

    try:
        tasks.check_mapping.delay(str(instance_id), sorted(changed), user_id, trigger)
    except Exception:  # broker down: the update stands, the check is advisory
        log.warning("state mapping check for connector %s not queued", instance_id)
