"""Routing rule validation (§4.1.5, §5.2, §8.1): the one check in front of every write of a
``RoutingRule``. The instance services call it (so the API, the configuration import of the console
and the ``connector_create`` / ``connector_import`` commands get it), and the Django admin forms call
it too.

A rule is refused, with the offending key named, when its kind is not one the provider's adapter
declares in ``Capabilities.routing_rule_kinds`` (a rule of a kind the adapter cannot feed would
never match, silently), when its ``match`` lacks what the kind reads, or when the adapter refuses
the match (e.g. Jira names custom fields by id, ``customfield_10010``)."""
from __future__ import annotations

from connectors.choices import RoutingRuleKind
from issues.exceptions import InvalidInput

from .common import adapter_class, provider_known

# match keys each kind reads (a non-empty string each); user_mapping takes one of USER_KEYS.
REQUIRED_MATCH = {RoutingRuleKind.CUSTOM_FIELD: ("field",), RoutingRuleKind.LABEL: ("label",),
                  RoutingRuleKind.STATE_LANE: ("state",)}
USER_KEYS = ("externalUserId", "externalUserIds", "login", "logins")


def supported_kinds(provider_key: str) -> list[str]:
    """The kinds the provider's adapter declares, in pipeline order (§8.1)."""
    declared = adapter_class(provider_key).capabilities.routing_rule_kinds
    return [kind for kind in RoutingRuleKind.values if kind in declared]


def rule_errors(provider_key: str, *, kind, match, target_agent_id=None, target_alias: str = "") -> dict:
    """Key -> reasons for one rule of an instance of ``provider_key`` (empty when it may be stored)."""
    errors: dict[str, list[str]] = {}
    if kind not in RoutingRuleKind.values:
        errors["kind"] = [f"Must be one of {', '.join(RoutingRuleKind.values)}."]
    elif provider_known(provider_key) and kind not in supported_kinds(provider_key):
        errors["kind"] = [f"The {provider_key} connector does not support {kind} routing rules "
                          f"(supported: {', '.join(supported_kinds(provider_key))})."]
    if not isinstance(match, dict):
        errors["match"] = ["Must be an object."]
    elif "kind" not in errors:
        for key in REQUIRED_MATCH.get(kind, ()):
            if not isinstance(match.get(key), str) or not match[key].strip():
                errors[f"match.{key}"] = [f"A {kind} rule needs match.{key} (a non-empty string)."]
        if kind == RoutingRuleKind.USER_MAPPING and not any(match.get(k) for k in USER_KEYS):
            errors["match"] = [f"A user_mapping rule names the external user: one of {', '.join(USER_KEYS)}."]
        if provider_known(provider_key):
            for key, reasons in adapter_class(provider_key).routing_match_errors(kind, match).items():
                errors[f"match.{key}"] = list(reasons)
    if target_agent_id and target_alias:
        errors["target"] = ["Give agentId or routingAlias, not both."]
    return errors


def rules_check(provider_key: str, rules: list[dict] | None) -> None:
    """Refuse the whole list before anything is written; ``details.routingRules`` has one entry per rule
    (``{}`` for a valid one), as the API's own list validation answers."""
    if not rules:
        return
    per_rule = [rule_errors(provider_key, kind=rule.get("kind"), match=rule.get("match") or {},
                            target_agent_id=rule.get("agentId"), target_alias=rule.get("routingAlias") or "")
                if isinstance(rule, dict) else {"rule": ["Must be an object."]} for rule in rules]
    if any(per_rule):
        first = next(f"routingRules[{i}].{key}: {reasons[0]}" for i, errs in enumerate(per_rule) if errs
                     for key, reasons in errs.items())
        raise InvalidInput(f"Routing rule refused: {first}", details={"routingRules": per_rule})

