"""Routes of the upstream-compatible API (issue #14): agents and runs (paperclip-api.md §5.1);
included by issues/api/urls.py."""
from django.urls import path

from . import agents

urlpatterns = [
    path("companies/<str:company_id>/agents", agents.CompanyAgentsView.as_view(), name="company-agents"),
    path("companies/<str:company_id>/org", agents.CompanyOrgView.as_view(), name="company-org"),
    path("companies/<str:company_id>/agent-hires", agents.CompanyAgentHiresView.as_view(), name="company-agent-hires"),
    path("agents/me/inbox-lite", agents.AgentInboxLiteView.as_view(), name="agent-me-inbox-lite"),
    path("agents/me/inbox/mine", agents.AgentMineInboxView.as_view(), name="agent-me-inbox-mine"),
    path("agents/<uuid:agent_id>", agents.AgentDetailView.as_view(), name="agent-detail"),
    path("agents/<uuid:agent_id>/permissions", agents.AgentPermissionsView.as_view(), name="agent-permissions"),
    path("agents/<uuid:agent_id>/pause", agents.AgentPauseView.as_view(), name="agent-pause"),
    path("agents/<uuid:agent_id>/resume", agents.AgentResumeView.as_view(), name="agent-resume"),
    path("agents/<uuid:agent_id>/terminate", agents.AgentTerminateView.as_view(), name="agent-terminate"),
    path("agents/<uuid:agent_id>/keys", agents.AgentKeysView.as_view(), name="agent-keys"),
    path("agents/<uuid:agent_id>/keys/<uuid:key_id>", agents.AgentKeyView.as_view(), name="agent-key"),
    path("agents/<uuid:agent_id>/heartbeat/invoke", agents.AgentHeartbeatInvokeView.as_view(),
         name="agent-heartbeat-invoke"),
    path("heartbeat-runs/<uuid:run_id>/cancel", agents.HeartbeatRunCancelView.as_view(), name="heartbeat-run-cancel"),
    path("heartbeat-runs/<uuid:run_id>/events", agents.HeartbeatRunEventsView.as_view(), name="heartbeat-run-events"),
    path("heartbeat-runs/<uuid:run_id>/issues", agents.HeartbeatRunIssuesView.as_view(), name="heartbeat-run-issues"),
    path("issues/<str:issue_id>/live-runs", agents.IssueLiveRunsView.as_view(), name="issue-live-runs"),
    path("issues/<str:issue_id>/active-run", agents.IssueActiveRunView.as_view(), name="issue-active-run"),
]
