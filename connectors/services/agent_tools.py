"""Connector agent tools (§10.1, §11.3): what an agent may do to a linked external task during a
heartbeat, through the same services and policy checks as the board and the write engine.

Authorization (one rule for every tool):
- only agents use these tools (board users have the conflict queue and the board API);
- the issue behind the link must be assigned to the calling agent (same company, someone else's
  issue: 403 ``not_assignee``; another company's ids are 404 before this is reached);
- a write additionally needs the calling run to hold the issue's checkout (the run header names a
  live run of the agent and the issue is in progress under it: 409 ``not_checkout_owner``), the
  same claim every other agent write respects (§14.4);
- ``unlink`` stays with board users (403 ``board_only``): breaking the link is an operator decision.

The comment tool is governed by ``postProgressComments``: it is the agent's deliberate, concise
message to the people on the tracker, the same kind of text as a progress comment, while
``mirrorAgentComments`` governs the automatic mirroring of the whole Paperclip thread (off by default)
and does not enable it. A refused write is a 409 ``outbound_write_refused`` with the reason.
"""
from __future__ import annotations

import logging

from django.db import transaction

from connectors.choices import ConflictStatus, OutboundKind
from connectors.models import Conflict, OutboundEffect, TaskLink
from issues.actors import Actor
from issues.choices import IssueStatus
from issues.exceptions import Conflict as ConflictError
from issues.exceptions import Forbidden, InvalidInput, NotCheckoutOwner
from issues.models import Issue
from issues.selectors import list_window
from issues.services.activity import activity_record
from issues.services.fences import ensure_owning_run

log = logging.getLogger("connectors.agent_tools")

COMMENT_TOGGLE = "postProgressComments"
COMMENT_MAX_LENGTH = 10_000
SOURCE_PREFIX = "agent-tool"


def require_agent(actor: Actor):
    if not actor.is_agent:
        raise Forbidden("Connector agent tools are for agents; board users use the connector API.",
                        code="agent_only")


def require_agent_issue(actor: Actor, issue: Issue, *, write: bool):
    """The tool rule above for one issue; ``write`` also demands the calling run's checkout."""
    require_agent(actor)
    if issue.assignee_agent_id != actor.agent.pk:
        raise Forbidden("Connector tools act only on issues assigned to you.", code="not_assignee",
                        details={"issueId": str(issue.pk)})
    if not write:
        return
    ensure_owning_run(actor, issue)  # the host's rule: an in-progress issue is written by its checkout run
    if issue.status != IssueStatus.IN_PROGRESS:  # ...and a tool write needs that checkout to exist at all
        raise NotCheckoutOwner("Check the issue out with this run before writing through its links.",
                               details={"issueId": str(issue.pk), "status": issue.status})


def agent_conflicts(*, actor: Actor, issue: Issue | None = None, params=None):
    """Open conflicts on the links of the agent's issues (or of one of them, checked by the rule)."""
    require_agent(actor)
    if issue is not None:
        require_agent_issue(actor, issue, write=False)
    qs = Conflict.objects.filter(company_id=actor.agent.company_id, status=ConflictStatus.OPEN,
                                 link__issue__assignee_agent_id=actor.agent.pk)
    if issue is not None:
        qs = qs.filter(link__issue_id=issue.pk)
    limit, offset = list_window(params or {})
    return qs.select_related("link").order_by("detected_at", "id")[offset:offset + limit]


def link_comment_post(*, actor: Actor, link: TaskLink, body: str, idempotency_key: str) -> tuple[OutboundEffect, bool]:
    """Queue one agent comment on the linked external task through the write engine.
    Returns (effect, replayed); the same key with the same body returns the first effect."""
    from .outbound import effect_record, write_refusal

    require_agent(actor)
    key = (idempotency_key or "").strip()[:200]
    if not key:
        raise InvalidInput(details={"idempotencyKey": ["This field is required."]})
    if not body or not body.strip():
        raise InvalidInput(details={"body": ["This field may not be blank."]})
    with transaction.atomic():
        # The issue lock serializes with checkout/release and with every other write to the issue
        # (effect_record relies on it); the link is re-read for its current status and policy.
        issue = Issue.objects.select_for_update().get(pk=link.issue_id)
        require_agent_issue(actor, issue, write=True)
        link = TaskLink.objects.select_related("instance").get(pk=link.pk)
        link.issue = issue
        source_id = f"{SOURCE_PREFIX}:{actor.agent.pk}:{key}"
        existing = OutboundEffect.objects.filter(link=link, kind=OutboundKind.COMMENT, source_id=source_id).first()
        if existing is not None:
            if (existing.payload or {}).get("lines") != [body]:
                raise ConflictError("This idempotency key was used for another comment.",
                                    code="idempotency_key_reused", details={"idempotencyKey": [key]})
            return existing, True
        refusal = write_refusal(link, OutboundKind.COMMENT, toggle=COMMENT_TOGGLE)
        if refusal:
            log.info("agent tool comment refused: instance=%s provider=%s link=%s task=%s issue=%s key=%s: %s",
                     link.instance_id, link.provider_key, link.pk, link.external_task_id, issue.pk, key, refusal)
            raise ConflictError(f"The link's write policy refuses this comment: {refusal}.",
                                code="outbound_write_refused",
                                details={"reason": refusal, "linkId": str(link.pk), "syncMode": link.sync_mode,
                                         "toggle": COMMENT_TOGGLE})
        # No milestone: an explicit, keyed tool call is not progress chatter to debounce or batch.
        effect = effect_record(link=link, kind=OutboundKind.COMMENT, source_id=source_id,
                               payload={"lines": [body], "agent": actor.agent.name, "issueId": str(issue.pk),
                                        "tool": "connector.comment", "runId": str(actor.run_ref)})
        activity_record(actor=actor, company_id=link.company_id, action="connector.agent_tool_comment",
                        entity_type="connector_link", entity_id=link.pk,
                        details={"instanceId": str(link.instance_id), "issueId": str(issue.pk),
                                 "outboundEffectId": effect.pk, "idempotencyKey": key,
                                 "externalTaskId": link.external_task_id, "externalKey": link.external_key})
    return effect, False
