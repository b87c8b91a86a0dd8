"""``env:NAME`` secret references and the server's allow-list for them (§14.2, ASVS V8/V14).

A company admin writes references into connector credentials and agent adapter configs; the
server resolves them from its own process environment. Without a fence, ``env:SECRET_KEY`` or
``env:DATABASE_URL`` would hand the server's own secrets to whatever URL the admin configured.
So a name is usable only when the operator's allow-list (``PAPERCLIP_SECRET_ENV_ALLOWLIST``:
exact names, or prefixes ending in ``*``; default ``PAPERCLIP_SECRET_*``) admits it, and the
server's own configuration variables are refused even when an allow-list entry would match.

The environment is one for every company, so an entry also names the company it is meant for:
``ACME:PAPERCLIP_SECRET_ACME_*`` (the company's issue prefix, or its id). An entry without one
applies to any company only when the operator says the server has one tenant
(``PAPERCLIP_SECRET_ENV_SINGLE_TENANT``); otherwise company A could name company B's variable and
have B's token sent to a URL A configured. Refused and unset names get the same answer, so the
answer does not tell a company which variables exist.
The same check runs when a reference is written (a 400 naming the field) and when it is resolved
(so a row written before the rule existed, or copied from another company, is refused too)."""
from __future__ import annotations

import os
import re

from django.apps import apps
from django.conf import settings

ENV_REF = re.compile(r"^env:([A-Za-z_][A-Za-z0-9_]{0,127})$")

# The server's own configuration: never a tenant's secret, whatever the allow-list says.
SERVER_VARIABLES = frozenset({
    "SECRET_KEY", "DJANGO_SECRET_KEY", "DATABASE_URL", "CELERY_BROKER_URL", "CELERY_RESULT_BACKEND",
    "BROKER_URL", "REDIS_URL", "PAPERCLIP_SECRETS_KEY", "PAPERCLIP_SECRET_ENV_ALLOWLIST",
    "PAPERCLIP_SECRET_ENV_SINGLE_TENANT", "PAPERCLIP_OUTBOUND_ALLOWED_HOSTS", "PGPASSWORD", "PGPASSFILE",
    "PGSERVICEFILE", "DJANGO_SETTINGS_MODULE",
})
SERVER_PREFIXES = ("DATABASE_", "CELERY_", "DJANGO_", "AWS_", "GOOGLE_APPLICATION_", "AZURE_")


class SecretRefused(Exception):
    """The reference names a variable this server does not hand out."""


class SecretMissing(Exception):
    """The reference is allowed but names nothing (unset variable)."""


def allowlist() -> tuple[str, ...]:
    entries = (getattr(settings, "PAPERCLIP", {}) or {}).get("SECRET_ENV_ALLOWLIST", ("PAPERCLIP_SECRET_*",))
    return tuple(e.strip() for e in entries if e and e.strip())


def single_tenant() -> bool:
    return bool((getattr(settings, "PAPERCLIP", {}) or {}).get("SECRET_ENV_SINGLE_TENANT", False))


def not_provided(name: str) -> str:
    # One answer for "not allowed for this company" and "not set": a company must not learn from it
    # which variables the server holds (another company's, or the server's).
    return (f"{name} is not set on this server or not provided to this company "
            f"(PAPERCLIP_SECRET_ENV_ALLOWLIST, ask the server's operator).")


def _matches(pattern: str, name: str) -> bool:
    return pattern.endswith("*") and name.startswith(pattern[:-1]) or pattern == name


_prefixes: dict[str, str] = {}


def _company_prefix(company_id: str) -> str | None:
    # Kept per process: a company's issue prefix never changes (issues.api.org_serializers, the
    # admin), so a webhook resolving its secret reads nothing more than before.
    if company_id not in _prefixes:
        Company = apps.get_model("issues", "Company")
        prefix = Company.objects.filter(pk=company_id).values_list("issue_prefix", flat=True).first()
        if prefix is None:
            return None
        _prefixes[company_id] = prefix
    return _prefixes[company_id]


def _is_company(owner: str, company_id) -> bool:
    """``owner`` (an entry's part before ':') names the company: its id, or its issue prefix."""
    if company_id is None:
        return False
    if owner.replace("-", "").lower() == str(company_id).replace("-", "").lower():
        return True
    prefix = _company_prefix(str(company_id))
    return prefix is not None and owner.upper() == prefix


def env_name_refusal(name: str, *, company_id) -> str | None:
    """Why ``env:name`` may not be used by the company ``company_id``, or None when it may."""
    if name.upper() in SERVER_VARIABLES or name.upper().startswith(SERVER_PREFIXES):
        return f"{name} is part of the server's own configuration and is never handed out."
    for entry in allowlist():
        owner, _, pattern = entry.rpartition(":")
        if not _matches(pattern, name):
            continue
        if not owner and single_tenant() or owner and _is_company(owner, company_id):
            return None
    return not_provided(name)


def env_ref_name(ref: str) -> str | None:
    match = ENV_REF.match(ref or "")
    return match.group(1) if match else None


def env_ref_refusal(ref: str, *, company_id) -> str | None:
    """For write-time validation: why ``ref`` cannot be stored for the company (malformed or
    refused), or None. Whether the variable is set is left to the caller (see env_ref_resolve)."""
    name = env_ref_name(ref)
    if name is None:
        return "A reference must look like 'env:NAME'."
    return env_name_refusal(name, company_id=company_id)


def env_ref_resolve(ref: str, *, company_id) -> str:
    """The value of ``env:NAME`` for the company ``company_id``; raises SecretRefused or SecretMissing
    (an unset variable: the same message as a refused one)."""
    name = env_ref_name(ref)
    if name is None:
        raise SecretRefused("A reference must look like 'env:NAME'.")
    refusal = env_name_refusal(name, company_id=company_id)
    if refusal:
        raise SecretRefused(refusal)
    value = os.environ.get(name)
    if value is None:
        raise SecretMissing(not_provided(name))
    return value
