"""The console's connector setup form: what it shows (initial values, the provider's explanations) and how a
POST becomes the arguments of ``instance_create`` / ``instance_update``.

Parsing only turns text into the shapes the service takes (lines into a list, JSON text into objects, rule
rows into rule dicts); every rule about those values is the service's, and its field errors are mapped back
onto the form fields here (``errors_from``). Secrets are references: a value typed into a "store a new
secret" box is never rendered back."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from connectors.choices import FieldOwner, RoutingRuleKind, RunMode, SyncMode
from connectors.models import ConnectorInstance, default_field_policy, default_write_policy
from connectors.providers.base import TaskSourceAdapter, adapter_class, provider_keys
from connectors.services.routing_rules import supported_kinds
from issues.exceptions import ApiError
from issues.models import Agent

from . import capabilities

BLANK_RULE_ROWS = 2  # empty rows offered below the existing rules (no JavaScript needed to add one)
SECRET_FIELDS = ("credentials", "webhook_secret")

# What every provider's form says; the adapter's ``setup_help`` adds (or replaces) the provider's own words.
GENERIC_HELP = {
    "name": "How this connector is called in the console, activity and logs (unique in the company).",
    "containers": "One container per line: the repositories, teams, projects, boards or databases this "
                  "connector reads.",
    "baseUrl": "The provider's API root. Leave empty for the provider's default.",
    "credentials": "A secret reference: env:NAME (a variable the server's allow-list gives this company) or a stored "
                   "secret. To store a new one, type it in the second box: it is encrypted and only its "
                   "reference is kept.",
    "webhookSecret": "The secret the provider signs deliveries with, as a reference like the credentials.",
    "serviceAccountId": "The provider user the connector writes as: its own changes are echoes, never "
                        "imported back.",
    "stateMapping": "A JSON object: which provider states mean backlog, active, review, blocked or terminal.",
    "config": "Provider-specific settings as a JSON object (never secrets).",
    "routingRules": "Who takes a new task: rules are tried in order, the first match assigns its agent; "
                    "without a match the triage agent does.",
    "fieldPolicy": "Which side owns each field: external (the tracker wins), paperclip (Paperclip wins, "
                   "written to the tracker) or shared (both; differences become conflicts).",
    "writePolicy": "What the connector writes back to the tracker.",
    "syncMode": "The default for new links: import only, export only, bidirectional, observer or disabled.",
    "runMode": "Who drives the work: Paperclip, the Symphony profile (tracker state wakes agents) or an "
               "external observer (nothing is woken).",
    "triageAgent": "The agent that takes tasks no routing rule matches.",
    "webhooks": "Configure the provider to call the webhook URL shown on the connector's page.",
}
# form field -> the key of its explanation (and of the service's error details)
HELP_KEYS = {"name": "name", "containers": "containers", "base_url": "baseUrl", "credentials": "credentials",
             "webhook_secret": "webhookSecret", "service_account_id": "serviceAccountId",
             "state_mapping": "stateMapping", "config": "config", "rules": "routingRules",
             "field_policy": "fieldPolicy", "write_policy": "writePolicy", "sync_mode": "syncMode",
             "run_mode": "runMode", "triage_agent": "triageAgent"}
# a key of the service's error details -> the form field it belongs to
ERROR_FIELDS = {
    **{key: form_field for form_field, key in HELP_KEYS.items()},
    "base_url": "base_url", "state_mapping": "state_mapping", "default_sync_mode": "sync_mode",
    "defaultSyncMode": "sync_mode", "default_run_mode": "run_mode", "defaultRunMode": "run_mode",
    "field_policy": "field_policy", "write_policy": "write_policy", "triageAgentId": "triage_agent",
    "triage_agent_id": "triage_agent", "service_account_id": "service_account_id", "agentId": "rules",
}
FIELD_OWNERS = FieldOwner.choices
FIELD_LABELS = {"title": "Title", "description": "Description", "priority": "Priority", "labels": "Labels",
                "dueAt": "Due date", "state": "State"}


def providers() -> list[dict]:
    """Every registered provider (whatever ``provider_keys()`` returns), for the provider choice."""
    return [provider_info(key) for key in provider_keys()]


def provider_info(key: str) -> dict:
    cls = adapter_class(key)
    help_texts = {**GENERIC_HELP, **dict(cls.setup_help or {})}
    return {"key": key, "name": cls.display_name or key, "cls": cls, "help": help_texts,
            "default_base_url": getattr(cls, "default_base_url", ""),
            "state_mapping_example": (cls.setup_help or {}).get("stateMappingExample", ""),
            "handshake": cls.webhook_handshake is not TaskSourceAdapter.webhook_handshake,
            "registers_webhooks": "register_webhook" in cls.capabilities.operations}


@dataclass
class SetupForm:
    """The values the form shows, and the errors next to them (``errors``: form field -> reasons;
    ``rule_errors``: one dict per rule row)."""

    provider: dict
    values: dict
    instance: ConnectorInstance | None = None
    errors: dict = field(default_factory=dict)
    rule_errors: dict = field(default_factory=dict)
    general: list = field(default_factory=list)

    # ---------------------------------------------------------------------------------- rendering
    def context(self, company) -> dict:
        provider, values = self.provider, self.values
        cls = provider["cls"]
        policy = {**default_write_policy(), **values["write_policy"]}
        ops = cls.capabilities.operations
        toggles = [{"name": name, "on": bool(policy[name]),
                    "unavailable": (f"the {provider['key']} connector cannot "
                                    f"{capabilities.WHAT.get(capabilities.TOGGLE_OPERATIONS[name])}"
                                    if capabilities.TOGGLE_OPERATIONS.get(name) not in (None, *ops) else "")}
                   for name in sorted(policy)]
        owners = {**default_field_policy(), **values["field_policy"]}
        rows = [{**row, "index": i, "errors": self.rule_errors.get(i, {})} for i, row in enumerate(values["rules"])]
        fields = {name: {"help": provider["help"].get(key, ""), "errors": self.errors.get(name, [])}
                  for name, key in HELP_KEYS.items()}
        return {"provider": provider, "values": values, "fields": fields, "toggles": toggles,
                "field_owners": [{"name": name, "label": FIELD_LABELS.get(name, name), "owner": owner}
                                 for name, owner in owners.items()],
                "owner_choices": FIELD_OWNERS, "rule_rows": rows,
                "rule_kinds": [(k, RoutingRuleKind(k).label if k in RoutingRuleKind.values else k)
                               for k in supported_kinds(provider["key"])],
                "rule_kind_values": supported_kinds(provider["key"]), "sync_modes": SyncMode.choices,
                "run_modes": RunMode.choices,
                "agents": list(Agent.objects.filter(company=company).order_by("name").values_list("pk", "name")),
                "form_errors": self.general, "has_errors": bool(self.errors or self.rule_errors or self.general),
                "instance": self.instance, "webhook_help": provider["help"].get("webhooks", "")}

    # ---------------------------------------------------------------------------------- errors
    def add_error(self, form_field: str, reason: str):
        self.errors.setdefault(form_field, []).append(reason)

    def errors_from(self, exc: ApiError, rule_rows: list[int]):
        """Put the service's ``details`` next to the fields they name (``rule_rows``: the form row of each
        submitted rule, blank rows being skipped); anything unplaced is a form-level error."""
        details = exc.details if isinstance(exc.details, dict) else {}
        unplaced = {}
        for key, reasons in details.items():
            head, _, rest = str(key).partition(".")
            if head == "routingRules" and isinstance(reasons, list) and all(isinstance(r, dict) for r in reasons):
                for position, rule in enumerate(reasons):
                    if rule and position < len(rule_rows):
                        self.rule_errors[rule_rows[position]] = {
                            k: " ".join(str(r) for r in v) if isinstance(v, (list, tuple)) else str(v)
                            for k, v in rule.items()}
                continue
            form_field = ERROR_FIELDS.get(head)
            if form_field is None:
                unplaced[key] = reasons
                continue
            if getattr(exc, "code", "") == "connector_name_taken":
                reasons = [exc.message]  # its details carry the name itself
            for reason in reasons if isinstance(reasons, (list, tuple)) else [reasons]:
                self.add_error(form_field, f"{rest}: {reason}" if rest else str(reason))
        if unplaced or not details:
            self.general.append(" — ".join([exc.message] + [
                f"{k}: {' '.join(str(r) for r in v) if isinstance(v, (list, tuple)) else v}"
                for k, v in unplaced.items()]))


# -------------------------------------------------------------------------------------- initial values
def initial_values(provider: dict, instance: ConnectorInstance | None = None) -> dict:
    if instance is None:
        return {"name": "", "containers": "", "base_url": "", "credentials_ref": "", "webhook_secret_ref": "",
                "service_account_id": "", "state_mapping": provider["state_mapping_example"] or "{}",
                "config": "{}", "field_policy": default_field_policy(), "write_policy": default_write_policy(),
                "sync_mode": SyncMode.IMPORT_ONLY, "run_mode": RunMode.PAPERCLIP_CONTROLLED, "triage_agent": "",
                "rules": [_blank_rule() for _ in range(BLANK_RULE_ROWS)]}
    rules = [{"kind": r.kind, "match": _match_text(r.match), "agent": str(r.target_agent_id or ""),
              "alias": r.target_alias, "enabled": r.enabled}
             for r in instance.routing_rules.order_by("order", "id")]
    return {"name": instance.name, "containers": "\n".join(str(c) for c in instance.containers or ()),
            "base_url": instance.base_url, "credentials_ref": instance.credentials_ref,
            "webhook_secret_ref": instance.webhook_secret_ref, "service_account_id": instance.service_account_id,
            "state_mapping": _json_text(instance.state_mapping), "config": _json_text(instance.config),
            "field_policy": dict(instance.field_policy or {}), "write_policy": dict(instance.write_policy or {}),
            "sync_mode": instance.default_sync_mode, "run_mode": instance.default_run_mode,
            "triage_agent": str(instance.triage_agent_id or ""),
            "rules": rules + [_blank_rule() for _ in range(BLANK_RULE_ROWS)]}


def _blank_rule() -> dict:
    return {"kind": "", "match": "", "agent": "", "alias": "", "enabled": True}


def _json_text(value) -> str:
    return json.dumps(value or {}, indent=2, ensure_ascii=False)


def _match_text(match) -> str:
    """``label=backend``-style pairs when every value is a plain string, else the JSON object."""
    if isinstance(match, dict) and all(isinstance(v, str) and ";" not in v and "=" not in v for v in match.values()):
        return "; ".join(f"{k}={v}" for k, v in match.items())
    return json.dumps(match, ensure_ascii=False)


# -------------------------------------------------------------------------------------- parsing a POST
@dataclass
class Submitted:
    """What a POST asks for: the service's config fields, the rules (and their form rows), the secret inputs
    (``{"ref": "env:X" | "secret:…" | "", "new": plaintext or ""}``) and parse errors."""

    values: dict
    fields: dict
    rules: list
    rule_rows: list
    secrets: dict
    form: SetupForm


def parse(post, provider: dict, instance: ConnectorInstance | None = None) -> Submitted:
    values = {
        "name": (post.get("name") or "").strip(),
        "containers": post.get("containers") or "",
        "base_url": (post.get("base_url") or "").strip(),
        "credentials_ref": (post.get("credentials_ref") or "").strip(),
        "webhook_secret_ref": (post.get("webhook_secret_ref") or "").strip(),
        "service_account_id": (post.get("service_account_id") or "").strip(),
        "state_mapping": post.get("state_mapping") or "",
        "config": post.get("config") or "",
        "field_policy": {name: post.get(f"field_policy.{name}") for name in
                         {**default_field_policy(), **((instance.field_policy or {}) if instance else {})}
                         if post.get(f"field_policy.{name}")},
        "write_policy": {name: post.get(f"write_policy.{name}") == "on"
                         for name in {**default_write_policy(), **((instance.write_policy or {}) if instance else {})}},
        "sync_mode": post.get("sync_mode") or "",
        "run_mode": post.get("run_mode") or "",
        "triage_agent": (post.get("triage_agent") or "").strip(),
        "rules": [],
    }
    form = SetupForm(provider=provider, values=values, instance=instance)
    containers = [line.strip() for line in values["containers"].splitlines() if line.strip()]
    fields = {"containers": containers, "base_url": values["base_url"],
              "service_account_id": values["service_account_id"], "field_policy": values["field_policy"],
              "write_policy": values["write_policy"], "default_sync_mode": values["sync_mode"],
              "default_run_mode": values["run_mode"], "triage_agent_id": values["triage_agent"] or None}
    for name in ("state_mapping", "config"):
        text = values[name].strip() or "{}"
        try:
            fields[name] = json.loads(text)
        except json.JSONDecodeError as exc:
            form.add_error(name, f"Not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno}).")
    rules, rule_rows = [], []
    count = _row_count(post)
    for i in range(count):
        row = {"kind": (post.get(f"rule-{i}-kind") or "").strip(), "match": (post.get(f"rule-{i}-match") or "").strip(),
               "agent": (post.get(f"rule-{i}-agent") or "").strip(), "alias": (post.get(f"rule-{i}-alias") or "").strip(),
               "enabled": post.get(f"rule-{i}-enabled") == "on"}
        values["rules"].append(row)
        if not (row["kind"] or row["match"] or row["agent"] or row["alias"]):
            continue  # a blank row
        match, reason = _parse_match(row["match"])
        if reason:
            form.rule_errors[i] = {"match": reason}
            continue
        rules.append({"kind": row["kind"], "match": match, "agentId": row["agent"] or None,
                      "routingAlias": row["alias"], "enabled": row["enabled"]})
        rule_rows.append(i)
    if not any(not (r["kind"] or r["match"] or r["agent"] or r["alias"]) for r in values["rules"]):
        values["rules"].append(_blank_rule())  # always one empty row to add a rule with
    secrets = {name: {"ref": values[f"{name}_ref"], "new": post.get(f"{name}_new") or ""} for name in SECRET_FIELDS}
    return Submitted(values=values, fields=fields, rules=rules, rule_rows=rule_rows, secrets=secrets, form=form)


def _row_count(post) -> int:
    try:
        return max(0, min(100, int(post.get("rule_rows") or 0)))
    except ValueError:
        return 0


def _parse_match(text: str) -> tuple[dict, str]:
    """``{"label": "backend"}`` (JSON) or ``label=backend; state=QA`` pairs -> (match, error reason)."""
    if not text:
        return {}, ""
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            return {}, f"Not valid JSON: {exc.msg}."
        return (value, "") if isinstance(value, dict) else ({}, "A JSON object or key=value pairs.")
    match = {}
    for part in text.split(";"):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            return {}, f"'{part.strip()}' is not key=value (e.g. label=backend)."
        match[key.strip()] = value.strip()
    return match, ""
