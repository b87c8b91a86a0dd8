"""Django admin for connectors. Instances and rules are configuration: an instance's settings change
through ``instance_update``, its secret references through ``credentials_rotate``, pause and resume
are interventions; it never changes company, and its project, goal, triage agent and rule targets are
its company's. Links, events, transitions, errors, conflicts and interventions are shown, never
edited here (the sync engine and the console's actions change links). Secrets show no plaintext,
ever."""
import uuid

from django import forms
from django.contrib import admin, messages
from django.db import models
from django.forms.models import BaseInlineFormSet

from issues.actors import Actor
from issues.admin_mixins import (
    SameCompanyFormMixin,
    ServiceActionsMixin,
    ServiceWriteAdminMixin,
    ServiceWrittenForm,
    ViewOnlyAdminMixin,
)
from paperclip.core.outbound_http import url_refusal

from . import secrets
from .services.instances import CONFIG_FIELDS
from .models import (
    Conflict,
    ConnectorInstance,
    ConnectorSecret,
    ExternalCommentLink,
    InboundEvent,
    Intervention,
    LinkTransition,
    OutboundEffect,
    RoutingRule,
    SyncCursor,
    SyncError,
    TaskExport,
    TaskLink,
)


class ReadOnlyAdmin(ViewOnlyAdminMixin, admin.ModelAdmin):
    """Rows the engine writes: shown, never added or changed here."""

    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}


def _rule_form_errors(form, provider_key: str):
    """The services' routing rule check (connectors.services.routing_rules), as form errors: a kind the
    provider does not declare, a match the kind cannot read."""
    from .services.routing_rules import rule_errors

    data = form.cleaned_data
    if not provider_key or not data or data.get("DELETE"):
        return
    errors = rule_errors(provider_key, kind=data.get("kind"), match=data.get("match"),
                         target_agent_id=getattr(data.get("target_agent"), "pk", None),
                         target_alias=data.get("target_alias") or "")
    for key, reasons in errors.items():
        field = key if key in form.fields else "match" if key.startswith("match") else None
        for reason in reasons:
            form.add_error(field, f"{key}: {reason}" if field != key else reason)


class RoutingRuleInlineFormSet(BaseInlineFormSet):
    def clean(self):
        super().clean()
        for form in self.forms:
            if form.is_valid():  # the instance being saved, with the provider the parent form holds
                _rule_form_errors(form, self.instance.provider_key)


class RoutingRuleAdminForm(SameCompanyFormMixin, forms.ModelForm):
    """A rule's target agent is of its connector's company (the rule page and the connector page's
    inline); on the rule page the provider's rule check too (the inline's formset runs it there)."""

    same_company_fields = ("target_agent",)

    class Meta:
        model = RoutingRule
        fields = "__all__"

    def row_company_id(self, cleaned):
        connector = cleaned.get("instance") or getattr(self.instance, "instance", None)
        return getattr(connector, "company_id", None)

    def clean(self):
        cleaned = super().clean()
        instance = cleaned.get("instance")
        if instance is not None:
            _rule_form_errors(self, instance.provider_key)
        return cleaned


class RoutingRuleInline(admin.TabularInline):
    model = RoutingRule
    form = RoutingRuleAdminForm
    formset = RoutingRuleInlineFormSet
    extra = 0
    raw_id_fields = ("target_agent",)


# Form field -> instance_update change key (a related row goes as its id).
INSTANCE_CHANGE_KEYS = {**{name: name for name in CONFIG_FIELDS if not name.endswith("_id")},
                        "service_account_id": "service_account_id", "project": "project_id", "goal": "goal_id",
                        "triage_agent": "triage_agent_id"}
SECRET_REFS = {"credentials_ref": "credentials", "webhook_secret_ref": "webhook_secret"}


class ConnectorInstanceAdminForm(SameCompanyFormMixin, ServiceWrittenForm):
    """The API's rules hold here too: references that resolve for the instance's company, a base URL
    the outbound guard accepts, a project, goal and triage agent of the instance's company (and the
    services check the rest when the admin saves through them)."""

    same_company_fields = ("project", "goal", "triage_agent")

    class Meta:
        model = ConnectorInstance
        fields = (*INSTANCE_CHANGE_KEYS, *SECRET_REFS)

    def clean(self):
        cleaned = super().clean()
        company = getattr(self.instance, "company", None)
        for name, label in (("credentials_ref", "credentials"), ("webhook_secret_ref", "webhookSecret")):
            ref = cleaned.get(name)
            if ref and company is not None:
                try:
                    secrets.resolve(ref, company_id=company.pk, field=label)
                except secrets.SecretUnavailable as exc:
                    self.add_error(name, exc.message)
        base_url = cleaned.get("base_url")
        refusal = url_refusal(base_url) if base_url else None
        if refusal:
            self.add_error("base_url", refusal)
        return cleaned


@admin.register(ConnectorInstance)
class ConnectorInstanceAdmin(ServiceActionsMixin, ServiceWriteAdminMixin, admin.ModelAdmin):
    """Connectors are set up in the console (New connector) or through the API; here their settings
    change through ``instance_update`` (validated, audited, the mapping re-checked), their secret
    references through ``credentials_rotate``, and the pause / resume actions are the operators'
    interventions. The company, provider and the engine's own state are shown, not edited."""

    form = ConnectorInstanceAdminForm
    list_display = ("name", "provider_key", "company", "status", "last_webhook_at", "last_poll_at",
                    "last_reconcile_at", "webhook_rejected_count")
    list_filter = ("provider_key", "status", "company")
    search_fields = ("name", "provider_key")
    raw_id_fields = ("project", "goal", "triage_agent")
    readonly_fields = ("company", "provider_key", "status", "status_detail", "last_webhook_at", "last_poll_at",
                       "last_reconcile_at", "webhook_verified", "webhook_rejected_count", "last_webhook_rejected_at",
                       "last_webhook_rejected_reason", "provider_degraded_until", "auth_error_at",
                       "auth_error_detail", "webhook_registrations", "handshake_open_until", "last_handshake_at",
                       "last_handshake_detail", "created_by_user", "created_at", "updated_at")
    inlines = [RoutingRuleInline]
    actions = ["pause_connectors", "resume_connectors"]

    def has_add_permission(self, request):
        return False

    def save_model(self, request, obj, form, change):
        from .services.instances import instance_update
        from .services.interventions import credentials_rotate

        actor = Actor(user=request.user)
        changes = form.changes(INSTANCE_CHANGE_KEYS)
        if changes:
            instance_update(actor=actor, instance=obj, changes=changes)
        rotated = {key: ref for key, ref in form.changes(SECRET_REFS).items() if ref}
        if rotated:
            credentials_rotate(actor=actor, instance=obj, idempotency_key=f"admin:{uuid.uuid4()}",
                               reason="changed in the admin", **rotated)
        obj.refresh_from_db()

    def _intervene(self, request, queryset, service, done: str):
        actor = Actor(user=request.user)
        for instance in self.through_service(
                request, queryset, refused=f"Not {done}",
                call=lambda instance: service(actor=actor, instance=instance, idempotency_key=f"admin:{uuid.uuid4()}",
                                              reason="from the admin")):
            self.message_user(request, f"{instance.name} {done}.", messages.SUCCESS)

    @admin.action(description="Pause selected connectors")
    def pause_connectors(self, request, queryset):
        from .services.interventions import instance_pause

        self._intervene(request, queryset, instance_pause, "paused")

    @admin.action(description="Resume selected connectors")
    def resume_connectors(self, request, queryset):
        from .services.interventions import instance_resume

        self._intervene(request, queryset, instance_resume, "resumed")


@admin.register(ConnectorSecret)
class ConnectorSecretAdmin(ReadOnlyAdmin):
    list_display = ("id", "name", "company", "created_at")
    list_filter = ("company",)
    exclude = ("ciphertext",)


class LinkTransitionInline(admin.TabularInline):
    model = LinkTransition
    extra = 0
    can_delete = False
    readonly_fields = ("from_status", "to_status", "cause", "idempotency_key", "at")

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(TaskLink)
class TaskLinkAdmin(ReadOnlyAdmin):
    """A link's status moves through its transitions (recorded, audited): the sync engine and the
    link actions of the console and the API write it."""

    list_display = ("external_key", "external_task_id", "issue", "instance", "status", "sync_mode", "run_mode",
                    "last_inbound_at", "last_reconcile_at")
    list_filter = ("status", "sync_mode", "run_mode", "origin_side", "provider_key")
    search_fields = ("external_key", "external_task_id", "external_title", "issue__identifier")
    inlines = [LinkTransitionInline]


@admin.register(LinkTransition)
class LinkTransitionAdmin(ReadOnlyAdmin):
    list_display = ("link", "from_status", "to_status", "cause", "at")
    list_filter = ("to_status",)


@admin.register(InboundEvent)
class InboundEventAdmin(ReadOnlyAdmin):
    list_display = ("id", "instance", "kind", "action", "external_task_id", "status", "attempts", "next_attempt_at",
                    "received_at")
    list_filter = ("status", "source", "kind", "error_category")
    search_fields = ("idempotency_key", "external_task_id")
    exclude = ("raw_body",)


@admin.register(SyncCursor)
class SyncCursorAdmin(ReadOnlyAdmin):
    list_display = ("instance", "scope", "cursor", "updated_at")


@admin.register(RoutingRule)
class RoutingRuleAdmin(admin.ModelAdmin):
    form = RoutingRuleAdminForm
    list_display = ("instance", "order", "kind", "match", "target_agent", "target_alias", "enabled")
    list_filter = ("kind", "enabled")
    raw_id_fields = ("instance", "target_agent")


@admin.register(Conflict)
class ConflictAdmin(ReadOnlyAdmin):
    list_display = ("link", "kind", "field", "status", "detail", "detected_at")
    list_filter = ("kind", "status")


@admin.register(SyncError)
class SyncErrorAdmin(ReadOnlyAdmin):
    list_display = ("instance", "category", "message", "at")
    list_filter = ("category",)
    search_fields = ("message",)


@admin.register(OutboundEffect)
class OutboundEffectAdmin(ReadOnlyAdmin):
    list_display = ("link", "kind", "source_id", "status", "attempts", "created_at")
    list_filter = ("kind", "status")


@admin.register(ExternalCommentLink)
class ExternalCommentLinkAdmin(ReadOnlyAdmin):
    list_display = ("external_comment_id", "link", "comment", "deleted", "created_at")


@admin.register(Intervention)
class InterventionAdmin(ReadOnlyAdmin):
    list_display = ("action", "target_id", "instance", "actor_user", "idempotency_key", "at")
    list_filter = ("action",)


@admin.register(TaskExport)
class TaskExportAdmin(ReadOnlyAdmin):
    list_display = ("issue", "instance", "container", "status", "external_task_id", "attempts", "created_at")
    list_filter = ("status",)
    search_fields = ("idempotency_key", "external_task_id", "issue__identifier")
