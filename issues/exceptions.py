"""Domain errors of the issues app (they carry their HTTP status; see paperclip.core.errors)."""
from paperclip.core.errors import ApiError, Conflict, Forbidden, InvalidInput, NotFound, Unauthorized, Unprocessable

__all__ = ["ApiError", "Conflict", "Forbidden", "InvalidInput", "NotFound", "Unauthorized", "Unprocessable"]


class CheckoutConflict(Conflict):
    code = "checkout_conflict"
    message = "Issue is checked out by another run."


class NotCheckoutOwner(Conflict):
    code = "not_checkout_owner"
    message = "This issue is in progress under another run; check it out first."


class StaleRevision(Conflict):
    code = "stale_revision"
    message = "The document changed since the base revision."
