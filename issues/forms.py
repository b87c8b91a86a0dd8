"""Console forms.

The issue filter is the API's own ``IssueFilterSet`` form (same parameters, same validation);
this module only gives its fields widgets that read well in a page: choices for the agent and
project, a datalist of status lists, a search box.
"""
from django import forms

from issues.choices import IssuePriority, IssueStatus
from issues.models import Agent, Project

OPEN_STATUSES = ",".join(
    [IssueStatus.BACKLOG, IssueStatus.TODO, IssueStatus.IN_PROGRESS, IssueStatus.IN_REVIEW, IssueStatus.BLOCKED]
)
STATUS_SUGGESTIONS = [OPEN_STATUSES, "todo,in_progress", *IssueStatus.values]
PRIORITY_SUGGESTIONS = ["critical,high", *IssuePriority.values]


def _label(values: str) -> str:
    return " or ".join(v.replace("_", " ") for v in values.split(",")).capitalize()


def _choices_with_current(choices, current):
    """Keep a valid-looking current value selectable even when it is not one of the choices."""
    if current and current not in {str(value) for value, _ in choices}:
        choices = [*choices, (current, current)]
    return choices


def style_issue_filter_form(form: forms.Form, *, company) -> forms.Form:
    """Give the FilterSet's form console widgets (validation is untouched)."""
    data = form.data if form.is_bound else {}
    fields = form.fields

    fields["q"].label = "Search"
    fields["q"].widget = forms.TextInput(attrs={"type": "search", "placeholder": "Title, text or PAP-12"})

    fields["status"].label = "Status"
    fields["status"].widget = forms.TextInput(
        attrs={"list": "status-options", "placeholder": "todo,in_progress", "title": "One or more, comma-separated"}
    )

    fields["priority"].label = "Priority"
    priority_choices = [("", "Any priority"), *[(p, _label(p)) for p in PRIORITY_SUGGESTIONS]]
    fields["priority"].widget = forms.Select(choices=_choices_with_current(priority_choices, data.get("priority")))

    fields["assigneeAgentId"].label = "Assignee"
    agents = Agent.objects.filter(company=company).order_by("name").values_list("id", "name") if company else []
    agent_choices = [("", "Anyone"), *[(str(pk), name) for pk, name in agents]]
    fields["assigneeAgentId"].widget = forms.Select(
        choices=_choices_with_current(agent_choices, data.get("assigneeAgentId"))
    )

    fields["projectId"].label = "Project"
    projects = Project.objects.filter(company=company).order_by("name").values_list("id", "name") if company else []
    project_choices = [("", "Any project"), *[(str(pk), name) for pk, name in projects]]
    fields["projectId"].widget = forms.Select(choices=_choices_with_current(project_choices, data.get("projectId")))

    fields["parentId"].label = "Parent issue id"
    fields["parentId"].widget = forms.TextInput(attrs={"placeholder": "UUID", "size": 36})
    return form


# The fields the console's filter bar shows, in order; other FilterSet parameters still apply
# when present in the URL (for links shared from the API).
CONSOLE_FILTER_FIELDS = ("q", "status", "priority", "assigneeAgentId", "projectId", "parentId")
