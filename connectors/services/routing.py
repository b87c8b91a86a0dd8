"""Agent routing (§8): the ordered rule pipeline, validated against the live agent registry, with
a guaranteed triage fallback."""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from functools import lru_cache

from django.db import connection

from connectors.choices import ROUTING_PRECEDENCE, RoutingRuleKind
from connectors.models import ConnectorInstance, RoutingRule
from connectors.providers.base import ExternalTask, normalize_state_name
from issues.choices import NOT_RUNNABLE_AGENT_STATUSES
from issues.models import Agent, Company
from paperclip.core import rows

from .common import adapter_class

UNAVAILABLE = NOT_RUNNABLE_AGENT_STATUSES


@dataclass
class RoutingDecision:
    agent: Agent | None
    kind: str  # the rule kind that chose, or "triage" / "none"
    rule_id: int | None = None
    reason: str = ""
    fell_back: bool = False  # no rule matched (or its target was unusable): triage
    problems: list[str] = field(default_factory=list)  # health entries to record

    def as_dict(self) -> dict:
        return {"agentId": str(self.agent.pk) if self.agent else None,
                "agentName": self.agent.name if self.agent else None, "kind": self.kind, "ruleId": self.rule_id,
                "reason": self.reason, "fellBack": self.fell_back}


def rules_for(instance: ConnectorInstance) -> list[RoutingRule]:
    """Enabled rules in pipeline order. A rule of a kind the adapter does not declare (stored before the
    check of routing_rules.py existed) is left out: nothing of the provider's could match it."""
    try:
        declared = adapter_class(instance.provider_key).capabilities.routing_rule_kinds
    except LookupError:
        declared = None
    rules = [r for r in _enabled_rules(instance) if declared is None or r.kind in declared]
    rules.sort(key=lambda r: (ROUTING_PRECEDENCE[r.kind], r.order, r.pk))
    return rules


@lru_cache(maxsize=1)
def _rules_sql() -> str:
    qn = connection.ops.quote_name
    return (f"SELECT {rows.select_list(RoutingRule, 'r')}, {rows.select_list(Agent, 'a')} "
            f"FROM {qn(RoutingRule._meta.db_table)} r LEFT JOIN {qn(Agent._meta.db_table)} a "
            f"ON a.id = r.target_agent_id WHERE r.instance_id = %s AND r.enabled")


def _enabled_rules(instance) -> list[RoutingRule]:
    """The instance's enabled rules with their target agents (every import reads them: a statement
    built once, not a compiled queryset)."""
    rules = []
    for row in rows.fetch_rows(_rules_sql(), [rows.pk_value(ConnectorInstance, instance.pk)]):
        rule, agent = rows.split(row, RoutingRule, Agent)
        RoutingRule.target_agent.field.set_cached_value(rule, agent if rule.target_agent_id else None)
        rules.append(rule)
    return rules


@lru_cache(maxsize=1)
def _agent_by_name_sql() -> str:
    return (f"SELECT {rows.select_list(Agent, 'a')} FROM {connection.ops.quote_name(Agent._meta.db_table)} a "
            f"WHERE a.company_id = %s AND LOWER(a.name) = %s ORDER BY a.name, a.id LIMIT 1")


def agent_by_name(company_id, name: str) -> Agent | None:
    name = (name or "").strip().lstrip("@").lower()
    if not name:
        return None
    return rows.fetch_one(Agent, _agent_by_name_sql(), [rows.pk_value(Company, company_id), name])[0]


def _alias_agent(instance: ConnectorInstance, alias: str) -> Agent | None:
    agent_id = (instance.routing_aliases or {}).get(alias)
    if not agent_id:
        return None
    try:
        return Agent.objects.filter(company_id=instance.company_id, pk=agent_id).first()
    except Exception:  # a malformed id in configuration
        return None


def _pattern_match(pattern: str, value: str) -> str | None:
    """fnmatch on lowercased values; returns the part matched by a trailing ``*`` (or '')."""
    pattern, value = (pattern or "").strip().lower(), (value or "").strip().lower()
    if not pattern or not fnmatch.fnmatchcase(value, pattern):
        return None
    if pattern.endswith("*") and "*" not in pattern[:-1] and value.startswith(pattern[:-1]):
        return value[len(pattern) - 1:]
    return ""


def _rule_match(rule: RoutingRule, task: ExternalTask, command_agent: str | None) -> tuple[bool, str | None]:
    """(matched, agent name captured from the input when the rule has no fixed target)."""
    m = rule.match or {}
    if rule.kind == RoutingRuleKind.COMMENT_COMMAND:
        return (command_agent is not None, command_agent)
    if rule.kind == RoutingRuleKind.CUSTOM_FIELD:
        # envelope["customFields"]: {field id: text, or a list of texts for a multi-valued field}
        fields = (task.envelope or {}).get("customFields") or {}
        value = fields.get(m.get("field"))
        for text in (value if isinstance(value, list) else [value] if value is not None else []):
            captured = _pattern_match(m.get("value", "*"), str(text))
            if captured is not None:
                return True, captured or str(text)
        return False, None
    if rule.kind == RoutingRuleKind.LABEL:
        for label in task.labels:
            captured = _pattern_match(m.get("label", ""), label)
            if captured is not None:
                return True, captured
        return False, None
    if rule.kind == RoutingRuleKind.STATE_LANE:
        return normalize_state_name(m.get("state")) == normalize_state_name(task.state.name), None
    if rule.kind == RoutingRuleKind.USER_MAPPING:
        wanted = {str(v).lower() for v in (m.get("externalUserIds") or [m.get("externalUserId")]) if v}
        wanted |= {str(v).lower() for v in (m.get("logins") or [m.get("login")]) if v}
        for actor in task.assignees:
            if actor.external_user_id.lower() in wanted or actor.display_name.lower() in wanted:
                return True, None
        return False, None
    if rule.kind == RoutingRuleKind.DEFAULT_ROUTE:
        return True, None
    return False, None


def _usable(agent: Agent | None, company_id) -> bool:
    return agent is not None and agent.company_id == company_id and agent.status not in UNAVAILABLE


def routing_resolve(*, instance: ConnectorInstance, task: ExternalTask, command_agent: str | None = None,
                    rules: list[RoutingRule] | None = None) -> RoutingDecision:
    """First matching enabled rule wins; a missing/paused target falls through to triage."""
    problems: list[str] = []
    for rule in rules if rules is not None else rules_for(instance):
        matched, captured = _rule_match(rule, task, command_agent)
        if not matched:
            continue
        if rule.target_agent_id:
            agent, label = rule.target_agent, f"agent {rule.target_agent.name if rule.target_agent else '?'}"
        elif rule.target_alias:
            agent, label = _alias_agent(instance, rule.target_alias), f"alias '{rule.target_alias}'"
        elif captured:
            agent, label = agent_by_name(instance.company_id, captured), f"agent '{captured}'"
        else:
            agent, label = None, "no target"
        if _usable(agent, instance.company_id):
            return RoutingDecision(agent=agent, kind=rule.kind, rule_id=rule.pk,
                                   reason=f"{rule.kind} rule #{rule.pk} -> {agent.name}")
        state = "missing" if agent is None else agent.status
        problems.append(f"{rule.kind} rule #{rule.pk} routes to {label}, which is {state}; using triage.")
        return _triage(instance, problems, reason=f"{rule.kind} rule #{rule.pk} target {state}")
    return _triage(instance, problems, reason="no routing rule matched")


def _triage(instance: ConnectorInstance, problems: list[str], reason: str) -> RoutingDecision:
    agent = instance.triage_agent if instance.triage_agent_id else None
    if _usable(agent, instance.company_id):
        return RoutingDecision(agent=agent, kind="triage", reason=reason, fell_back=True, problems=problems)
    problems.append("The triage fallback agent is " + ("not configured." if agent is None else f"{agent.status}."))
    return RoutingDecision(agent=None, kind="none", reason=reason, fell_back=True, problems=problems)
