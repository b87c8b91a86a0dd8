"""Django admin for cases. Writes go through the case services, as through the API: a case's facts
(title, summary, fields) with ``case_update``, workflow definitions with
``workflow_definition_create`` / ``_update`` (name unique per company, fingerprint, audit). A case is
created, linked, handed off and closed through the API and the console; its links, events and
handoffs are shown here, not edited."""
from django.contrib import admin

from issues.actors import Actor
from issues.admin_mixins import (
    FixedCompanyMixin,
    ReadOnlyInlineMixin,
    ServiceWriteAdminMixin,
    ServiceWrittenForm,
    ViewOnlyAdminMixin,
)

from .models import Case, CaseDocument, CaseDocumentRevision, CaseEvent, CaseHandoff, CaseIssueLink, WorkflowDefinition
from .services import CASE_UPDATE_FIELDS


class CaseIssueLinkInline(ReadOnlyInlineMixin, admin.TabularInline):
    model = CaseIssueLink
    fields = ("issue", "role", "created_at")
    readonly_fields = fields


class CaseAdminForm(ServiceWrittenForm):
    class Meta:
        model = Case
        fields = CASE_UPDATE_FIELDS


@admin.register(Case)
class CaseAdmin(ServiceWriteAdminMixin, admin.ModelAdmin):
    form = CaseAdminForm
    list_display = ("identifier", "title", "case_type", "status", "phase", "company", "project", "updated_at")
    list_filter = ("status", "company", "case_type")
    search_fields = ("identifier", "title", "summary", "idempotency_key")
    fields = ("company", "identifier", "case_type", "title", "summary", "fields", "status", "phase", "parent",
              "project", "primary_task", "current_workflow", "idempotency_key", "created_by_agent",
              "created_by_user", "number", "created_at", "updated_at")
    readonly_fields = tuple(name for name in fields if name not in CASE_UPDATE_FIELDS)
    inlines = [CaseIssueLinkInline]

    def has_add_permission(self, request):
        return False

    def save_model(self, request, obj, form, change):
        from .services import case_update

        changes = form.changes({name: name for name in CASE_UPDATE_FIELDS})
        if changes:
            case_update(actor=Actor(user=request.user), case=obj, changes=changes)
        obj.refresh_from_db()


class CaseDocumentRevisionInline(admin.TabularInline):
    """Revisions are history: written through the API, never edited here."""
    model = CaseDocumentRevision
    extra = 0
    can_delete = False
    fields = ("number", "title", "author_type", "author_agent", "author_user", "created_at")
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(CaseDocument)
class CaseDocumentAdmin(admin.ModelAdmin):
    list_display = ("case", "key", "title", "revision_count", "system", "quarantined_at", "updated_at")
    list_filter = ("system", "company")
    search_fields = ("key", "title", "case__identifier")
    raw_id_fields = ("case", "latest_revision", "quarantined_by")
    readonly_fields = ("company", "case", "key", "latest_revision", "revision_count", "system", "created_at",
                       "updated_at")
    inlines = [CaseDocumentRevisionInline]


@admin.register(CaseIssueLink)
class CaseIssueLinkAdmin(ViewOnlyAdminMixin, admin.ModelAdmin):
    list_display = ("case", "issue", "role", "created_at")
    list_filter = ("role",)

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(CaseEvent)
class CaseEventAdmin(admin.ModelAdmin):
    list_display = ("case", "kind", "actor_type", "created_at")
    list_filter = ("kind", "actor_type")
    search_fields = ("case__identifier",)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class WorkflowDefinitionAdminForm(ServiceWrittenForm):
    class Meta:
        model = WorkflowDefinition
        fields = ("company", "name", "description", "prompt")


@admin.register(WorkflowDefinition)
class WorkflowDefinitionAdmin(FixedCompanyMixin, ServiceWriteAdminMixin, admin.ModelAdmin):
    form = WorkflowDefinitionAdminForm
    list_display = ("name", "company", "fingerprint", "updated_at")
    list_filter = ("company",)
    search_fields = ("name", "description")
    readonly_fields = ("fingerprint", "created_at", "updated_at")

    def save_model(self, request, obj, form, change):
        from .services import workflow_definition_create, workflow_definition_update

        actor, data = Actor(user=request.user), form.cleaned_data
        if change:
            changes = form.changes({name: name for name in ("name", "description", "prompt")})
            if changes:
                workflow_definition_update(actor=actor, definition=obj, changes=changes)
        else:
            self.adopt(obj, workflow_definition_create(actor=actor, company=data["company"], name=data["name"],
                                                       prompt=data["prompt"],
                                                       description=data.get("description") or ""))
        obj.refresh_from_db()


@admin.register(CaseHandoff)
class CaseHandoffAdmin(admin.ModelAdmin):
    list_display = ("case", "status", "workflow_action", "workflow_name", "phase", "from_agent", "to_agent",
                    "created_at")
    list_filter = ("status", "workflow_action")
    search_fields = ("case__identifier", "workflow_name", "idempotency_key")
    readonly_fields = [f.name for f in CaseHandoff._meta.fields]

    def has_add_permission(self, request):
        return False
