"""Secret references (§14.2): ``env:NAME`` or ``secret:<uuid>`` (a Fernet-encrypted stored secret).

The key comes from ``settings.CONNECTORS["SECRETS_KEY"]`` (env ``PAPERCLIP_SECRETS_KEY``, a Fernet
key); without one it is derived from ``SECRET_KEY``. Plaintext never lands in a model field."""
from __future__ import annotations

import base64
import hashlib
import os
import re

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings

ENV_REF = re.compile(r"^env:([A-Za-z_][A-Za-z0-9_]{0,127})$")
STORED_REF = re.compile(r"^secret:([0-9a-fA-F-]{32,36})$")


class SecretUnavailable(Exception):
    """The reference names nothing usable (unset variable, missing row, wrong key)."""


def _fernet() -> Fernet:
    key = (getattr(settings, "CONNECTORS", {}) or {}).get("SECRETS_KEY") or ""
    if not key:
        digest = hashlib.sha256(("paperclip-connector-secrets:" + settings.SECRET_KEY).encode()).digest()
        key = base64.urlsafe_b64encode(digest).decode()
    return Fernet(key.encode() if isinstance(key, str) else key)


def encrypt(value: str) -> str:
    return _fernet().encrypt(value.encode("utf-8")).decode("ascii")


def decrypt(token: str) -> str:
    try:
        return _fernet().decrypt(token.encode("ascii")).decode("utf-8")
    except InvalidToken:
        raise SecretUnavailable("The stored secret cannot be decrypted with the configured key.") from None


def is_reference(ref: str) -> bool:
    return bool(ENV_REF.match(ref or "") or STORED_REF.match(ref or ""))


def secret_store(*, company, name: str, value: str) -> str:
    """Encrypt ``value`` into a new ConnectorSecret of ``company``; returns its reference."""
    from connectors.models import ConnectorSecret

    row = ConnectorSecret.objects.create(company=company, name=name[:120], ciphertext=encrypt(value))
    return f"secret:{row.pk}"


def resolve(ref: str | None, *, company_id=None) -> str | None:
    """The secret's value, or None for an empty reference. A stored secret of another company is
    unavailable (the company boundary holds for secrets too)."""
    if not ref:
        return None
    match = ENV_REF.match(ref)
    if match:
        value = os.environ.get(match.group(1))
        if value is None:
            raise SecretUnavailable(f"Environment variable {match.group(1)} is not set.")
        return value
    match = STORED_REF.match(ref)
    if match:
        from connectors.models import ConnectorSecret

        qs = ConnectorSecret.objects.filter(pk=match.group(1))
        if company_id is not None:
            qs = qs.filter(company_id=company_id)
        ciphertext = qs.values_list("ciphertext", flat=True).first()
        if ciphertext is None:
            raise SecretUnavailable("The stored secret does not exist.")
        return decrypt(ciphertext)
    raise SecretUnavailable("Not a secret reference (use env:NAME or a stored secret).")
