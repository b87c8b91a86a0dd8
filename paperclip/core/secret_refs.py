"""``env:NAME`` secret references and the server's allow-list for them (§14.2, ASVS V8/V14).

A company admin writes references into connector credentials and agent adapter configs; the
server resolves them from its own process environment. Without a fence, ``env:SECRET_KEY`` or
``env:DATABASE_URL`` would hand the server's own secrets to whatever URL the admin configured.
So a name is usable only when the operator's allow-list (``PAPERCLIP_SECRET_ENV_ALLOWLIST``:
exact names, or prefixes ending in ``*``; default ``PAPERCLIP_SECRET_*``) admits it, and the
server's own configuration variables are refused even when an allow-list entry would match.
The same check runs when a reference is written (a 400 naming the field) and when it is resolved
(so a row written before the rule existed is refused too)."""
from __future__ import annotations

import os
import re

from django.conf import settings

ENV_REF = re.compile(r"^env:([A-Za-z_][A-Za-z0-9_]{0,127})$")

# The server's own configuration: never a tenant's secret, whatever the allow-list says.
SERVER_VARIABLES = frozenset({
    "SECRET_KEY", "DJANGO_SECRET_KEY", "DATABASE_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND",
    "BROKER_URL", "REDIS_URL", "PAPERCLIP_SECRETS_KEY", "PAPERCLIP_SECRET_ENV_ALLOWLIST",
    "PAPERCLIP_OUTBOUND_ALLOWED_HOSTS", "PGPASSWORD", "PGPASSFILE", "PGSERVICEFILE", "DJANGO_SETTINGS_MODULE",
})
SERVER_PREFIXES = ("DATABASE_", "CELERY_", "DJANGO_", "AWS_", "GOOGLE_APPLICATION_", "AZURE_")


class SecretRefused(Exception):
    """The reference names a variable this server does not hand out."""


class SecretMissing(Exception):
    """The reference is allowed but names nothing (unset variable)."""


def allowlist() -> tuple[str, ...]:
    entries = (getattr(settings, "PAPERCLIP", {}) or {}).get("SECRET_ENV_ALLOWLIST", ("PAPERCLIP_SECRET_*",))
    return tuple(e.strip() for e in entries if e and e.strip())


def env_name_refusal(name: str) -> str | None:
    """Why ``env:name`` may not be used on this server, or None when it may."""
    if name.upper() in SERVER_VARIABLES or name.upper().startswith(SERVER_PREFIXES):
        return f"{name} is part of the server's own configuration and is never handed out."
    for entry in allowlist():
        if entry.endswith("*") and name.startswith(entry[:-1]) or entry == name:
            return None
    return (f"{name} is not in this server's secret allow-list (PAPERCLIP_SECRET_ENV_ALLOWLIST: "
            f"{', '.join(allowlist()) or 'empty'}).")


def env_ref_name(ref: str) -> str | None:
    match = ENV_REF.match(ref or "")
    return match.group(1) if match else None


def env_ref_refusal(ref: str) -> str | None:
    """For write-time validation: why ``ref`` cannot be stored (malformed or refused), or None."""
    name = env_ref_name(ref)
    if name is None:
        return "A reference must look like 'env:NAME'."
    return env_name_refusal(name)


def env_ref_resolve(ref: str) -> str:
    """The value of an allowed ``env:NAME`` reference; raises SecretRefused or SecretMissing."""
    name = env_ref_name(ref)
    if name is None:
        raise SecretRefused("A reference must look like 'env:NAME'.")
    refusal = env_name_refusal(name)
    if refusal:
        raise SecretRefused(refusal)
    value = os.environ.get(name)
    if value is None:
        raise SecretMissing(f"Environment variable {name} is not set.")
    return value
