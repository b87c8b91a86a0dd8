"""Admin building blocks shared by the apps' admins (issues, cases, connectors): rows a service
writes, rows only shown, and rows that never leave their company."""
from django import forms
from django.contrib import messages
from django.db import models
from django.http import HttpResponseRedirect

from issues.exceptions import ApiError
from paperclip.core.errors import error_text


class ReadOnlyInlineMixin:
    """An inline that shows rows but never adds, changes or deletes them."""

    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ViewOnlyAdminMixin:
    """Rows written only by services: the admin may look, never add or change."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class ServiceWrittenForm(forms.ModelForm):
    """A change form whose row a service writes (the admin's save_model): the service compares with
    the stored row and checks the constraints, so the form does not apply its values to it first."""

    def _post_clean(self):
        pass

    def changes(self, keys: dict, *, ids: bool = True) -> dict:
        """What the operator changed, under the service's names (``keys``: form field -> name), each
        compared with the stored row (a JSON field posted back as it was may still count as changed
        to the form); a related row as its id, unless ``ids=False``."""
        found = {}
        for name in self.changed_data:
            value = self.cleaned_data.get(name)
            if name in keys and value != getattr(self.instance, name):
                found[keys[name]] = value.pk if ids and isinstance(value, models.Model) else value
        return found


class FixedCompanyMixin:
    """A row never changes company once created: what refers to it (issues, runs, keys, goals)
    stays in that company."""

    def get_readonly_fields(self, request, obj=None):
        fields = super().get_readonly_fields(request, obj)
        return (*fields, "company") if obj is not None else fields


class ServiceWriteAdminMixin:
    """A service's refusal (an ApiError) is shown on the form's page; the admin wraps the change in a
    transaction, so nothing was written."""

    @staticmethod
    def adopt(obj, created) -> None:
        """The admin's unsaved ``obj`` stands for the row a service created (the admin's log entry
        and redirect use it)."""
        obj.pk, obj._state.adding = created.pk, False

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except ApiError as exc:
            self.message_user(request, f"Not saved: {error_text(exc)}", messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())


class ServiceActionsMixin:
    """Admin actions that call a service once per selected row."""

    def through_service(self, request, queryset, call, *, refused: str) -> list:
        """``call(row)`` for each selected row; a refusal (an ApiError) is reported as
        "{refused}: {row}: {reason}" and leaves that row as it was. Returns the rows done."""
        done = []
        for row in queryset:
            try:
                call(row)
            except ApiError as exc:
                self.message_user(request, f"{refused}: {row}: {error_text(exc)}", messages.ERROR)
            else:
                done.append(row)
        return done


class SameCompanyFormMixin:
    """Every related row the form picks (``same_company_fields``) belongs to the row's company (the
    form's ``company`` or the stored row's), as the API's 404 for another company's id."""

    same_company_fields: tuple = ()

    def row_company_id(self, cleaned):
        company = cleaned.get("company")
        return company.pk if company is not None else getattr(self.instance, "company_id", None)

    def clean(self):
        cleaned = super().clean()
        company_id = self.row_company_id(cleaned)
        for name in self.same_company_fields:
            value = cleaned.get(name)
            if value is not None and company_id is not None and value.company_id != company_id:
                self.add_error(name, "Must belong to the same company.")
        return cleaned
