"""Django admin for cases. Cases and definitions are plain rows; events and handoffs are audit."""
from django.contrib import admin

from .models import Case, CaseDocument, CaseDocumentRevision, CaseEvent, CaseHandoff, CaseIssueLink, WorkflowDefinition


class CaseIssueLinkInline(admin.TabularInline):
    model = CaseIssueLink
    extra = 0
    raw_id_fields = ("issue",)
    readonly_fields = ("created_at",)


@admin.register(Case)
class CaseAdmin(admin.ModelAdmin):
    list_display = ("identifier", "title", "case_type", "status", "phase", "company", "project", "updated_at")
    list_filter = ("status", "company", "case_type")
    search_fields = ("identifier", "title", "summary", "idempotency_key")
    raw_id_fields = ("parent", "project", "primary_task", "current_workflow", "created_by_agent", "created_by_user")
    readonly_fields = ("number", "identifier", "created_at", "updated_at")
    inlines = [CaseIssueLinkInline]


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
class CaseIssueLinkAdmin(admin.ModelAdmin):
    list_display = ("case", "issue", "role", "created_at")
    list_filter = ("role",)
    raw_id_fields = ("case", "issue")


@admin.register(CaseEvent)
class CaseEventAdmin(admin.ModelAdmin):
    list_display = ("case", "kind", "actor_type", "created_at")
    list_filter = ("kind", "actor_type")
    search_fields = ("case__identifier",)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(WorkflowDefinition)
class WorkflowDefinitionAdmin(admin.ModelAdmin):
    list_display = ("name", "company", "fingerprint", "updated_at")
    list_filter = ("company",)
    search_fields = ("name", "description")
    readonly_fields = ("fingerprint", "created_at", "updated_at")

    def save_model(self, request, obj, form, change):
        from .services import prompt_fingerprint

        obj.fingerprint = prompt_fingerprint(obj.prompt)
        super().save_model(request, obj, form, change)


@admin.register(CaseHandoff)
class CaseHandoffAdmin(admin.ModelAdmin):
    list_display = ("case", "status", "workflow_action", "workflow_name", "phase", "from_agent", "to_agent",
                    "created_at")
    list_filter = ("status", "workflow_action")
    search_fields = ("case__identifier", "workflow_name", "idempotency_key")
    readonly_fields = [f.name for f in CaseHandoff._meta.fields]

    def has_add_permission(self, request):
        return False
