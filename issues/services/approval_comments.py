"""Discussion on an approval (upstream Paperclip §5.3 ``/approvals/{id}/comments``).

Board users with a write role and agents of the approval's company may comment, in any status
(a decided approval can still be discussed). An agent comments from a live run, like every other
agent mutation. No wake: a decision is what wakes the requester (issues.services.approvals).
"""
from __future__ import annotations

from django.db import transaction

from issues.actors import Actor
from issues.exceptions import InvalidInput
from issues.models import Approval, ApprovalComment

from .activity import activity_record

BODY_MAX = 100_000  # generous; a request body is bounded anyway (PAPERCLIP_MAX_REQUEST_BYTES)


def approval_comment_add(*, actor: Actor, approval: Approval, body: str) -> ApprovalComment:
    actor.ensure_can_write(approval.company_id)
    if actor.is_agent:
        actor.named_live_run()  # approvals are not run-scoped (ref §2.3)
    if not isinstance(body, str) or not body.strip():
        raise InvalidInput(details={"body": ["This field may not be blank."]})
    if len(body) > BODY_MAX:
        raise InvalidInput(details={"body": [f"At most {BODY_MAX} characters."]})
    with transaction.atomic():
        comment = ApprovalComment.objects.create(
            company_id=approval.company_id, approval=approval, body=body, author_agent=actor.agent,
            author_user=actor.user if actor.is_board else None,
        )
        activity_record(actor=actor, company_id=approval.company_id, action="approval.comment_added",
                        entity_type="approval", entity_id=approval.pk, details={"commentId": str(comment.pk)})
    return comment
