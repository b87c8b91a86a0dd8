"""Cases and workflow definitions: create with kickoff + workflow text, idempotent upsert, the
``enable_cases`` flag, browse (filters, sorting, grouping, pagination after both), types, and
workflow-definition CRUD."""
import hashlib
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from cases.models import Case, CaseEvent, CaseIssueLink, WorkflowDefinition
from issues.models import ActivityLog, Document, Issue
from tests.factories import MembershipFactory, ProjectFactory


def body(**overrides):
    data = {"type": "review", "title": "Review the contract", "kickoff": "Read the contract and list risks.",
            "workflowDocumentText": "```mermaid\nstateDiagram-v2\n  [*] --> drafting\n```\n\nRules:  keep  spacing.\n"}
    data.update(overrides)
    return data


def cases_url(company, suffix=""):
    return f"/api/companies/{company.pk}/cases{suffix}"


def create(client, company, **overrides):
    response = client.post(cases_url(company), body(**overrides), format="json")
    assert response.status_code in (200, 201), response.content[:500]
    return response.json()


# --- create ----------------------------------------------------------------------------------


def test_create_saves_workflow_verbatim_links_primary_task_and_records_events(board_client, cases_company):
    text = body()["workflowDocumentText"]
    response = board_client.post(cases_url(cases_company), body(fields={"amount": 12}), format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["identifier"] == f"{cases_company.issue_prefix}-C1"
    assert data["status"] == "draft" and data["fields"] == {"amount": 12} and data["type"] == "review"
    case = Case.objects.get(pk=data["id"])
    task = case.primary_task
    assert str(task.pk) == data["primaryTaskId"] == data["primaryTask"]["id"]
    assert task.description == "Read the contract and list risks." and task.origin_kind == "case"
    assert task.origin_id == str(case.pk)
    document = Document.objects.get(issue=task, key="workflow")
    assert document.latest_revision.body == text  # verbatim
    assert document.revision_count == 1
    assert CaseIssueLink.objects.get(case=case).role == "origin"
    kinds = list(CaseEvent.objects.filter(case=case).values_list("kind", flat=True))
    assert "created" in kinds and "issue_linked" in kinds
    assert ActivityLog.objects.filter(action="case.created", entity_id=str(case.pk)).exists()

    second = create(board_client, cases_company, title="Another")
    assert second["identifier"] == f"{cases_company.issue_prefix}-C2"

    detail = board_client.get(f"/api/cases/{data['identifier'].lower()}").json()
    assert detail["id"] == data["id"]
    assert detail["links"][0]["role"] == "origin" and detail["links"][0]["issue"]["id"] == str(task.pk)
    assert {e["kind"] for e in detail["events"]} >= {"created", "issue_linked"}


def test_agent_creates_with_its_run_and_needs_the_run_header(make_agent_client, cases_company):
    client = make_agent_client(company=cases_company)
    data = create(client, cases_company)
    case = Case.objects.get(pk=data["id"])
    assert case.created_by_agent == client.agent
    assert CaseEvent.objects.filter(case=case, kind="created").get().run == client.run
    client.use_run(None)
    response = client.post(cases_url(cases_company), body(), format="json")
    assert response.status_code == 401 and response.json()["code"] == "run_id_required"


def test_idempotent_upsert_by_key(board_client, cases_company):
    first = board_client.post(cases_url(cases_company), body(idempotencyKey="k-1"), format="json")
    again = board_client.post(cases_url(cases_company), body(idempotencyKey="k-1", title="Changed"), format="json")
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"] and again.json()["title"] == "Review the contract"
    other_type = board_client.post(cases_url(cases_company), body(idempotencyKey="k-1", type="intake"), format="json")
    assert other_type.status_code == 201 and other_type.json()["id"] != first.json()["id"]
    assert Case.objects.count() == 2
    assert Issue.objects.filter(origin_kind="case").count() == 2


@pytest.mark.parametrize("missing", ["kickoff", "workflowDocumentText", "type", "title"])
def test_create_requires_kickoff_and_workflow_text(board_client, cases_company, missing):
    data = body()
    del data[missing]
    response = board_client.post(cases_url(cases_company), data, format="json")
    assert response.status_code == 400
    assert missing in response.json()["details"]
    blank = board_client.post(cases_url(cases_company), body(**{missing: "   "}), format="json")
    assert blank.status_code == 400 and missing in blank.json()["details"]
    assert not Case.objects.exists() and not Issue.objects.exists()


def test_bad_input_names_the_fields(board_client, cases_company):
    response = board_client.post(cases_url(cases_company), body(status="open", fields=[1], bogus=1), format="json")
    assert response.status_code == 400
    assert {"bogus"} <= set(response.json()["details"])
    response = board_client.post(cases_url(cases_company), body(status="open", fields=[1]), format="json")
    assert {"status", "fields"} <= set(response.json()["details"])
    case = create(board_client, cases_company)
    patch = board_client.patch(f"/api/cases/{case['id']}", {"status": "nope", "type": "x"}, format="json")
    assert patch.status_code == 400 and "type" in patch.json()["details"]
    patch = board_client.patch(f"/api/cases/{case['id']}", {"status": "nope"}, format="json")
    assert patch.status_code == 400 and "status" in patch.json()["details"]
    bad = board_client.get(cases_url(cases_company) + "?sortField=size&sortDir=up&groupBy=x&limit=0")
    assert bad.status_code == 400
    assert {"sortField", "sortDir", "groupBy"} <= set(bad.json()["details"])


def test_update_changes_facts_and_records_events(board_client, cases_company):
    case = create(board_client, cases_company)
    response = board_client.patch(f"/api/cases/{case['id']}", {
        "title": "Renamed", "summary": "Short", "fields": {"a": [1, 2]}}, format="json")
    assert response.status_code == 200, response.content
    data = response.json()
    assert (data["title"], data["summary"], data["status"], data["fields"]) == (
        "Renamed", "Short", "draft", {"a": [1, 2]})
    events = CaseEvent.objects.filter(case_id=case["id"])
    assert events.filter(kind="updated", details__changes=["fields", "summary", "title"]).exists()
    # Status and phase move through handoffs and task completion, never through PATCH.
    for name, value in (("status", "in_progress"), ("phase", "drafting")):
        refused = board_client.patch(f"/api/cases/{case['id']}", {name: value}, format="json")
        assert refused.status_code == 400 and name in refused.json()["details"]


def test_viewer_cannot_mutate(cases_company, board_client):
    case = create(board_client, cases_company)
    definition = board_client.post(f"/api/companies/{cases_company.pk}/workflows",
                                   {"name": "Review", "prompt": "p"}, format="json").json()
    viewer = MembershipFactory(company=cases_company, role="viewer").user
    client = APIClient()
    client.force_login(viewer)
    before = (Case.objects.count(), WorkflowDefinition.objects.count())
    for method, path, data in [
        ("post", cases_url(cases_company), body()),
        ("patch", f"/api/cases/{case['id']}", {"title": "x"}),
        ("post", f"/api/companies/{cases_company.pk}/workflows", {"name": "n", "prompt": "p"}),
        ("patch", f"/api/workflows/{definition['id']}", {"prompt": "x"}),
    ]:
        response = getattr(client, method)(path, data, format="json")
        assert response.status_code == 403 and response.json()["code"] == "read_only_role", path
    assert (Case.objects.count(), WorkflowDefinition.objects.count()) == before
    assert Case.objects.get(pk=case["id"]).title == "Review the contract"
    assert client.get(cases_url(cases_company)).status_code == 200
    assert client.get(f"/api/cases/{case['id']}").status_code == 200


# --- the flag ----------------------------------------------------------------------------------


def test_flag_off_every_case_route_is_404(board_client, cases_company):
    case = create(board_client, cases_company)
    definition = board_client.post(f"/api/companies/{cases_company.pk}/workflows",
                                   {"name": "Review", "prompt": "p"}, format="json").json()
    cases_company.enable_cases = False
    cases_company.save()
    for method, path, data in [
        ("get", cases_url(cases_company), None),
        ("post", cases_url(cases_company), body()),
        ("get", cases_url(cases_company, "/types"), None),
        ("get", f"/api/cases/{case['id']}", None),
        ("get", f"/api/cases/{case['identifier']}", None),
        ("patch", f"/api/cases/{case['id']}", {"title": "x"}),
        ("get", f"/api/companies/{cases_company.pk}/workflows", None),
        ("post", f"/api/companies/{cases_company.pk}/workflows", {"name": "n", "prompt": "p"}),
        ("get", f"/api/workflows/{definition['id']}", None),
        ("patch", f"/api/workflows/{definition['id']}", {"prompt": "x"}),
    ]:
        call = getattr(board_client, method)
        response = call(path) if data is None else call(path, data, format="json")
        assert response.status_code == 404, (method, path, response.status_code)
        assert response.json()["code"] == "not_found"
    assert Case.objects.count() == 1 and WorkflowDefinition.objects.count() == 1
    assert Case.objects.get().title == "Review the contract"


# --- browse ------------------------------------------------------------------------------------


@pytest.fixture
def browse_set(cases_company):
    """Five cases with distinct timestamps, titles, statuses, types and projects."""
    from cases.services import case_create
    from issues.actors import SYSTEM

    p1, p2 = ProjectFactory(company=cases_company), ProjectFactory(company=cases_company)
    p_low, p_high = sorted([p1, p2], key=lambda p: str(p.pk))
    spec = [  # title, status, type, project
        ("delta", "done", "intake", p_high),
        ("alpha", "in_review", "review", None),
        ("echo", "draft", "audit", p_low),
        ("charlie", "cancelled", "review", p_high),
        ("bravo", "in_progress", "intake", None),
    ]
    base = timezone.now() - timedelta(days=10)
    made = {}
    for i, (title, status, case_type, project) in enumerate(spec):
        case, _ = case_create(actor=SYSTEM, company=cases_company, case_type=case_type, title=title, kickoff="k",
                              workflow_document_text="w", status=status,
                              project_id=project.pk if project else None)
        made[title] = case
        # created ascending in spec order; updated in a different order (reverse)
        Case.objects.filter(pk=case.pk).update(created_at=base + timedelta(hours=i),
                                               updated_at=base + timedelta(hours=10 - i))
    return {"cases": made, "p_low": p_low, "p_high": p_high}


def titles(response):
    assert response.status_code == 200, response.content[:500]
    return [c["title"] for c in response.json()["items"]]


STATUS_ORDER = ["draft", "in_progress", "in_review", "approved", "done", "cancelled"]
EXPECTED_ASC = {
    "created": ["delta", "alpha", "echo", "charlie", "bravo"],
    "updated": ["bravo", "charlie", "echo", "alpha", "delta"],
    "title": ["alpha", "bravo", "charlie", "delta", "echo"],
    "status": ["echo", "bravo", "alpha", "delta", "charlie"],  # lifecycle order
}


@pytest.mark.parametrize("field", ["created", "updated", "title", "status", "type"])
@pytest.mark.parametrize("direction", ["asc", "desc"])
def test_browse_sorts_by_each_field_both_ways(board_client, cases_company, browse_set, field, direction):
    got = titles(board_client.get(cases_url(cases_company) + f"?sortField={field}&sortDir={direction}"))
    if field == "type":
        by_type = {c.title: c.case_type for c in browse_set["cases"].values()}
        types = [by_type[t] for t in got]
        assert types == sorted(types, reverse=direction == "desc")
    else:
        expected = EXPECTED_ASC[field]
        assert got == (expected if direction == "asc" else expected[::-1])


def test_browse_default_is_newest_updated_first(board_client, cases_company, browse_set):
    response = board_client.get(cases_url(cases_company))
    assert titles(response) == EXPECTED_ASC["updated"][::-1]
    data = response.json()
    assert (data["sortField"], data["sortDir"], data["groupBy"], data["total"]) == ("updated", "desc", "none", 5)


def test_browse_group_by_status_follows_the_lifecycle(board_client, cases_company, browse_set):
    response = board_client.get(cases_url(cases_company) + "?groupBy=status&sortField=title&sortDir=desc")
    statuses = [c["status"] for c in response.json()["items"]]
    assert statuses == sorted(statuses, key=STATUS_ORDER.index)
    assert statuses == ["draft", "in_progress", "in_review", "done", "cancelled"]


def test_browse_group_by_project_stable_ids_unassigned_last(board_client, cases_company, browse_set):
    response = board_client.get(cases_url(cases_company) + "?groupBy=project&sortField=title&sortDir=asc")
    items = response.json()["items"]
    low, high = str(browse_set["p_low"].pk), str(browse_set["p_high"].pk)
    assert [c["projectId"] for c in items] == [low, high, high, None, None]
    assert [c["title"] for c in items] == ["echo", "charlie", "delta", "alpha", "bravo"]


def test_browse_group_by_type_then_sort(board_client, cases_company, browse_set):
    items = board_client.get(cases_url(cases_company) + "?groupBy=type&sortField=title&sortDir=desc").json()["items"]
    assert [(c["type"], c["title"]) for c in items] == [
        ("audit", "echo"), ("intake", "delta"), ("intake", "bravo"), ("review", "charlie"), ("review", "alpha")]


def test_pagination_applies_after_sorting_and_grouping(board_client, cases_company, browse_set):
    url = cases_url(cases_company) + "?groupBy=project&sortField=title&sortDir=asc"
    pages = [titles(board_client.get(url + f"&limit=2&offset={off}")) for off in (0, 2, 4)]
    assert pages == [["echo", "charlie"], ["delta", "alpha"], ["bravo"]]
    last = board_client.get(url + "&limit=2&offset=4").json()
    assert (last["total"], last["limit"], last["offset"]) == (5, 2, 4)
    assert titles(board_client.get(cases_url(cases_company) + "?sortField=title&limit=2&offset=1")) == [
        "bravo", "charlie"]
    assert titles(board_client.get(cases_url(cases_company) + "?groupBy=status&limit=2&offset=3")) == [
        "delta", "charlie"]


def test_browse_filters(board_client, cases_company, browse_set):
    url = cases_url(cases_company) + "?sortField=title&sortDir=asc"
    assert titles(board_client.get(url + "&search=CHAR")) == ["charlie"]
    ident = browse_set["cases"]["echo"].identifier
    assert titles(board_client.get(url + f"&search={ident}")) == ["echo"]
    assert titles(board_client.get(url + "&status=done,cancelled")) == ["charlie", "delta"]
    assert titles(board_client.get(url + "&type=intake")) == ["bravo", "delta"]
    assert titles(board_client.get(url + "&type=intake,audit")) == ["bravo", "delta", "echo"]
    assert titles(board_client.get(url + f"&projectId={browse_set['p_high'].pk}")) == ["charlie", "delta"]
    filtered = board_client.get(url + "&type=review&limit=1")
    assert titles(filtered) == ["alpha"] and filtered.json()["total"] == 2


def test_browse_shows_only_the_callers_company(board_client, cases_company, browse_set):
    from cases.services import case_create
    from issues.actors import SYSTEM
    from tests.factories import CompanyFactory

    other = CompanyFactory(enable_cases=True)
    case_create(actor=SYSTEM, company=other, case_type="secret", title="other", kickoff="k",
                workflow_document_text="w")
    assert "other" not in titles(board_client.get(cases_url(cases_company)))
    assert board_client.get(cases_url(other)).status_code == 404
    assert "secret" not in board_client.get(cases_url(cases_company, "/types")).json()["types"]


def test_types_lists_distinct_types(board_client, cases_company, browse_set):
    response = board_client.get(cases_url(cases_company, "/types"))
    assert response.status_code == 200
    assert response.json() == {"types": ["audit", "intake", "review"]}


# --- workflow definitions ---------------------------------------------------------------------


def test_workflow_definition_crud_and_fingerprint(board_client, cases_company):
    url = f"/api/companies/{cases_company.pk}/workflows"
    response = board_client.post(url, {"name": "Contract review", "prompt": "# Review\nStep 1"}, format="json")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["fingerprint"] == hashlib.sha256("# Review\nStep 1".encode()).hexdigest()
    padded = board_client.post(url, {"name": "Padded", "prompt": "\n  body  \n"}, format="json").json()
    assert padded["prompt"] == "\n  body  \n"
    assert padded["fingerprint"] == hashlib.sha256(b"\n  body  \n").hexdigest()
    assert data["description"] == ""
    assert [d["name"] for d in board_client.get(url).json()] == ["Contract review", "Padded"]
    detail = f"/api/workflows/{data['id']}"
    assert board_client.get(detail).json() == data

    renamed = board_client.patch(detail, {"name": "Contract review v2", "description": "d"}, format="json").json()
    assert renamed["fingerprint"] == data["fingerprint"] and renamed["name"] == "Contract review v2"
    changed = board_client.patch(detail, {"prompt": "# Review\nStep 2"}, format="json")
    assert changed.status_code == 200
    assert changed.json()["fingerprint"] == hashlib.sha256(b"# Review\nStep 2").hexdigest() != data["fingerprint"]
    assert ActivityLog.objects.filter(action="workflow_definition.updated", entity_id=data["id"]).count() == 2
    unchanged = board_client.patch(detail, {"prompt": "# Review\nStep 2"}, format="json").json()
    assert unchanged["updatedAt"] == changed.json()["updatedAt"]
    assert board_client.get(url + "?search=v2").json()[0]["id"] == data["id"]
    assert board_client.get(url + "?search=nothing").json() == []


def test_workflow_definition_name_is_unique_per_company(board_client, cases_company):
    from tests.factories import CompanyFactory

    url = f"/api/companies/{cases_company.pk}/workflows"
    first = board_client.post(url, {"name": "Review", "prompt": "p"}, format="json").json()
    dup = board_client.post(url, {"name": "review", "prompt": "q"}, format="json")
    assert dup.status_code == 409 and "name" in dup.json()["details"]
    second = board_client.post(url, {"name": "Intake", "prompt": "q"}, format="json").json()
    clash = board_client.patch(f"/api/workflows/{second['id']}", {"name": "REVIEW"}, format="json")
    assert clash.status_code == 409 and clash.json()["code"] == "workflow_name_taken"
    assert WorkflowDefinition.objects.get(pk=second["id"]).name == "Intake"
    assert board_client.patch(f"/api/workflows/{first['id']}", {"name": "Review"},
                              format="json").status_code == 200
    # Another company may use the same name.
    other = CompanyFactory(enable_cases=True)
    from cases.services import workflow_definition_create
    from issues.actors import SYSTEM

    assert workflow_definition_create(actor=SYSTEM, company=other, name="Review", prompt="p").pk


def test_workflow_definition_bad_input(board_client, cases_company):
    url = f"/api/companies/{cases_company.pk}/workflows"
    response = board_client.post(url, {"name": "", "extra": 1}, format="json")
    assert response.status_code == 400 and "extra" in response.json()["details"]
    response = board_client.post(url, {"name": ""}, format="json")
    assert response.status_code == 400
    assert {"name", "prompt"} <= set(response.json()["details"])
    blank = board_client.post(url, {"name": "   ", "prompt": "p"}, format="json")
    assert blank.status_code == 400 and "name" in blank.json()["details"]


def test_case_created_with_a_workflow_definition(board_client, cases_company):
    definition = board_client.post(f"/api/companies/{cases_company.pk}/workflows",
                                   {"name": "Review", "prompt": "p"}, format="json").json()
    data = create(board_client, cases_company, workflowDefinitionId=definition["id"], workflowDocumentText="p",
                  phase="intake")
    assert data["currentWorkflow"] == {"id": definition["id"], "name": "Review",
                                       "fingerprint": definition["fingerprint"]}
    assert data["phase"] == "intake"
