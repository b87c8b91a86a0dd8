"""Django admin for the issues app.

Plain rows (companies, members, projects, goals …) are edited directly;
the model constraints are checked by the admin forms. Rows whose writes carry invariants
go through the services instead: issues are changed with ``issue_update`` (priority rank,
status timestamps, lock clearing, activity log), agents with ``agent_create``, ``agent_update``
and ``agent_terminate`` (run stops, key revocation, the company's stop, activity log), approvals
are decided with ``approval_decide`` (the requester's wake), blockers and approval links are only
shown (the API and the console set them), API keys are only created by
``agent_api_key_create`` and revoked by ``agent_key_revoke``. The audit trail, document
revisions and the run machinery are read-only here.
"""
import json

from django import forms
from django.contrib import admin, messages
from django.db import models
from django.template.defaultfilters import truncatechars
from django.utils.html import format_html, format_html_join

from issues.actors import Actor
from issues.admin_mixins import (
    FixedCompanyMixin,
    ReadOnlyInlineMixin,
    SameCompanyFormMixin,
    ServiceActionsMixin,
    ServiceWriteAdminMixin,
    ServiceWrittenForm,
    ViewOnlyAdminMixin,
)
from issues.choices import AgentStatus, ApprovalStatus, CompanyStatus
from issues.exceptions import InvalidInput
from issues.models import (
    ActivityLog,
    Agent,
    AgentApiKey,
    Approval,
    ApprovalIssue,
    Comment,
    Company,
    Document,
    DocumentRevision,
    Goal,
    ExecutionWorkspace,
    HeartbeatRun,
    Interaction,
    Issue,
    IssueRelation,
    Membership,
    Project,
    RunEvent,
    RunnerCommand,
    RunnerEvent,
    RunnerSession,
    RunnerSource,
    WakeupRequest,
    WorkflowDocumentCache,
    WorkProduct,
)
from issues.models import ApprovalComment, Asset, Attachment, BoardApiKey, CostEvent, Label
from issues.services.agents import AGENT_FIELDS, adapter_config_validate, agent_key_revoke

AUDIT_FIELDS = ("id", "created_at", "updated_at")


def _short(text, length=80):
    return truncatechars(text or "", length)


# --- companies, members, projects, goals ---------------------------------------------------------


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    fields = ("user", "role", "created_at")
    readonly_fields = ("created_at",)
    raw_id_fields = ("user",)


@admin.register(Company)
class CompanyAdmin(admin.ModelAdmin):
    list_display = ("name", "issue_prefix", "status", "enable_cases", "issue_counter", "budget_monthly_cents",
                    "spent_monthly_cents", "created_at")
    list_filter = ("status", "enable_cases", "require_board_approval_for_new_agents")
    search_fields = ("name", "issue_prefix")
    # The logo is one of the company's own assets: chosen over the API or in the console, not here.
    readonly_fields = (*AUDIT_FIELDS, "issue_counter", "spent_monthly_cents", "logo_asset")
    fieldsets = (
        (None, {"fields": ("name", "issue_prefix", "description", "status", "enable_cases",
                           "require_board_approval_for_new_agents")}),
        ("Branding", {"fields": ("brand_color", "logo_asset")}),
        ("Budget", {"fields": ("budget_monthly_cents", "spent_monthly_cents")}),
        ("Audit", {"fields": (*AUDIT_FIELDS, "issue_counter")}),
    )
    inlines = [MembershipInline]

    def get_readonly_fields(self, request, obj=None):
        # Identifiers already handed out (PAP-12) keep their prefix: it is fixed once issued.
        fields = super().get_readonly_fields(request, obj)
        return (*fields, "issue_prefix") if obj is not None else fields

    def has_delete_permission(self, request, obj=None):
        # As over the API: only an archived company (its agents stopped) is deleted, one at a time.
        return super().has_delete_permission(request, obj) and (obj is None or obj.status == CompanyStatus.ARCHIVED)

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    def delete_model(self, request, obj):
        """Through the service: owners only, no run still ending, and the server log's record."""
        from django.core.exceptions import PermissionDenied

        from issues.exceptions import ApiError
        from issues.services.companies import company_delete

        try:
            company_delete(actor=Actor(user=request.user), company=obj)
        except ApiError as exc:
            raise PermissionDenied(exc.message) from None

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if change and {"status", "budget_monthly_cents"} & set(form.changed_data):
            from issues.services.company_stop import company_agents_sync_on_commit

            # the company's stop begins or ends for its agents, as through the API
            company_agents_sync_on_commit(obj.pk, Actor(user=request.user))


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("user", "company", "role", "created_at")
    list_filter = ("role", "company")
    search_fields = ("user__username", "user__email", "company__name", "company__issue_prefix")
    list_select_related = ("user", "company")
    raw_id_fields = ("user",)
    autocomplete_fields = ("company",)
    readonly_fields = ("created_at",)


class ProjectAdminForm(forms.ModelForm):
    class Meta:
        model = Project
        fields = "__all__"

    def clean_run_settings(self):
        from issues.services.run_policy import KNOBS

        value = self.cleaned_data.get("run_settings")
        if value in (None, ""):
            return {}
        if not isinstance(value, dict):
            raise forms.ValidationError("An object of run settings, e.g. {\"stallTimeoutSeconds\": 600}.")
        known = {key for key, _default in KNOBS.values()}
        errors = [f"{key}: unknown setting (known: {', '.join(sorted(known))})." for key in value if key not in known]
        errors += [f"{key}: must be an integer of 0 or more." for key, v in value.items()
                   if key in known and not (isinstance(v, int) and not isinstance(v, bool) and v >= 0)]
        if errors:
            raise forms.ValidationError(errors)
        return value


def _settings_rows(rows) -> str:
    return format_html_join("", "<tr><td><code>{}</code></td><td><code>{}</code></td><td>{}</td></tr>", rows)


@admin.register(Project)
class ProjectAdmin(FixedCompanyMixin, admin.ModelAdmin):
    form = ProjectAdminForm
    list_display = ("name", "company", "status", "updated_at")
    list_filter = ("status", "company")
    search_fields = ("name", "description")
    list_select_related = ("company",)
    autocomplete_fields = ("company",)
    readonly_fields = (*AUDIT_FIELDS, "effective_run_settings")
    fieldsets = (
        (None, {"fields": ("company", "name", "description", "status")}),
        ("Execution workspace", {"fields": ("workspace_strategy", "repository", "base_ref", "branch_template",
                                            "workspace_hooks", "hook_timeout_seconds"), "description": (
            "A hook set here beats the workflow document's hooks.* (an empty command turns that hook off); an empty "
            "hook timeout means the document's hooks.timeout_ms, then 120 seconds.")}),
        ("Run settings", {"fields": ("run_settings", "effective_run_settings"), "description": (
            "Precedence per knob: the agent's runtime config, then these project settings (camelCase, e.g. "
            "stallTimeoutSeconds), then the workflow document's front matter, then the global default.")}),
        ("Workflow policy", {"fields": ("workflow_document",), "description": (
            "Project workflow document (highest precedence, then the repository's WORKFLOW.md, then the connector "
            "default). Invalid YAML or Liquid, or a known setting of the wrong type, keeps the last good version "
            "and is reported once (connector health and the activity log).")}),
        ("Audit", {"fields": AUDIT_FIELDS, "classes": ("collapse",)}),
    )

    def formfield_for_dbfield(self, db_field, request, **kwargs):
        field = super().formfield_for_dbfield(db_field, request, **kwargs)
        if db_field.name == "workflow_document":  # a document, not a note: room and a monospace font
            field.widget.attrs.update({"rows": 24, "cols": 100, "style": "font-family: monospace"})
        return field

    @admin.display(description="Effective run settings")
    def effective_run_settings(self, obj):
        """Each knob with its value and source, the document in force, its keys the host does not
        apply and the last invalid version's error. Read-only."""
        from issues.services.run_policy import KNOBS, run_policy_and_document
        from issues.workflow.document import SOURCE_LABELS
        from issues.workflow.effective import last_errors
        from issues.workflow.settings import HOOK_NAMES, describe

        if obj is None or obj.pk is None:
            return "Shown once the project is saved."
        policy, document = run_policy_and_document(agent=None, project=obj)
        knobs = [(f"{name} ({key})", getattr(policy, name), policy.sources[name]) for name, (key, _d) in KNOBS.items()]
        knobs.append(("hook_timeout_seconds", policy.hook_timeout_seconds, policy.sources["hook_timeout_seconds"]))
        knobs += [(f"hooks.{name}", _short(str(policy.hooks[name]), 120), policy.sources[f"hooks.{name}"])
                  for name in HOOK_NAMES if name in policy.hooks]
        view = describe(document.config)
        if document.source:
            origin = format_html("Workflow document in force: {} {}{}.", SOURCE_LABELS.get(document.source,
                                 document.source), document.version[:12],
                                 " (the last good version: a newer one is invalid)" if document.stale else "")
        else:
            origin = "No workflow document: project settings and global defaults apply."
        parts = [format_html("<p>{}</p>", origin),
                 format_html('<table><thead><tr><th>Setting</th><th>Value</th><th>Source</th></tr></thead>'
                             "<tbody>{}</tbody></table>", _settings_rows(knobs))]
        for title, keys in (("Recognised, not applied by the host", view.recognised),
                            ("Unknown keys (kept, not applied)", view.unknown)):
            if keys:
                rows = [(key, _short(json.dumps(value), 120), "") for key, value in keys.items()]
                parts.append(format_html("<p><strong>{}</strong></p><table><tbody>{}</tbody></table>", title,
                                         _settings_rows(rows)))
        for error in last_errors(obj):
            kept = (f"version {error['lastGoodVersion'][:12]} stays in force" if error["lastGoodVersion"]
                    else "no valid version yet")
            parts.append(format_html('<p class="errornote">Invalid {} version {}: {} ({}).</p>', error["label"],
                                     error["invalidVersion"][:12], error["error"], kept))
        return format_html_join("", "{}", ((part,) for part in parts))


class GoalAdminForm(SameCompanyFormMixin, ServiceWrittenForm):
    same_company_fields = ("parent", "owner_agent")  # (the service says so too; here beside the field)

    class Meta:
        model = Goal
        fields = "__all__"


# Form field -> goal_update change key (the API's names); a related row goes as its id.
GOAL_CHANGE_KEYS = {"title": "title", "description": "description", "level": "level", "status": "status",
                    "parent": "parentId", "owner_agent": "ownerAgentId"}


@admin.register(Goal)
class GoalAdmin(FixedCompanyMixin, ServiceWriteAdminMixin, admin.ModelAdmin):
    """Goals are written by ``goal_create`` / ``goal_update`` (a parent and an owner of the goal's
    company, never a cycle, audited); a goal never changes company."""

    form = GoalAdminForm
    list_display = ("title", "company", "level", "status", "parent", "updated_at")
    list_filter = ("level", "status", "company")
    search_fields = ("title", "description")
    list_select_related = ("company", "parent")
    autocomplete_fields = ("company", "parent", "owner_agent")
    readonly_fields = AUDIT_FIELDS

    def save_model(self, request, obj, form, change):
        from issues.services.goals import goal_create, goal_update

        actor, data = Actor(user=request.user), form.cleaned_data
        if change:
            changes = form.changes(GOAL_CHANGE_KEYS)
            if changes:
                goal_update(actor=actor, goal=obj, changes=changes)
        else:
            self.adopt(obj, goal_create(actor=actor, company=data["company"], title=data["title"],
                                        description=data.get("description") or "", level=data["level"],
                                        status=data["status"], parent_id=getattr(data.get("parent"), "pk", None),
                                        owner_agent_id=getattr(data.get("owner_agent"), "pk", None)))
        obj.refresh_from_db()


# --- agents and keys ---------------------------------------------------------------------------------


class AgentApiKeyInline(ReadOnlyInlineMixin, admin.TabularInline):
    model = AgentApiKey
    fields = ("name", "prefix", "created_at", "last_used_at", "revoked_at")
    readonly_fields = fields


class AgentAdminForm(SameCompanyFormMixin, ServiceWrittenForm):
    same_company_fields = ("reports_to",)

    class Meta:
        model = Agent
        fields = "__all__"

    def clean(self):
        cleaned = super().clean()
        company = cleaned.get("company") or getattr(self.instance, "company", None)
        try:
            adapter_config_validate(cleaned.get("adapter_type") or "none", cleaned.get("adapter_config") or {},
                                    company_id=getattr(company, "pk", None))
        except InvalidInput as exc:
            for field, reasons in exc.details.items():
                self.add_error("adapter_type" if field == "adapterType" else "adapter_config", reasons)
        return cleaned


# Form field -> agent_update change key (upstream's names, as PATCH /api/agents/{id} takes them).
AGENT_CHANGE_KEYS = {**{field: api for api, field in AGENT_FIELDS.items()}, "status": "status"}
AGENT_CREATE_FIELDS = ("name", "role", "title", "reports_to", "capabilities", "adapter_type", "adapter_config",
                       "runtime_config", "budget_monthly_cents")


@admin.register(Agent)
class AgentAdmin(FixedCompanyMixin, ServiceWriteAdminMixin, admin.ModelAdmin):
    """Agents are created by ``agent_create`` (born paused in a stopped company) and changed by
    ``agent_update`` (a pause stops live runs, a resume checks the company's stop and the host-only
    statuses are refused) or ``agent_terminate`` (keys revoked, runs cancelled), as through the API;
    the pause reason is the services' to set, the company fixed once created."""

    form = AgentAdminForm
    list_display = ("name", "company", "role", "status", "adapter_type", "reports_to", "last_heartbeat_at",
                    "updated_at")
    list_filter = ("status", "role", "adapter_type", "company")
    search_fields = ("name", "title", "capabilities")
    list_select_related = ("company", "reports_to")
    autocomplete_fields = ("company", "reports_to")
    readonly_fields = (*AUDIT_FIELDS, "last_heartbeat_at", "spent_monthly_cents", "pause_reason")
    fieldsets = (
        (None, {"fields": ("company", "name", "title", "role", "status", "pause_reason", "reports_to",
                           "capabilities")}),
        ("Adapter", {"fields": ("adapter_type", "adapter_config", "runtime_config")}),
        ("Budget", {"fields": ("budget_monthly_cents", "spent_monthly_cents")}),
        ("Audit", {"fields": (*AUDIT_FIELDS, "last_heartbeat_at")}),
    )
    inlines = [AgentApiKeyInline]

    def get_readonly_fields(self, request, obj=None):
        fields = super().get_readonly_fields(request, obj)
        # a new agent starts idle (or paused by its company's stop)
        return (*fields, "status") if obj is None else fields

    def save_model(self, request, obj, form, change):
        from issues.services.agents import agent_terminate, agent_update
        from issues.services.companies import agent_create

        actor, data = Actor(user=request.user), form.cleaned_data
        if not change:
            self.adopt(obj, agent_create(company=data["company"], actor=actor,
                                         **{name: data[name] for name in AGENT_CREATE_FIELDS if name in data}))
        else:
            changes = form.changes(AGENT_CHANGE_KEYS, ids=False)  # agent_update takes the manager row
            terminate = changes.pop("status", None) if changes.get("status") == AgentStatus.TERMINATED else None
            if changes:
                obj = agent_update(actor=actor, agent=obj, changes=changes)
            if terminate:
                agent_terminate(actor=actor, agent=obj)
        obj.refresh_from_db()


@admin.register(AgentApiKey)
class AgentApiKeyAdmin(ServiceActionsMixin, admin.ModelAdmin):
    """Keys are minted by ``agent_api_key_create`` (the raw key is shown once, only the hash is kept)."""

    list_display = ("prefix", "name", "agent", "company", "created_at", "last_used_at", "revoked_at")
    list_filter = (("revoked_at", admin.EmptyFieldListFilter), "agent__company")
    search_fields = ("prefix", "name", "agent__name")
    list_select_related = ("agent", "agent__company")
    fields = ("agent", "name", "prefix", "key_hash", "created_at", "updated_at", "last_used_at", "revoked_at")
    readonly_fields = ("id", "agent", "prefix", "key_hash", "created_at", "updated_at", "last_used_at",
                       "revoked_at")
    actions = ["revoke_keys"]

    def has_add_permission(self, request):
        return False

    @admin.display(ordering="agent__company__name")
    def company(self, obj):
        return obj.agent.company

    @admin.action(description="Revoke selected API keys", permissions=["change"])
    def revoke_keys(self, request, queryset):
        actor = Actor(user=request.user)
        done = self.through_service(
            request, queryset.filter(revoked_at__isnull=True).select_related("agent"),
            lambda key: agent_key_revoke(actor=actor, agent=key.agent, key_id=key.pk), refused="Not revoked")
        if done:
            self.message_user(request, f"Revoked {len(done)} key(s).", messages.SUCCESS)


# --- issues ------------------------------------------------------------------------------------------


class CommentInline(ReadOnlyInlineMixin, admin.TabularInline):
    model = Comment
    fields = ("created_at", "author_type", "author", "excerpt")
    readonly_fields = fields
    ordering = ("created_at", "id")

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("author_agent", "author_user")

    @admin.display(description="author")
    def author(self, obj):
        return obj.author_agent or obj.author_user or obj.author_type

    @admin.display(description="comment")
    def excerpt(self, obj):
        return _short(obj.body, 200)


class IssueAdminForm(SameCompanyFormMixin, ServiceWrittenForm):
    same_company_fields = ("assignee_agent", "parent", "project", "goal")

    class Meta:
        model = Issue
        fields = ("title", "description", "status", "priority", "assignee_agent", "parent", "project", "goal")


# Form field -> issue_update change key.
ISSUE_CHANGE_KEYS = {
    "title": "title",
    "description": "description",
    "status": "status",
    "priority": "priority",
    "assignee_agent": "assignee_agent_id",
    "parent": "parent_id",
    "project": "project_id",
    "goal": "goal_id",
}


@admin.register(Issue)
class IssueAdmin(ServiceWriteAdminMixin, admin.ModelAdmin):
    """Issues are numbered by ``issue_create``; changes go through ``issue_update``."""

    form = IssueAdminForm
    list_display = ("identifier", "title", "company", "status", "priority", "assignee", "project", "updated_at")
    list_display_links = ("identifier", "title")
    list_filter = ("status", "priority", "origin_kind", "company")
    search_fields = ("identifier", "title", "description")
    list_select_related = ("company", "assignee_agent", "assignee_user", "project")
    autocomplete_fields = ("assignee_agent", "parent", "project", "goal")
    readonly_fields = (
        *AUDIT_FIELDS, "company", "number", "identifier", "priority_rank", "assignee_user",
        "created_by_agent", "created_by_user", "origin_kind", "origin_id", "origin_issue", "origin_run",
        "checkout_run", "execution_run", "execution_locked_at", "started_at", "completed_at", "cancelled_at",
    )
    fieldsets = (
        (None, {"fields": ("company", "identifier", "title", "description")}),
        ("State", {"fields": ("status", "priority", "assignee_agent", "assignee_user")}),
        ("Placement", {"fields": ("parent", "project", "goal")}),
        ("Claim", {"fields": ("checkout_run", "execution_run", "execution_locked_at")}),
        ("Provenance", {"fields": ("origin_kind", "origin_id", "origin_issue", "origin_run", "created_by_agent",
                                   "created_by_user")}),
        ("Audit", {"fields": (*AUDIT_FIELDS, "number", "priority_rank", "started_at", "completed_at",
                              "cancelled_at")}),
    )
    inlines = [CommentInline]

    def has_add_permission(self, request):
        return False

    @admin.display(description="assignee", ordering="assignee_agent__name")
    def assignee(self, obj):
        return obj.assignee_agent or obj.assignee_user or "—"

    def save_model(self, request, obj, form, change):
        from issues.services.issues import issue_update

        changes = form.changes(ISSUE_CHANGE_KEYS)
        if changes:
            issue_update(actor=Actor(user=request.user), issue=obj, changes=changes)
            obj.refresh_from_db()


@admin.register(IssueRelation)
class IssueRelationAdmin(ViewOnlyAdminMixin, admin.ModelAdmin):
    """Blockers are set through the API and the console (``relation_add``, ``blockedByIssueIds``):
    same company only, never a cycle, and a removed blocker returns its issue to work."""

    list_display = ("issue", "kind", "related_issue", "company", "created_at")
    list_filter = ("kind", "company")
    search_fields = ("issue__identifier", "related_issue__identifier")
    list_select_related = ("issue", "related_issue", "company")

    def has_delete_permission(self, request, obj=None):
        return False


# --- the issue thread --------------------------------------------------------------------------------


@admin.register(Comment)
class CommentAdmin(admin.ModelAdmin):
    """Comments are posted through the thread service; the admin may only moderate the text."""

    list_display = ("issue", "author_type", "author", "excerpt", "created_at")
    list_filter = ("author_type", "company")
    search_fields = ("body", "issue__identifier")
    list_select_related = ("issue", "author_agent", "author_user")
    readonly_fields = (*AUDIT_FIELDS, "company", "issue", "author_type", "author_agent", "author_user", "run",
                       "provenance")
    fields = ("issue", "author_type", "author_agent", "author_user", "run", "body", "provenance", *AUDIT_FIELDS,
              "company")

    def has_add_permission(self, request):
        return False

    @admin.display(description="author")
    def author(self, obj):
        return obj.author_agent or obj.author_user or obj.author_type

    @admin.display(description="comment")
    def excerpt(self, obj):
        return _short(obj.body)


class DocumentRevisionInline(ReadOnlyInlineMixin, admin.TabularInline):
    model = DocumentRevision
    fields = ("number", "title", "author_type", "author_agent", "author_user", "created_at")
    readonly_fields = fields
    ordering = ("-number",)


@admin.register(Document)
class DocumentAdmin(admin.ModelAdmin):
    """Documents are written by ``document_write`` (one revision per write)."""

    list_display = ("key", "issue", "title", "format", "revision_count", "updated_at")
    list_filter = ("format", "company")
    search_fields = ("key", "title", "issue__identifier")
    list_select_related = ("issue",)
    readonly_fields = (*AUDIT_FIELDS, "company", "issue", "key", "latest_revision", "revision_count")
    inlines = [DocumentRevisionInline]

    def has_add_permission(self, request):
        return False


@admin.register(DocumentRevision)
class DocumentRevisionAdmin(ViewOnlyAdminMixin, admin.ModelAdmin):
    """Revisions are immutable history."""

    list_display = ("document", "number", "title", "author_type", "author_agent", "created_at")
    list_filter = ("author_type",)
    search_fields = ("document__key", "document__issue__identifier", "title", "body")
    list_select_related = ("document", "author_agent")

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(WorkProduct)
class WorkProductAdmin(admin.ModelAdmin):
    """Work products are recorded by agents and runs through the API; here their description is
    corrected, never the issue, run or company they belong to."""

    list_display = ("title", "kind", "issue", "status", "url", "created_at")
    list_filter = ("kind", "status", "company")
    search_fields = ("title", "url", "external_id", "issue__identifier")
    list_select_related = ("issue",)
    readonly_fields = (*AUDIT_FIELDS, "company", "issue", "run")
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}

    def has_add_permission(self, request):
        return False


@admin.register(Attachment)
class AttachmentAdmin(ViewOnlyAdminMixin, admin.ModelAdmin):
    """Files are attached and removed through the API or the console's issue page, which audit both
    and take the stored bytes with the row; here they are only looked at."""

    list_display = ("original_filename", "issue", "content_type", "byte_size", "author_type", "created_at")
    list_filter = ("content_type", "author_type", "company")
    search_fields = ("original_filename", "sha256", "issue__identifier")
    list_select_related = ("issue",)

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Asset)
class AssetAdmin(ViewOnlyAdminMixin, admin.ModelAdmin):
    """Company images (logos) are uploaded through the API or the console; here they are only looked at."""

    list_display = ("original_filename", "company", "content_type", "byte_size", "created_at")
    list_filter = ("content_type", "company")
    search_fields = ("original_filename", "sha256")

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Interaction)
class InteractionAdmin(admin.ModelAdmin):
    """Interactions are opened and answered through the thread service."""

    list_display = ("title", "kind", "status", "issue", "created_at", "responded_at", "expires_at")
    list_filter = ("kind", "status", "company")
    search_fields = ("title", "body", "issue__identifier")
    list_select_related = ("issue",)
    readonly_fields = (*AUDIT_FIELDS, "company", "issue", "kind", "document_revision", "created_by_agent",
                       "created_by_user", "run", "response", "responded_by", "responded_at")

    def has_add_permission(self, request):
        return False


# --- approvals ---------------------------------------------------------------------------------------


class ApprovalIssueInline(ReadOnlyInlineMixin, admin.TabularInline):
    model = ApprovalIssue
    fields = ("issue", "created_at")
    readonly_fields = fields


@admin.register(Approval)
class ApprovalAdmin(ServiceActionsMixin, admin.ModelAdmin):
    """Approvals are requested through the API (``approval_create``) and decided by the actions here,
    which are ``approval_decide`` (the requesting agent is woken, the decision audited); only the
    title is edited in place."""

    list_display = ("title", "company", "type", "status", "requested_by", "decided_at", "created_at")
    list_filter = ("status", "type", "company")
    search_fields = ("title", "decision_note")
    list_select_related = ("company", "requested_by_agent", "requested_by_user")
    fields = ("company", "type", "status", "title", "payload", "requested_by_agent", "requested_by_user",
              "decided_by_user", "decision_note", "decided_at", *AUDIT_FIELDS)
    readonly_fields = tuple(name for name in fields if name != "title")
    inlines = [ApprovalIssueInline]
    actions = ["approve", "reject", "request_revision"]

    def has_add_permission(self, request):
        return False

    @admin.display(description="requested by")
    def requested_by(self, obj):
        return obj.requested_by_agent or obj.requested_by_user or "—"

    def _decide(self, request, queryset, status):
        from issues.services.approvals import approval_decide

        actor = Actor(user=request.user)
        decided = self.through_service(request, queryset, refused="Not decided",
                                       call=lambda approval: approval_decide(actor=actor, approval=approval,
                                                                             status=status))
        if decided:
            self.message_user(request, f"{status.replace('_', ' ').capitalize()}: {len(decided)} approval(s).",
                              messages.SUCCESS)

    @admin.action(description="Approve selected approvals")
    def approve(self, request, queryset):
        self._decide(request, queryset, ApprovalStatus.APPROVED)

    @admin.action(description="Reject selected approvals")
    def reject(self, request, queryset):
        self._decide(request, queryset, ApprovalStatus.REJECTED)

    @admin.action(description="Request a revision of selected approvals")
    def request_revision(self, request, queryset):
        self._decide(request, queryset, ApprovalStatus.REVISION_REQUESTED)


@admin.register(ApprovalIssue)
class ApprovalIssueAdmin(ViewOnlyAdminMixin, admin.ModelAdmin):
    """Links are made with the approval (``approval_create``) or through the API."""

    list_display = ("approval", "issue", "created_at")
    search_fields = ("approval__title", "issue__identifier")
    list_select_related = ("approval", "issue")

    def has_delete_permission(self, request, obj=None):
        return False


# --- run machinery -----------------------------------------------------------------------------------


class RunEventInline(ReadOnlyInlineMixin, admin.TabularInline):
    model = RunEvent
    fields = ("seq", "kind", "message", "created_at")
    readonly_fields = fields
    ordering = ("-seq",)


@admin.register(HeartbeatRun)
class HeartbeatRunAdmin(ViewOnlyAdminMixin, admin.ModelAdmin):
    """Runs are created and finished by the scheduler and the run services."""

    list_display = ("id", "agent", "company", "issue", "status", "invocation_source", "started_at",
                    "finished_at", "created_at")
    list_filter = ("status", "invocation_source", "company")
    search_fields = ("agent__name", "issue__identifier", "wake_reason", "error")
    list_select_related = ("agent", "company", "issue")
    inlines = [RunEventInline]
    date_hierarchy = "created_at"


@admin.register(WakeupRequest)
class WakeupRequestAdmin(ViewOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("agent", "issue", "source", "status", "coalesced_count", "run", "created_at")
    list_filter = ("status", "source", "company")
    search_fields = ("agent__name", "issue__identifier", "reason", "idempotency_key")
    list_select_related = ("agent", "issue", "run")
    date_hierarchy = "created_at"


@admin.register(RunEvent)
class RunEventAdmin(ViewOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("run", "seq", "kind", "short_message", "created_at")
    list_filter = ("kind",)
    search_fields = ("message", "run__id")
    list_select_related = ("run",)

    @admin.display(description="message")
    def short_message(self, obj):
        return _short(obj.message)


@admin.register(RunnerSession)
class RunnerSessionAdmin(ViewOnlyAdminMixin, admin.ModelAdmin):
    """A PRP run's negotiation and projections, written by the runner protocol (issues.runner)."""

    list_display = ("run", "company", "protocol_version", "runner_instance_id", "event_count", "controller_seq",
                    "hello_at")
    list_filter = ("protocol_version", "company")
    search_fields = ("run__id", "runner_instance_id")
    list_select_related = ("run", "company")


@admin.register(RunnerSource)
class RunnerSourceAdmin(ViewOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("run", "source_key", "acked_seq", "updated_at")
    search_fields = ("run__id", "source_key")
    list_select_related = ("run",)


@admin.register(RunnerEvent)
class RunnerEventAdmin(ViewOnlyAdminMixin, admin.ModelAdmin):
    """Committed PRP events, exactly as the runner sent them (never edited: they are acknowledged)."""

    list_display = ("run", "position", "source_key", "source_seq", "event_type", "received_at")
    list_filter = ("event_type",)
    search_fields = ("run__id", "source_event_id", "event_type")
    list_select_related = ("run",)


@admin.register(RunnerCommand)
class RunnerCommandAdmin(ViewOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("run", "controller_seq", "command_type", "status", "delivered_at", "result_at", "confirm_by")
    list_filter = ("status", "command_type")
    search_fields = ("run__id", "command_id", "command_type")
    list_select_related = ("run",)


@admin.register(ExecutionWorkspace)
class ExecutionWorkspaceAdmin(ViewOnlyAdminMixin, admin.ModelAdmin):
    """Workspaces are realized and removed by the host, never edited by hand."""

    list_display = ("key", "company", "project", "source_issue", "strategy", "status", "branch", "last_used_at")
    list_filter = ("strategy", "status", "company")
    search_fields = ("key", "path", "branch", "source_issue__identifier")
    list_select_related = ("company", "project", "source_issue")


@admin.register(WorkflowDocumentCache)
class WorkflowDocumentCacheAdmin(ViewOnlyAdminMixin, admin.ModelAdmin):
    """The last good workflow document per project and source, kept by the host (issues.workflow)."""

    list_display = ("project", "source", "short_version", "loaded_at", "has_error")
    list_filter = ("source", "company")
    search_fields = ("project__name", "content_hash", "last_error")
    list_select_related = ("project",)

    def has_delete_permission(self, request, obj=None):
        return False  # deleting a row would drop the last good version an invalid edit falls back to

    @admin.display(description="version")
    def short_version(self, obj):
        return obj.content_hash[:12] or "—"

    @admin.display(description="invalid version reported", boolean=True)
    def has_error(self, obj):
        return bool(obj.error_hash)


# --- audit -------------------------------------------------------------------------------------------


@admin.register(ActivityLog)
class ActivityLogAdmin(admin.ModelAdmin):
    """The append-only audit trail: nobody adds, edits or deletes entries from the admin."""

    list_display = ("created_at", "company", "action", "entity_type", "entity_id", "actor_type", "actor")
    list_filter = ("actor_type", "entity_type", "company")
    search_fields = ("action", "entity_id")
    list_select_related = ("company", "actor_agent", "actor_user")
    date_hierarchy = "created_at"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="actor")
    def actor(self, obj):
        return obj.actor_agent or obj.actor_user or obj.actor_type


# --- upstream-compatible records (issue #14): written through the API services ------------------


@admin.register(BoardApiKey)
class BoardApiKeyAdmin(ViewOnlyAdminMixin, admin.ModelAdmin):
    """Operator API keys; only the hash is stored, the token is shown once at creation."""

    list_display = ("prefix", "name", "user", "expires_at", "last_used_at", "revoked_at", "created_at")
    list_filter = ("revoked_at",)
    search_fields = ("name", "prefix", "user__username")
    list_select_related = ("user",)
    exclude = ("key_hash",)


@admin.register(Label)
class LabelAdmin(ViewOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("name", "color", "company", "created_at")
    list_filter = ("company",)
    search_fields = ("name",)
    list_select_related = ("company",)


@admin.register(CostEvent)
class CostEventAdmin(ViewOnlyAdminMixin, admin.ModelAdmin):
    """The spend ledger: reported cost events and run usage, each counted once."""

    list_display = ("occurred_at", "company", "agent", "provider", "model", "cost_cents", "run")
    list_filter = ("provider", "company")
    search_fields = ("agent__name", "provider", "model", "billing_code")
    list_select_related = ("company", "agent", "run")
    date_hierarchy = "occurred_at"


@admin.register(ApprovalComment)
class ApprovalCommentAdmin(ViewOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("approval", "author_agent", "author_user", "short_body", "created_at")
    search_fields = ("body", "approval__title")
    list_select_related = ("approval", "author_agent", "author_user")

    @admin.display(description="body")
    def short_body(self, obj):
        return _short(obj.body)
