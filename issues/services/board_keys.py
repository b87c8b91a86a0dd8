"""Board API keys (``pcp_board_…``, reference §2.5): a board user's credential for the API.

A request made with one acts as its user (memberships and roles, viewers stay read-only), without
CSRF or a run header (issues.api.auth.BoardKeyAuthentication). Only the SHA-256 is stored; the
token is returned once, by :func:`board_key_create`. Default lifetime 30 days; ``None`` never expires.

Audit: the activity log is per company, and a key is a user's, not a company's. Creation and
revocation are recorded once in every company the key can act in (the user's memberships; every
company for a superuser), so each company's board sees the keys that can act in it. A user with no
company gets no row: such a key can act nowhere.
"""
from __future__ import annotations

from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from issues.actors import Actor
from issues.exceptions import Forbidden, InvalidInput, NotFound
from issues.models import BoardApiKey
from issues.models.agent import hash_key

from .activity import activity_record

DEFAULT_LIFETIME = timedelta(days=30)
PREFIX_CHARS = 18  # "pcp_board_" and 8 characters of the secret: enough to recognise a key
DEFAULT_EXPIRY = object()  # the default lifetime (``expires_at=None`` means never)


def _audit(actor: Actor, key: BoardApiKey, action: str):
    details = {"keyId": str(key.pk), "name": key.name, "prefix": key.prefix, "userId": str(key.user_id),
               "expiresAt": key.expires_at.isoformat() if key.expires_at else None}
    for company_id in Actor(user=key.user).roles:
        activity_record(actor=actor, company_id=company_id, action=action, entity_type="board_api_key",
                        entity_id=key.pk, details=details)


def _ensure_own(actor: Actor, user):
    """Board users manage their own keys; the host (``manage.py board_key_create``) anyone's."""
    actor.ensure_board()
    if not actor.system and actor.user.pk != user.pk:
        raise Forbidden("Board users manage only their own API keys.", code="not_your_key")


def board_key_create(*, actor: Actor, user, name: str = "default",
                     expires_at: datetime | None | object = DEFAULT_EXPIRY) -> tuple[BoardApiKey, str]:
    """A new key for ``user``: the row and the token (shown once, never stored)."""
    _ensure_own(actor, user)
    now = timezone.now()
    if expires_at is DEFAULT_EXPIRY:
        expires_at = now + DEFAULT_LIFETIME
    elif expires_at is not None and expires_at <= now:
        raise InvalidInput(details={"expiresAt": ["Must be in the future (or null: never expires)."]})
    raw = BoardApiKey.generate()
    with transaction.atomic():
        key = BoardApiKey.objects.create(user=user, name=(name or "default")[:120], prefix=raw[:PREFIX_CHARS],
                                         key_hash=hash_key(raw), expires_at=expires_at)
        _audit(actor, key, "board_api_key.created")
    return key, raw


def board_key_of(*, actor: Actor, key_id) -> BoardApiKey:
    """One of the caller's own keys; another user's key (or none) is a 404. For an agent, as for
    every object, one outside its company is a 404 (a key is in its user's companies) and one
    inside is the board-only 403."""
    if actor.is_agent:
        if BoardApiKey.objects.filter(pk=key_id, user__memberships__company_id=actor.agent.company_id).exists():
            actor.ensure_board()
        raise NotFound("Board API key not found")
    key = BoardApiKey.objects.select_related("user").filter(pk=key_id, user_id=actor.user.pk).first()
    if key is None:
        raise NotFound("Board API key not found")
    return key


def board_key_revoke(*, actor: Actor, key: BoardApiKey) -> BoardApiKey:
    """Revoke (idempotent: a revoked key stays revoked, audited once)."""
    _ensure_own(actor, key.user)
    with transaction.atomic():
        revoked = BoardApiKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(revoked_at=timezone.now())
        key.refresh_from_db()
        if revoked:
            _audit(actor, key, "board_api_key.revoked")
    return key
