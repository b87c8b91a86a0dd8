"""Agent pages: list and create, pause/resume, permissions (tasks:assign, agents:create), API keys
(the raw key is shown once), adapter configuration, and the agent's runs. Managing agents needs the
admin (or owner) role."""
from __future__ import annotations

import json

from django import forms
from django.contrib import messages
from django.http import HttpResponseRedirect
from django.urls import reverse
from django.views.decorators.http import require_GET

from issues.choices import AdapterType, AgentRole
from issues.exceptions import ApiError, NotFound
from issues.models import Agent, AgentApiKey, HeartbeatRun
from issues.selectors import agent_console_list, assignable_agents, hire_approval, scoped_get
from issues.services.agent_grants import agent_permissions, may_assign_tasks
from issues.services import agents as agent_services
from issues.services.agents import agent_adapter_update, agent_pause, agent_permissions_update, agent_resume
from issues.services.companies import agent_api_key_create, agent_create

from .base import adopt_company, error_text, perform, render_page
from .permissions import MANAGE_AGENTS, console_action, console_actor, console_page, require_role

AGENT_RUNS_SHOWN = 50


class AgentCreateForm(forms.Form):
    name = forms.CharField(max_length=120)
    title = forms.CharField(max_length=200, required=False)
    role = forms.ChoiceField(choices=AgentRole.choices, initial=AgentRole.GENERAL)
    reports_to = forms.ChoiceField(required=False, label="Reports to")
    adapter_type = forms.ChoiceField(choices=AdapterType.choices, initial=AdapterType.NONE, label="Adapter")
    budget_dollars = forms.DecimalField(min_value=0, max_digits=10, decimal_places=2, required=False,
                                        label="Monthly budget ($)", help_text="Empty or 0: no limit.")

    def __init__(self, *args, company, **kwargs):
        super().__init__(*args, **kwargs)
        agents = assignable_agents(company=company)
        self.fields["reports_to"].choices = [("", "Nobody"), *[(str(a.pk), a.name) for a in agents]]


class AdapterForm(forms.Form):
    adapter_type = forms.ChoiceField(choices=AdapterType.choices, label="Adapter")
    adapter_config = forms.CharField(widget=forms.Textarea(attrs={"rows": 10, "spellcheck": "false"}),
                                     required=False, label="Adapter config (JSON object)")

    def clean_adapter_config(self):
        raw = (self.cleaned_data.get("adapter_config") or "").strip() or "{}"
        try:
            value = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise forms.ValidationError(f"Not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno}).")
        if not isinstance(value, dict):
            raise forms.ValidationError("Must be a JSON object.")
        return value


def _agent(request, agent_id) -> Agent:
    agent = scoped_get(Agent.objects.select_related("company", "reports_to"), console_actor(request), agent_id,
                       "Agent")
    adopt_company(request, agent.company)
    return agent


def agent_url(agent) -> str:
    return reverse("console:agent-detail", args=[agent.pk])


def _list_context(request, company, form=None):
    return {"company": company, "agents": list(agent_console_list(company=company)) if company else [],
            "form": form or (AgentCreateForm(company=company) if company else None)}


@console_page
@require_GET
def agent_list(request):
    return render_page(request, "console/agents/list.html", None, _list_context(request, request.company))


@console_action
def agent_new(request):
    company = request.company
    if company is None:
        raise NotFound("No company.")
    require_role(request, company.pk, MANAGE_AGENTS)
    form = AgentCreateForm(request.POST, company=company)
    if form.is_valid():
        data = form.cleaned_data
        try:
            reports_to = (scoped_get(Agent.objects.all(), console_actor(request), data["reports_to"], "Agent")
                          if data["reports_to"] else None)
            if reports_to is not None and reports_to.company_id != company.pk:
                raise NotFound("Agent not found.")
            agent = agent_create(
                company=company, name=data["name"].strip(), role=data["role"], title=data["title"],
                reports_to=reports_to, adapter_type=data["adapter_type"],
                budget_monthly_cents=int((data["budget_dollars"] or 0) * 100), actor=console_actor(request),
            )
        except ApiError as exc:
            form.add_error(None, error_text(exc))
        else:
            messages.success(request, f"Agent {agent.name} created. Create an API key for it below.")
            return HttpResponseRedirect(agent_url(agent))
    return render_page(request, "console/agents/list.html", None, _list_context(request, company, form), status=400)


def _detail_context(request, agent, **extra):
    return {
        "company": agent.company,
        "agent": agent,
        "permissions": agent_permissions(agent),
        "may_assign": may_assign_tasks(agent),
        "hire_approval": hire_approval(agent),
        "keys": list(AgentApiKey.objects.filter(agent=agent, run__isnull=True).order_by("-created_at")),
        "runs": list(HeartbeatRun.objects.filter(agent=agent).select_related("issue")
                     .order_by("-created_at")[:AGENT_RUNS_SHOWN]),
        "adapter_form": extra.pop("adapter_form", None) or AdapterForm(initial={
            "adapter_type": agent.adapter_type,
            "adapter_config": json.dumps(agent.adapter_config or {}, indent=2, sort_keys=True)}),
        **extra,
    }


@console_page
@require_GET
def agent_detail(request, agent_id):
    agent = _agent(request, agent_id)
    return render_page(request, "console/agents/detail.html", None, _detail_context(request, agent))


@console_action
def agent_pause_view(request, agent_id):
    agent = _agent(request, agent_id)
    require_role(request, agent.company_id, MANAGE_AGENTS)
    return perform(request, lambda: agent_pause(actor=console_actor(request), agent=agent,
                                                reason=request.POST.get("reason", "")),
                   success=f"{agent.name} paused.", redirect_to=agent_url(agent))


@console_action
def agent_resume_view(request, agent_id):
    agent = _agent(request, agent_id)
    require_role(request, agent.company_id, MANAGE_AGENTS)
    return perform(request, lambda: agent_resume(actor=console_actor(request), agent=agent),
                   success=f"{agent.name} resumed.", redirect_to=agent_url(agent))


@console_action
def agent_permissions_view(request, agent_id):
    """Both flags as the form posts them (an unchecked box is absent: not granted)."""
    agent = _agent(request, agent_id)
    require_role(request, agent.company_id, MANAGE_AGENTS)
    values = {key: request.POST.get(key) == "on" for key in ("canAssignTasks", "canCreateAgents")}
    return perform(request, lambda: agent_permissions_update(actor=console_actor(request), agent=agent, values=values),
                   success=f"Permissions of {agent.name} saved.", redirect_to=agent_url(agent) + "#permissions")


@console_action
def agent_key_new(request, agent_id):
    """Creates a key and answers with the page showing the raw key, once: it is never stored, and the
    response is not cached (a reload shows the key list without it)."""
    agent = _agent(request, agent_id)
    require_role(request, agent.company_id, MANAGE_AGENTS)
    name = (request.POST.get("name") or "").strip()[:120] or "default"
    key, raw = agent_api_key_create(agent=agent, name=name, actor=console_actor(request))
    response = render_page(request, "console/agents/detail.html", None,
                           _detail_context(request, agent, new_key=key, raw_key=raw))
    response["Cache-Control"] = "no-store"
    return response


@console_action
def agent_key_revoke(request, agent_id, key_id):
    agent = _agent(request, agent_id)
    require_role(request, agent.company_id, MANAGE_AGENTS)
    key = AgentApiKey.objects.filter(agent=agent, pk=key_id).first()
    if key is None:
        raise NotFound("Key not found.")
    revoke = agent_services.agent_key_revoke
    return perform(request, lambda: revoke(actor=console_actor(request), agent=agent, key_id=key.pk),
                   success=f"Key {key.prefix}… revoked.", redirect_to=agent_url(agent))


@console_action
def agent_adapter(request, agent_id):
    agent = _agent(request, agent_id)
    require_role(request, agent.company_id, MANAGE_AGENTS)
    form = AdapterForm(request.POST)
    if form.is_valid():
        try:
            agent_adapter_update(actor=console_actor(request), agent=agent,
                                 adapter_type=form.cleaned_data["adapter_type"],
                                 adapter_config=form.cleaned_data["adapter_config"])
        except ApiError as exc:
            form.add_error(None, error_text(exc))
        else:
            messages.success(request, "Adapter configuration saved.")
            return HttpResponseRedirect(agent_url(agent) + "#adapter")
    return render_page(request, "console/agents/detail.html", None,
                       _detail_context(request, agent, adapter_form=form), status=400)
