"""The current company's settings page: name, description, status, budget, hire approvals and
branding (the logo and colour the header shows), archiving and, for owners, deleting. Every change
goes through the services the API uses (issues.services.costs.company_update, .assets, .companies),
so the rules and the audit rows are the same."""
from __future__ import annotations

from django import forms
from django.contrib import messages
from django.http import Http404, HttpResponseRedirect
from django.urls import reverse
from django.views.decorators.http import require_GET

from issues.choices import CompanyStatus
from issues.exceptions import ApiError
from issues.services.assets import company_logo_upload
from issues.services.companies import company_delete
from issues.services.costs import BRAND_COLOR, company_archive, company_update
from paperclip.core.errors import error_text
from paperclip.core.uploads import max_upload_bytes, one_uploaded_file

from .base import perform, render_page
from .permissions import MANAGE_COMPANY, OWNER, console_action, console_actor, console_page, require_role


class CompanySettingsForm(forms.Form):
    name = forms.CharField(max_length=200)
    description = forms.CharField(required=False, widget=forms.Textarea(attrs={"rows": 3}))
    status = forms.ChoiceField(choices=[(CompanyStatus.ACTIVE, "Active"), (CompanyStatus.PAUSED, "Paused")],
                               help_text="A paused company runs no agent until it is active again.")
    budget_monthly_cents = forms.IntegerField(min_value=0, label="Monthly budget (cents)",
                                              help_text="0 means no budget.")
    require_board_approval_for_new_agents = forms.BooleanField(
        required=False, label="Hires wait for the board's approval")
    brand_color = forms.CharField(required=False, max_length=7, label="Brand colour",
                                  widget=forms.TextInput(attrs={"placeholder": "#RRGGBB"}))

    API_NAMES = {"name": "name", "description": "description", "status": "status",
                 "budget_monthly_cents": "budgetMonthlyCents",
                 "require_board_approval_for_new_agents": "requireBoardApprovalForNewAgents",
                 "brand_color": "brandColor"}

    def clean_brand_color(self):
        value = self.cleaned_data["brand_color"].strip()
        if value and not BRAND_COLOR.fullmatch(value):
            raise forms.ValidationError("Use a colour as #RRGGBB, or leave it empty.")
        return value.lower()

    def changes(self) -> dict:
        """The API's names of the fields that changed."""
        return {self.API_NAMES[name]: self.cleaned_data[name] for name in self.changed_data}


def _form_for(company, data=None):
    initial = {name: getattr(company, name) for name in CompanySettingsForm.API_NAMES}
    form = CompanySettingsForm(data, initial=initial)
    if company.status == CompanyStatus.ARCHIVED:  # archived is for good: the status is shown, not chosen
        form.fields["status"].choices = [(CompanyStatus.ARCHIVED, "Archived")]
        form.fields["status"].disabled = True
    return form


def _company(request):
    if request.company is None:
        raise Http404("No company.")
    return request.company


def _page(request, company, form=None, status=200):
    context = {"company": company, "form": form or _form_for(company), "max_logo_bytes": max_upload_bytes()}
    return render_page(request, "console/company/settings.html", None, context, status=status)


def settings_url() -> str:
    return reverse("console:company-settings")


@console_page
@require_GET
def company_settings(request):
    return _page(request, _company(request))


@console_action
def company_settings_save(request):
    company = _company(request)
    require_role(request, company.pk, MANAGE_COMPANY)
    form = _form_for(company, request.POST)
    if not form.is_valid():
        return _page(request, company, form, status=400)
    try:
        company_update(actor=console_actor(request), company=company, changes=form.changes())
    except ApiError as exc:
        form.add_error(None, error_text(exc))
        return _page(request, company, form, status=400)
    messages.success(request, "Company settings saved." if form.changed_data else "Nothing changed.")
    return HttpResponseRedirect(settings_url())


def _set_logo(request, company):
    actor = console_actor(request)
    asset = company_logo_upload(actor=actor, company=company, upload=one_uploaded_file(request, "file"))
    return company_update(actor=actor, company=company, changes={"logoAssetId": asset.pk})


@console_action
def company_logo_set(request):
    company = _company(request)
    require_role(request, company.pk, MANAGE_COMPANY)
    return perform(request, lambda: _set_logo(request, company), success="Logo updated.",
                   redirect_to=settings_url() + "#branding")


@console_action
def company_logo_clear(request):
    company = _company(request)
    require_role(request, company.pk, MANAGE_COMPANY)
    return perform(request, lambda: company_update(actor=console_actor(request), company=company,
                                                   changes={"logoAssetId": None}),
                   success="Logo removed.", redirect_to=settings_url() + "#branding")


@console_action
def company_archive_view(request):
    company = _company(request)
    require_role(request, company.pk, MANAGE_COMPANY)
    return perform(request, lambda: company_archive(actor=console_actor(request), company=company),
                   success=f"{company.name} archived: its agents are stopped.", redirect_to=settings_url())


@console_action
def company_delete_view(request):
    company = _company(request)
    require_role(request, company.pk, OWNER)
    if request.POST.get("confirm", "") != company.issue_prefix:
        messages.error(request, f"Type the company's prefix ({company.issue_prefix}) to delete it.")
        return HttpResponseRedirect(settings_url() + "#danger")
    try:
        company_delete(actor=console_actor(request), company=company)
    except ApiError as exc:
        messages.error(request, error_text(exc))
        return HttpResponseRedirect(settings_url() + "#danger")
    messages.success(request, f"{company.name} ({company.issue_prefix}) and everything in it were deleted.")
    return HttpResponseRedirect(reverse("console:home"))
