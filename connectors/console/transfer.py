"""Export/import of a connector instance's configuration (``connector_export`` / ``connector_import``).

The document names agents, the project and the goal by name (ids differ between installations)
and carries credentials only as **references** (``env:NAME`` or ``secret:<uuid>``): a secret value
is never read, decrypted or written. Import creates the instance or updates the one with the same
name (case-insensitive) in the target company through the instance services; importing the same
document twice changes nothing the second time."""
from __future__ import annotations

from django.db import transaction
from django.db.models.functions import Lower

from connectors.models import ConnectorInstance, RoutingRule
from issues.exceptions import InvalidInput
from issues.models import Agent, Goal, Project

FORMAT = "paperclip.connector/1"
PLAIN = {  # document key -> model field
    "baseUrl": "base_url", "containers": "containers", "stateMapping": "state_mapping", "config": "config",
    "defaultSyncMode": "default_sync_mode", "defaultRunMode": "default_run_mode", "fieldPolicy": "field_policy",
    "writePolicy": "write_policy", "wakeOnExternalComment": "wake_on_external_comment", "autoImport": "auto_import",
    "commandPolicy": "command_policy", "pollIntervalSeconds": "poll_interval_seconds",
    "reconcileIntervalSeconds": "reconcile_interval_seconds", "reconcileBatchSize": "reconcile_batch_size",
    "serviceAccountId": "service_account_id", "serviceAccountName": "service_account_name",
    "closePolicy": "close_policy", "reopenPolicy": "reopen_policy",
}
NAMED = {"project": (Project, "name"), "goal": (Goal, "title"), "triageAgent": (Agent, "name")}
KNOWN = {"name", "provider", "credentials", "webhookSecret", "routingAliases", "routingRules", *PLAIN, *NAMED}
RULE_KEYS = {"order", "kind", "match", "agent", "routingAlias", "enabled"}


def instance_export(instance: ConnectorInstance) -> dict:
    agents = dict(Agent.objects.filter(company_id=instance.company_id).values_list("pk", "name"))
    connector = {"name": instance.name, "provider": instance.provider_key,
                 **{key: getattr(instance, field) for key, field in PLAIN.items()},
                 "project": instance.project.name if instance.project_id else None,
                 "goal": instance.goal.title if instance.goal_id else None,
                 "triageAgent": instance.triage_agent.name if instance.triage_agent_id else None,
                 "credentials": instance.credentials_ref, "webhookSecret": instance.webhook_secret_ref,
                 "routingAliases": {alias: agents.get(_uuid(agent_id), agent_id)
                                    for alias, agent_id in sorted((instance.routing_aliases or {}).items())},
                 "routingRules": [{"order": r.order, "kind": r.kind, "match": r.match,
                                   "agent": r.target_agent.name if r.target_agent_id else None,
                                   "routingAlias": r.target_alias, "enabled": r.enabled}
                                  for r in RoutingRule.objects.filter(instance=instance)
                                  .select_related("target_agent").order_by("order", "id")]}
    return {"format": FORMAT, "connector": connector}


def _uuid(value):
    import uuid

    try:
        return uuid.UUID(str(value))
    except ValueError:
        return value


def _by_name(model, field, company, value, label):
    if value in (None, ""):
        return None
    row = (model.objects.annotate(_n=Lower(field)).filter(company=company, _n=str(value).lower()).first())
    if row is None:
        raise InvalidInput(f"{label} '{value}' does not exist in {company.issue_prefix}.",
                           details={label: [f"No {model._meta.verbose_name} named '{value}' in this company."]})
    return row


def parse_document(document, company) -> tuple[str, str, dict, list[dict], dict]:
    """(name, provider, service fields, routing rules, secrets) from an export document."""
    if not isinstance(document, dict) or document.get("format") != FORMAT or not isinstance(
            document.get("connector"), dict):
        raise InvalidInput(f"Not a connector export (expected an object with format '{FORMAT}' and 'connector').",
                           details={"format": [f"Expected '{FORMAT}'."]})
    data = document["connector"]
    unknown = sorted(set(data) - KNOWN)
    if unknown:
        raise InvalidInput(f"Unknown keys: {', '.join(unknown)}.", details={k: ["Unknown key."] for k in unknown})
    for key in ("name", "provider"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise InvalidInput(f"'{key}' is required.", details={key: ["This field is required."]})
    fields = {PLAIN[k]: v for k, v in data.items() if k in PLAIN}
    for key, (model, attr) in NAMED.items():
        if key in data:
            row = _by_name(model, attr, company, data[key], key)
            fields[f"{key if key != 'triageAgent' else 'triage_agent'}_id"] = row.pk if row else None
    aliases = data.get("routingAliases") or {}
    if not isinstance(aliases, dict):
        raise InvalidInput("'routingAliases' must be an object.", details={"routingAliases": ["Must be an object."]})
    if "routingAliases" in data:
        fields["routing_aliases"] = {alias: str(_by_name(Agent, "name", company, name, f"routingAliases.{alias}").pk)
                                     for alias, name in aliases.items()}
    rules = [] if "routingRules" in data else None
    for i, rule in enumerate(data.get("routingRules") or []):
        if not isinstance(rule, dict) or set(rule) - RULE_KEYS:
            raise InvalidInput(f"routingRules[{i}] has unknown keys.",
                               details={f"routingRules[{i}]": [f"Allowed keys: {', '.join(sorted(RULE_KEYS))}."]})
        agent = _by_name(Agent, "name", company, rule.get("agent"), f"routingRules[{i}].agent")
        rules.append({"order": rule.get("order", i), "kind": rule.get("kind"), "match": rule.get("match") or {},
                      "agentId": str(agent.pk) if agent else None, "routingAlias": rule.get("routingAlias") or "",
                      "enabled": rule.get("enabled", True)})
    if not isinstance(data.get("routingRules") or [], list):
        raise InvalidInput("'routingRules' must be a list.", details={"routingRules": ["Must be a list."]})
    secrets = {}
    for key in ("credentials", "webhookSecret"):
        value = data.get(key)
        if value is not None and not isinstance(value, str):
            raise InvalidInput(f"'{key}' must be a secret reference (env:NAME or secret:<id>), never a value.",
                               details={key: ["A reference string."]})
        secrets[key] = value
    return data["name"].strip(), data["provider"].strip(), fields, rules, secrets


def instance_import(*, actor, company, document) -> tuple[ConnectorInstance, str]:
    """Create or update; returns ``(instance, "created" | "updated" | "unchanged")``."""
    from connectors.services.instances import instance_create, instance_update
    from connectors.services.interventions import credentials_rotate

    name, provider, fields, rules, secrets = parse_document(document, company)
    existing = (ConnectorInstance.objects.annotate(_n=Lower("name"))
                .filter(company=company, _n=name.lower()).first())
    with transaction.atomic():
        if existing is None:
            instance = instance_create(actor=actor, company=company, name=name, provider_key=provider,
                                       credentials=secrets["credentials"] or "",
                                       webhook_secret=secrets["webhookSecret"] or "",
                                       routing_rules=rules, **fields)
            return instance, "created"
        if existing.provider_key != provider:
            raise InvalidInput(f"Connector '{existing.name}' exists with provider {existing.provider_key}, "
                               f"not {provider}.", details={"provider": ["Differs from the existing connector."]})
        before = instance_export(existing)
        normalized = dict(document["connector"], name=existing.name)
        if _same(before["connector"], normalized):
            return existing, "unchanged"
        instance = instance_update(actor=actor, instance=existing, changes={"name": name, **fields},
                                   routing_rules=rules)
        changed = {k: v for k, v in (("credentials", secrets["credentials"]),
                                     ("webhook_secret", secrets["webhookSecret"]))
                   if v is not None and v != getattr(instance, "credentials_ref" if k == "credentials" else "webhook_secret_ref")}
        if changed:
            import uuid

            credentials_rotate(actor=actor, instance=instance, idempotency_key=f"import-{uuid.uuid4()}",
                               reason="connector_import", **changed)
            instance.refresh_from_db()
        return instance, "updated"


def _fold(name):
    return name.lower() if isinstance(name, str) else name


def _normal(key: str, value):
    """One document value in a comparable form (names match case-insensitively, as on import)."""
    if key == "routingRules":
        return [{"order": r.get("order", i), "kind": r.get("kind"), "match": r.get("match") or {},
                 "agent": _fold(r.get("agent")), "routingAlias": r.get("routingAlias") or "",
                 "enabled": r.get("enabled", True)} for i, r in enumerate(value or [])]
    if key == "routingAliases":
        return {alias: _fold(name) for alias, name in (value or {}).items()}
    if key in NAMED:
        return _fold(value) or None
    if key in ("credentials", "webhookSecret"):
        return value or ""
    return value


def _same(exported: dict, incoming: dict) -> bool:
    """Whether applying ``incoming`` would leave the instance as it is (missing keys keep their value)."""
    return all(_normal(key, exported.get(key)) == _normal(key, value) for key, value in incoming.items())
