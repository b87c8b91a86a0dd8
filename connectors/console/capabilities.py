"""What the console offers for a provider, from its declared capabilities (§5.2: "Host UX MUST degrade
gracefully (hide actions, explain gaps) based on declared capabilities").

Actions and write toggles name the adapter operation they need; one the provider does not implement is
hidden and listed as a gap instead (e.g. a read-only tracker shows no "Resync now" when it cannot read a
task back, no status-projection toggle, and a conflict's "Keep Paperclip" is replaced by the reason it
cannot reach the tracker)."""
from __future__ import annotations

from connectors.choices import ConflictKind
from connectors.models import ConnectorInstance, default_write_policy
from connectors.services.common import adapter_class

# console link action -> the operation it needs
LINK_ACTIONS = {"resync": "get_task"}
# §10.2 write toggle -> the operation it drives
TOGGLE_OPERATIONS = {
    "postBacklink": "set_backlink", "postProgressComments": "post_comment", "postArtifactLinks": "post_comment",
    "mirrorAgentComments": "post_comment", "postTranscripts": "post_comment", "projectStatus": "update_task_state",
    "mirrorExternalComments": "list_comments",
}
WHAT = {  # what a person loses without the operation
    "create_task": "export Paperclip issues as new tasks", "update_task_state": "project Paperclip status",
    "post_comment": "post comments (progress, replies, mirrors)", "set_fields": "write fields (title, description…)",
    "set_backlink": "set the Paperclip backlink", "get_task": "read a task again (resync)",
    "list_comments": "read comments", "get_task_states": "refresh states in batches",
    "list_candidate_tasks": "poll for tasks",
}
OPTIONAL_WRITES = ("create_task", "update_task_state", "post_comment", "set_fields", "set_backlink")


def operations(provider_key: str) -> frozenset[str]:
    try:
        return adapter_class(provider_key).capabilities.operations
    except LookupError:
        return frozenset()


def link_offers(provider_key: str) -> dict[str, bool]:
    """``{action: shown}`` for the link panel's actions (``export`` for the issue page's export action)."""
    ops = operations(provider_key)
    return {**{action: op in ops for action, op in LINK_ACTIONS.items()}, "export": "create_task" in ops}


def gaps(provider_key: str) -> list[str]:
    """What this provider's connector cannot do, in words (the optional writes it does not implement)."""
    ops = operations(provider_key)
    return [WHAT[op] for op in OPTIONAL_WRITES if op not in ops]


def write_toggles(instance: ConnectorInstance) -> dict:
    """The instance's §10.2 toggles the provider can honour (name, on) and the ones it cannot (name, why)."""
    ops = operations(instance.provider_key)
    policy = {**default_write_policy(), **(instance.write_policy or {})}
    available, unavailable = [], []
    for name in sorted(policy):
        op = TOGGLE_OPERATIONS.get(name)
        if op is not None and op not in ops:
            unavailable.append((name, f"the {instance.provider_key} connector cannot {WHAT.get(op, op)}"))
        else:
            available.append((name, bool(policy[name])))
    return {"available": available, "unavailable": unavailable}


def instance_capabilities(instance: ConnectorInstance) -> dict:
    """The health page's capability card: the declaration plus the toggles and gaps derived from it."""
    try:
        declared = adapter_class(instance.provider_key).capabilities.as_dict()
    except LookupError:
        declared = None
    return {"declared": declared, "toggles": write_toggles(instance), "gaps": gaps(instance.provider_key)}


def keep_paperclip_gap(conflict) -> str:
    """Why "Keep Paperclip" cannot write the tracker for this conflict ('' when it can, or writes nothing)."""
    if conflict.kind in (ConflictKind.ROUTING, ConflictKind.DELETION):
        return ""  # Paperclip-side decisions: nothing is written to the tracker
    op = "update_task_state" if conflict.kind == ConflictKind.CLOSURE or conflict.field == "state" else "set_fields"
    provider = conflict.link.provider_key
    if op in operations(provider):
        return ""
    return f"The {provider} connector cannot {WHAT[op]}"
