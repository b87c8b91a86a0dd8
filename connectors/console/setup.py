"""Setting a connector up from the console: choose the provider, fill the form (``setup_forms``), save through
``instance_create`` / ``instance_update`` (their validation, their field errors next to the fields), then see
what the state mapping check found against the provider's live workflow and, on the connector's page, the
webhook URL, the handshake and registration state and the first poll.

Board admins and owners only (``MANAGE_CONNECTORS``), like the API; another company's connector is a 404.

Secrets: a reference (``env:NAME``, ``secret:<uuid>``) or a value typed into "store a new secret", which is
encrypted with ``connectors.secrets.secret_store`` in the same transaction as the save (a refused save stores
nothing) and is never rendered back. The findings shown right after a save are the check's report read
without recording (``mapping_report``): the recorded check is the one ``instance_create`` / ``instance_update``
queue after commit, and the connector page shows its latest outcome."""
from __future__ import annotations

import json
import logging

from django.contrib import messages
from django.db import transaction
from django.http import HttpResponseRedirect
from django.views.decorators.http import require_GET, require_http_methods

from connectors import secrets
from connectors.choices import ErrorCategory
from connectors.models import ConnectorInstance, SyncError
from connectors.providers.base import ProviderError, TaskSourceAdapter, provider_keys
from connectors.selectors import public_registrations
from connectors.services import interventions
from connectors.services.instances import instance_create, instance_update, webhook_url
from connectors.services.mapping_check import NOT_APPLICABLE, mapping_report, state_mapping_check
from connectors.services.polling import instance_poll
from connectors.services.webhook_setup import (
    handshake_window_open,
    token_offered,
    verification_token,
    webhooks_register,
)
from issues.console.base import error_text, render_page
from issues.console.permissions import console_action, console_actor, console_page, has_role, require_role
from issues.exceptions import ApiError, NotFound
from issues.models import ActivityLog

from . import setup_forms
from .common import MANAGE_CONNECTORS, instance_url, new_key
from .common import form_key as _key
from .common import instance_for as _instance

log = logging.getLogger("connectors.console.setup")

CHECK_SESSION_KEY = "connectors:setup-check:{}"


def _company_admin(request):
    company = request.company
    if company is None:
        raise NotFound("Choose a company first.")
    require_role(request, company.pk, MANAGE_CONNECTORS)
    return company


def _provider(key: str) -> dict:
    if key not in provider_keys():
        raise NotFound("No such provider.")
    return setup_forms.provider_info(key)


# --- choose the provider ---------------------------------------------------------------------------


@console_page
@require_GET
def connector_new(request):
    company = _company_admin(request)
    return render_page(request, "connectors/setup_provider.html", None,
                       {"company": company, "providers": setup_forms.providers()})


# --- the form ------------------------------------------------------------------------------------


def _render_form(request, company, form: setup_forms.SetupForm, *, status: int = 200, secrets_dropped=()):
    context = {"company": company, **form.context(company), "form_key": new_key(),
               "secrets_dropped": set(secrets_dropped)}
    return render_page(request, "connectors/setup_form.html", None, context, status=status)


def _secret_ref(company, name: str, label: str, given: dict) -> str:
    """The reference to save: a typed value is stored encrypted now (inside the caller's transaction)."""
    if given["new"]:
        return secrets.secret_store(company=company, name=f"{name or 'connector'} {label}", value=given["new"])
    return given["ref"]


def _typed_secrets(submitted) -> list[str]:
    return [name for name, given in submitted.secrets.items() if given["new"]]


@console_page
@require_http_methods(["GET", "POST"])
def connector_create_view(request, provider_key):
    company = _company_admin(request)
    provider = _provider(provider_key)
    if request.method == "GET":
        return _render_form(request, company, setup_forms.SetupForm(provider, setup_forms.initial_values(provider)))
    submitted = setup_forms.parse(request.POST, provider)
    form = submitted.form
    if form.errors or form.rule_errors:
        return _render_form(request, company, form, status=400, secrets_dropped=_typed_secrets(submitted))
    name = submitted.values["name"]
    try:
        with transaction.atomic():
            instance = instance_create(
                actor=console_actor(request), company=company, name=name, provider_key=provider_key,
                credentials=_secret_ref(company, name, "credentials", submitted.secrets["credentials"]),
                webhook_secret=_secret_ref(company, name, "webhook secret", submitted.secrets["webhook_secret"]),
                routing_rules=submitted.rules, **submitted.fields)
    except ApiError as exc:
        _refused(form, exc, submitted)
        return _render_form(request, company, form, status=400, secrets_dropped=_typed_secrets(submitted))
    _findings_after_save(request, instance)
    messages.success(request, f"Connector {instance.name} created.")
    return HttpResponseRedirect(instance_url(instance) + "#setup")


def _refused(form, exc: ApiError, submitted):
    """The service said no: its field errors go next to the fields. A 404 naming a field (an agent or a stored
    secret the company does not have) is a field error too; any other 404 or a 403 propagates."""
    if isinstance(exc, NotFound) and not (isinstance(exc.details, dict) and exc.details):
        raise exc
    form.errors_from(exc, submitted.rule_rows)


@console_page
@require_http_methods(["GET", "POST"])
def connector_edit_view(request, instance_id):
    instance = _instance(request, instance_id)
    require_role(request, instance.company_id, MANAGE_CONNECTORS)
    company = instance.company
    try:
        provider = setup_forms.provider_info(instance.provider_key)
    except LookupError:
        raise NotFound(f"The {instance.provider_key} provider is not installed.") from None
    if request.method == "GET":
        return _render_form(request, company, setup_forms.SetupForm(
            provider, setup_forms.initial_values(provider, instance), instance=instance))
    submitted = setup_forms.parse(request.POST, provider, instance)
    form = submitted.form
    if form.errors or form.rule_errors:
        return _render_form(request, company, form, status=400, secrets_dropped=_typed_secrets(submitted))
    actor, name = console_actor(request), submitted.values["name"]
    try:
        with transaction.atomic():
            row = instance_update(actor=actor, instance=instance, changes={"name": name, **submitted.fields},
                                  routing_rules=submitted.rules)
            rotated = {}
            for field, label, current in (("credentials", "credentials", instance.credentials_ref),
                                          ("webhook_secret", "webhook secret", instance.webhook_secret_ref)):
                given = submitted.secrets[field]
                if given["new"] or given["ref"] != current:
                    rotated[field] = _secret_ref(company, name, label, given)
            if rotated:  # the rotation service: replaced stored secrets are deleted, a new webhook secret re-verifies
                interventions.credentials_rotate(
                    actor=actor, instance=row, idempotency_key=_key(request) + ":secrets",
                    credentials=rotated.get("credentials"), webhook_secret=rotated.get("webhook_secret"),
                    reason="connector settings (console)")
    except ApiError as exc:
        _refused(form, exc, submitted)
        return _render_form(request, company, form, status=400, secrets_dropped=_typed_secrets(submitted))
    _findings_after_save(request, row)
    messages.success(request, f"Settings of {row.name} saved.")
    return HttpResponseRedirect(instance_url(row) + "#setup")


# --- findings of the state mapping check ------------------------------------------------------------


def _findings_after_save(request, instance: ConnectorInstance):
    """Read the provider's live workflow now and keep the report for the connector page (shown once)."""
    instance = ConnectorInstance.objects.get(pk=instance.pk)
    try:
        report = mapping_report(instance)
    except Exception as exc:  # noqa: BLE001 — the save stands; the recorded check reports its own failure
        log.exception("state mapping check of connector %s after a console save failed", instance.pk)
        report = {"status": "unavailable", "message": f"The check could not run: {type(exc).__name__}: {exc}",
                  "errors": [], "warnings": [], "providerErrors": [], "containers": []}
    _keep_report(request, instance, report, source="save")


def _keep_report(request, instance, report: dict, *, source: str):
    request.session[CHECK_SESSION_KEY.format(instance.pk)] = {
        **json.loads(json.dumps(report, default=str)), "source": source}


@console_action
def mapping_check_view(request, instance_id):
    """The recorded check on demand (the API's ``check-mapping``): errors become health entries."""
    instance = _instance(request, instance_id)
    require_role(request, instance.company_id, MANAGE_CONNECTORS)
    try:
        report = state_mapping_check(actor=console_actor(request), instance=instance, trigger="console")
    except ApiError as exc:
        messages.error(request, error_text(exc))
    else:
        _keep_report(request, instance, report, source="check")
    return HttpResponseRedirect(instance_url(instance) + "#setup")


# --- webhook, handshake, first poll ---------------------------------------------------------------


@console_action
def poll_now_view(request, instance_id):
    instance = _instance(request, instance_id)
    require_role(request, instance.company_id, MANAGE_CONNECTORS)
    if instance.status == "paused":
        messages.error(request, f"{instance.name} is paused: resume it to poll.")
        return HttpResponseRedirect(instance_url(instance) + "#setup")
    try:
        result = instance_poll(instance_id=instance.pk)
    except (secrets.SecretUnavailable, ProviderError) as exc:
        messages.error(request, f"Poll failed: {exc}")
    else:
        if result.get("error"):
            messages.error(request, f"Poll skipped: {result['error']}")
        else:
            messages.success(request, f"Polled {instance.name}: {result.get('pages', 0)} page(s), "
                                      f"{result.get('tasks', 0)} task(s) changed.")
    return HttpResponseRedirect(instance_url(instance) + "#setup")


@console_action
def register_webhooks_view(request, instance_id):
    instance = _instance(request, instance_id)
    require_role(request, instance.company_id, MANAGE_CONNECTORS)
    try:
        results = webhooks_register(instance=instance, actor=console_actor(request))
    except ApiError as exc:
        messages.error(request, error_text(exc))
    else:
        active = sum(1 for r in results if r.get("active"))
        (messages.success if active == len(results) else messages.warning)(
            request, f"Webhooks: {active} of {len(results)} registration(s) active.")
    return HttpResponseRedirect(instance_url(instance) + "#setup")


@console_action
def handshake_window_view(request, instance_id):
    instance = _instance(request, instance_id)
    require_role(request, instance.company_id, MANAGE_CONNECTORS)
    until = handshake_window_open(actor=console_actor(request), instance=instance)
    messages.success(request, f"A handshake is expected until {until:%H:%M:%S} UTC: trigger it in the provider now.")
    return HttpResponseRedirect(instance_url(instance) + "#setup")


@console_action
def verification_token_view(request, instance_id):
    """Reveal the verification token a handshake handed over (Notion's), for pasting back into the provider.
    Owners and admins; the service writes an activity entry. Never cached, never kept in the session."""
    instance = _instance(request, instance_id)
    require_role(request, instance.company_id, MANAGE_CONNECTORS)
    try:
        token, problem = verification_token(actor=console_actor(request), instance=instance), ""
    except secrets.SecretUnavailable as exc:
        token, problem = None, exc.message
    context = {"company": instance.company, "instance": instance, "token": token, "problem": problem}
    template = "connectors/setup_token.html"
    response = render_page(request, "connectors/setup_token_page.html", template, context)
    response["Cache-Control"] = "no-store"
    return response


# --- the connector page's setup panel --------------------------------------------------------------


def setup_panel(request, instance: ConnectorInstance) -> dict:
    """Context of ``connectors/setup_panel.html`` on the connector page."""
    try:
        provider = setup_forms.provider_info(instance.provider_key)
    except LookupError:
        provider = None
    manage = has_role(request, instance.company_id, MANAGE_CONNECTORS)
    checked = provider is not None and provider["cls"].workflow_metadata is not TaskSourceAdapter.workflow_metadata
    checks = list(ActivityLog.objects.filter(
        company_id=instance.company_id, entity_type="connector", entity_id=str(instance.pk),
        action="connector.mapping_checked").order_by("-created_at", "-id")[:20])
    return {"setup": {
        "provider": provider, "manage": manage, "form_key": new_key(),
        "webhook_url": webhook_url(instance), "registrations": public_registrations(instance),
        "handshake_open_until": instance.handshake_open_until, "last_handshake_at": instance.last_handshake_at,
        "last_handshake_detail": instance.last_handshake_detail,
        "offers_token": bool(manage and token_offered(instance)),
        "last_poll_at": instance.last_poll_at, "poll_interval": instance.poll_interval_seconds,
        "checked": checked, "report": request.session.pop(CHECK_SESSION_KEY.format(instance.pk), None),
        "last_check": _last_check(instance, checks) if checked else None,
        "not_applicable": NOT_APPLICABLE,
    }}


def _last_check(instance, checks) -> dict | None:
    """The latest recorded check (its activity entry) and, when it found errors, the health entry it wrote
    (which lists the errors and warnings)."""
    if not checks:
        return None
    last, previous = checks[0], (checks[1] if len(checks) > 1 else None)
    entries = SyncError.objects.filter(instance=instance, category=ErrorCategory.CONFIG,
                                       details__check="state_mapping", at__lte=last.created_at)
    if previous is not None:
        entries = entries.filter(at__gt=previous.created_at)
    entry = entries.order_by("-at", "-id").first() if (last.details or {}).get("errors") else None
    details = entry.details if entry is not None else {}
    return {"at": last.created_at, **(last.details or {}), "errorList": details.get("errors") or [],
            "warningList": details.get("warnings") or []}

