"""Domain errors of the issues app (they carry their HTTP status; see paperclip.core.errors)."""
from paperclip.core.errors import ApiError, Conflict, Forbidden, InvalidInput, NotFound, Unauthorized, Unprocessable

__all__ = ["ApiError", "Conflict", "Forbidden", "InvalidInput", "NotFound", "Unauthorized", "Unprocessable"]


class CheckoutConflict(Conflict):
    code = "checkout_conflict"
    message = "Issue checkout conflict"  # upstream's wording, which clients match (ref §7)


class StatusNotExpected(Conflict):
    """A checkout refused because the issue's status is not one the caller expected (no run holds it)."""

    code = "status_not_expected"
    message = CheckoutConflict.message  # upstream answers every unclaimable checkout so; the code tells why


class AssignedElsewhere(Conflict):
    """A checkout refused because the issue is assigned to another agent or to a user (no live run holds it)."""

    code = "assigned_elsewhere"
    message = CheckoutConflict.message


class BlockedByOpenIssues(Unprocessable):
    """Entering in_progress (checkout or PATCH) while a blocker is neither done nor cancelled (ref §6)."""

    code = "blocked_by_open_issues"
    message = "Issue is blocked by unresolved blockers"

    def __init__(self, blockers):
        # Upstream's UUIDs, plus the identifiers this product has always listed.
        super().__init__(details={"unresolvedBlockerIssueIds": [str(b.pk) for b in blockers],
                                  "blockers": [b.identifier for b in blockers]})


class NotCheckoutOwner(Conflict):
    code = "not_checkout_owner"
    message = "This issue is in progress under another run; check it out first."


class NotYourIssue(Forbidden):
    """Upstream's message; an agent changes unassigned issues, its own, those it created and its reports'."""
    code = "not_your_issue"
    message = "Agent cannot mutate another agent's issue"


class StaleRevision(Conflict):
    code = "stale_revision"
    message = "The document changed since the base revision."
