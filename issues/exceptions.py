"""Domain errors of the issues app (they carry their HTTP status; see paperclip.core.errors)."""
from paperclip.core.errors import ApiError, Conflict, Forbidden, InvalidInput, NotFound, Unauthorized, Unprocessable

__all__ = ["ApiError", "Conflict", "Forbidden", "InvalidInput", "NotFound", "Unauthorized", "Unprocessable"]


class CheckoutConflict(Conflict):
    code = "checkout_conflict"
    message = "Issue is checked out by another run."


class StatusNotExpected(Conflict):
    """A checkout refused because the issue's status is not one the caller expected (no run holds it)."""

    code = "status_not_expected"
    message = "The issue's status is not one of expectedStatuses."


class AssignedElsewhere(Conflict):
    """A checkout refused because the issue is assigned to another agent or to a user (no live run holds it)."""

    code = "assigned_elsewhere"
    message = "The issue is assigned to someone else."


class NotCheckoutOwner(Conflict):
    code = "not_checkout_owner"
    message = "This issue is in progress under another run; check it out first."


class NotYourIssue(Forbidden):
    code = "not_your_issue"
    message = ("Agents change only issues assigned to them, created by them, or assigned to an agent "
               "below them in the chain of command.")


class StaleRevision(Conflict):
    code = "stale_revision"
    message = "The document changed since the base revision."
