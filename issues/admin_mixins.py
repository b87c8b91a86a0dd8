"""Admin building blocks shared by the apps' admins (issues, cases, connectors): rows a service
writes, rows only shown, and rows that never leave their company."""
from django import forms
from django.contrib import messages
from django.http import HttpResponseRedirect

from issues.exceptions import ApiError


def error_text(exc: ApiError) -> str:
    details = "; ".join(f"{field}: {' '.join(map(str, msgs))}" for field, msgs in (exc.details or {}).items()
                        if isinstance(msgs, (list, tuple)))
    return f"{exc.message} {details}".strip()


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


class FixedCompanyMixin:
    """A row never changes company once created: what refers to it (issues, runs, keys, goals)
    stays in that company."""

    def get_readonly_fields(self, request, obj=None):
        fields = super().get_readonly_fields(request, obj)
        return (*fields, "company") if obj is not None else fields


class ServiceWriteAdminMixin:
    """A service's refusal (an ApiError) is shown on the form's page; the admin wraps the change in a
    transaction, so nothing was written."""

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except ApiError as exc:
            self.message_user(request, f"Not saved: {error_text(exc)}", messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())


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
