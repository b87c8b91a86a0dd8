"""Secret references (§14.2): ``env:NAME`` or ``secret:<uuid>`` (a Fernet-encrypted stored secret).

``env:`` names obey the server's allow-list, whose entries name the company each variable is for
(paperclip.core.secret_refs); a stored secret belongs to one company and resolves only for it.
The key comes from ``settings.CONNECTORS["SECRETS_KEY"]`` (env ``PAPERCLIP_SECRETS_KEY``, a Fernet
key); without one it is derived from ``SECRET_KEY``. Plaintext never lands in a model field."""
from __future__ import annotations

import base64
import hashlib
import re

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings

from paperclip.core.errors import Unprocessable
from paperclip.core.secret_refs import ENV_REF, SecretMissing, SecretRefused, env_ref_resolve

STORED_REF = re.compile(r"^secret:([0-9a-fA-F-]{32,36})$")


class SecretUnavailable(Unprocessable):
    """The reference names nothing usable (refused or unset variable, missing row, wrong key).

    In a request it answers 422 ``secret_unavailable`` naming the field; in background work it is
    recorded as a health entry by the caller."""

    code = "secret_unavailable"

    def __init__(self, message: str, *, field: str = "credentials"):
        super().__init__(message, details={field: [message]})
        self.field = field


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


def resolve(ref: str | None, *, company_id, field: str = "credentials") -> str | None:
    """The secret's value, or None for an empty reference. The company is required: a stored secret
    of another company, or an ``env:`` name the allow-list binds to another company, is unavailable
    (the company boundary holds for secrets too)."""
    if not ref:
        return None
    if ENV_REF.match(ref):
        try:
            return env_ref_resolve(ref, company_id=company_id)
        except (SecretRefused, SecretMissing) as exc:
            raise SecretUnavailable(str(exc), field=field) from None
    match = STORED_REF.match(ref)
    if match:
        from connectors.models import ConnectorSecret

        ciphertext = (ConnectorSecret.objects.filter(pk=match.group(1), company_id=company_id)
                      .values_list("ciphertext", flat=True).first())
        if ciphertext is None:
            raise SecretUnavailable("The stored secret does not exist.", field=field)
        try:
            return decrypt(ciphertext)
        except SecretUnavailable as exc:
            raise SecretUnavailable(exc.message, field=field) from None
    raise SecretUnavailable("Not a secret reference (use env:NAME or a stored secret).", field=field)
