"""The user's own board API keys (``pcp_board_…``): list, create (the token is shown once, in the
answer to the create, which is not cached) and revoke. A key acts as its user in every company
they belong to, with their roles, so any signed-in board user manages their own keys here."""
from __future__ import annotations

from datetime import timedelta

from django import forms
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET

from issues.exceptions import ApiError
from issues.selectors import board_key_list
from issues.services.board_keys import DEFAULT_EXPIRY, board_key_create, board_key_of, board_key_revoke

from .base import error_text, perform, render_page
from .permissions import console_action, console_actor, console_page

LIST_LIMIT = 200
LIFETIMES = [("30", "30 days"), ("7", "7 days"), ("90", "90 days"), ("365", "1 year"), ("never", "Never expires")]


class BoardKeyForm(forms.Form):
    name = forms.CharField(max_length=120, initial="default")
    lifetime = forms.ChoiceField(choices=LIFETIMES, initial="30", label="Expires")

    def expires_at(self):
        value = self.cleaned_data["lifetime"]
        if value == "never":
            return None
        if value == "30":
            return DEFAULT_EXPIRY
        return timezone.now() + timedelta(days=int(value))


def _context(request, *, form=None, new_key=None, token=None):
    keys = list(board_key_list(user=request.user, params={"includeInactive": "true", "limit": str(LIST_LIMIT)}))
    return {"keys": keys, "form": form or BoardKeyForm(), "new_key": new_key, "token": token, "now": timezone.now(),
            "limit": LIST_LIMIT}


@console_page
@require_GET
def board_key_list_page(request):
    return render_page(request, "console/board_keys/list.html", None, _context(request))


@console_action
def board_key_new(request):
    """Creates a key and answers with the page showing its token, once (never stored, not cached)."""
    form = BoardKeyForm(request.POST)
    if not form.is_valid():
        return render_page(request, "console/board_keys/list.html", None, _context(request, form=form), status=400)
    try:
        key, token = board_key_create(actor=console_actor(request), user=request.user,
                                      name=form.cleaned_data["name"], expires_at=form.expires_at())
    except ApiError as exc:
        form.add_error(None, error_text(exc))
        return render_page(request, "console/board_keys/list.html", None, _context(request, form=form), status=400)
    response = render_page(request, "console/board_keys/list.html", None,
                           _context(request, new_key=key, token=token))
    response["Cache-Control"] = "no-store"
    return response


@console_action
def board_key_revoke_view(request, key_id):
    key = board_key_of(actor=console_actor(request), key_id=key_id)  # another user's key: 404
    return perform(request, lambda: board_key_revoke(actor=console_actor(request), key=key),
                   success=f"Board key {key.prefix}… revoked.", redirect_to=reverse("console:board-key-list"))
