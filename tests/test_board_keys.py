"""Board API keys (``pcp_board_…``, upstream §2.1/§2.5): created in the console (shown once), over
the API and by ``manage.py board_key_create``; listed and revoked; hashed at rest. A request with
one acts as its user (memberships, roles; viewers stay read-only) with no CSRF and no run header;
a given run header is recorded on the activity rows as the client's run id, and every activity
row written with a key names it."""
import io
import json
import re
import uuid
from datetime import timedelta

import httpx
import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from issues.actors import SYSTEM
from issues.models import ActivityLog, BoardApiKey, Comment, Issue
from issues.models.agent import hash_key
from issues.services.board_keys import board_key_create
from tests.factories import CompanyFactory, IssueFactory, MembershipFactory, UserFactory
from tests.test_errors import assert_error


def key_client(token, **kwargs) -> APIClient:
    client = APIClient(**kwargs)
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


@pytest.fixture
def owner(company):
    return MembershipFactory(company=company, role="owner", user=UserFactory(username="olga")).user


@pytest.fixture
def owner_token(owner):
    _, token = board_key_create(actor=SYSTEM, user=owner)
    return token


def near(value, expected, slack=timedelta(minutes=2)):
    return abs(value - expected) < slack


# --- creating, listing, revoking ----------------------------------------------------------------------


def test_console_creates_a_key_and_shows_the_token_once(client, owner, company):
    client.force_login(owner)
    response = client.post(reverse("console:board-key-create"), {"name": "laptop", "lifetime": "30"})
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    token = re.search(r'<code class="secret" id="raw-key">(pcp_board_[^<]+)</code>', response.content.decode()).group(1)
    key = BoardApiKey.objects.get(user=owner, name="laptop")
    assert key.key_hash == hash_key(token) and token.startswith(key.prefix) and token not in key.prefix
    assert near(key.expires_at, timezone.now() + timedelta(days=30))
    listing = client.get(reverse("console:board-key-list")).content.decode()
    assert token not in listing and f"{key.prefix}…" in listing
    created = ActivityLog.objects.get(action="board_api_key.created", entity_id=str(key.pk))
    assert created.company_id == company.pk and created.actor_user == owner
    # The token works against the API; the console revokes it.
    assert key_client(token).get("/api/companies").status_code == 200
    client.post(reverse("console:board-key-revoke", args=[key.pk]))
    assert key_client(token).get("/api/companies").status_code == 401
    never = client.post(reverse("console:board-key-create"), {"name": "ci", "lifetime": "never"})
    assert never.status_code == 200 and BoardApiKey.objects.get(user=owner, name="ci").expires_at is None


def test_console_revoking_another_users_key_is_a_404(client, owner, company):
    other, _ = board_key_create(actor=SYSTEM, user=MembershipFactory(company=company).user)
    client.force_login(owner)
    assert client.post(reverse("console:board-key-revoke", args=[other.pk])).status_code == 404
    assert BoardApiKey.objects.get(pk=other.pk).revoked_at is None


def test_api_creates_lists_and_revokes_the_callers_own_keys(owner, owner_token, company):
    api = key_client(owner_token)
    default = api.post("/api/board-api-keys", {}, format="json")
    assert default.status_code == 201, default.content
    body = default.json()
    assert set(body) == {"id", "name", "prefix", "token", "expiresAt", "createdAt", "lastUsedAt", "revokedAt"}
    assert (body["lastUsedAt"], body["revokedAt"]) == (None, None)
    assert body["name"] == "default" and body["token"].startswith("pcp_board_")
    assert body["token"].startswith(body["prefix"])
    assert near(BoardApiKey.objects.get(pk=body["id"]).expires_at, timezone.now() + timedelta(days=30))
    in_days = api.post("/api/board-api-keys", {"name": "week", "expiresInDays": 7}, format="json").json()
    assert near(BoardApiKey.objects.get(pk=in_days["id"]).expires_at, timezone.now() + timedelta(days=7))
    never = api.post("/api/board-api-keys", {"name": "forever", "expiresAt": None}, format="json").json()
    assert never["expiresAt"] is None
    at = (timezone.now() + timedelta(days=3)).replace(microsecond=0)
    dated = api.post("/api/board-api-keys", {"name": "dated", "expiresAt": at.isoformat()}, format="json").json()
    assert BoardApiKey.objects.get(pk=dated["id"]).expires_at == at
    # The token itself is never stored or listed.
    assert not BoardApiKey.objects.filter(key_hash=body["token"]).exists()

    someone = MembershipFactory(company=company).user
    theirs, _ = board_key_create(actor=SYSTEM, user=someone)
    listed = api.get("/api/board-api-keys").json()
    assert {k["name"] for k in listed} == {"default", "week", "forever", "dated"} | {
        BoardApiKey.objects.get(key_hash=hash_key(owner_token)).name}
    assert all(set(k) == {"id", "name", "prefix", "expiresAt", "lastUsedAt", "revokedAt", "createdAt"} for k in listed)
    assert str(theirs.pk) not in json.dumps(listed)

    revoked = api.delete(f"/api/board-api-keys/{body['id']}")
    assert revoked.status_code == 200 and revoked.json() == {"ok": True, "keyId": body["id"]}
    assert key_client(body["token"]).get("/api/companies").status_code == 401
    assert body["id"] not in {k["id"] for k in api.get("/api/board-api-keys").json()}
    inactive = {k["id"]: k for k in api.get("/api/board-api-keys?includeInactive=true").json()}
    assert inactive[body["id"]]["revokedAt"] is not None
    # Audited in the user's company, with the key the request was made with.
    rows = ActivityLog.objects.filter(entity_type="board_api_key", entity_id=body["id"]).order_by("id")
    assert [r.action for r in rows] == ["board_api_key.created", "board_api_key.revoked"]
    assert all(r.board_key.key_hash == hash_key(owner_token) for r in rows)

    assert_error(api.delete(f"/api/board-api-keys/{theirs.pk}"), 404)
    assert BoardApiKey.objects.get(pk=theirs.pk).revoked_at is None
    assert_error(api.delete("/api/board-api-keys/not-an-id"), 400, fields=["keyId"])


@pytest.mark.parametrize("body,fields", [
    ({"expiresInDays": 0}, ["expiresInDays"]),
    ({"expiresInDays": "7"}, []),  # DRF coerces numeric strings; accepted
    ({"expiresInDays": 3, "expiresAt": None}, ["expiresInDays", "expiresAt"]),
    ({"expiresAt": "2001-01-01T00:00:00Z"}, ["expiresAt"]),
    ({"expiresAt": "tomorrow"}, ["expiresAt"]),
    ({"name": ""}, ["name"]),
    ({"scope": "all"}, ["scope"]),
])
def test_bad_create_input_is_a_400_naming_the_field(owner_token, body, fields):
    response = key_client(owner_token).post("/api/board-api-keys", body, format="json")
    if not fields:
        assert response.status_code == 201
        return
    assert_error(response, 400, "validation_error", fields=fields)
    assert BoardApiKey.objects.count() == 1  # only the caller's own


def test_board_key_create_command_prints_json(owner):
    out = io.StringIO()
    call_command("board_key_create", "--user", owner.username, "--name", "ci", "--json", stdout=out)
    printed = json.loads(out.getvalue())
    assert set(printed) == {"id", "token", "expiresAt"}
    key = BoardApiKey.objects.get(pk=printed["id"])
    assert key.name == "ci" and key.key_hash == hash_key(printed["token"])
    assert near(key.expires_at, timezone.now() + timedelta(days=30))
    out = io.StringIO()
    call_command("board_key_create", "--user", owner.username, "--no-expiry", "--json", stdout=out)
    assert json.loads(out.getvalue())["expiresAt"] is None
    out = io.StringIO()
    call_command("board_key_create", "--user", owner.username, "--expires-days", "2", "--json", stdout=out)
    assert near(BoardApiKey.objects.get(pk=json.loads(out.getvalue())["id"]).expires_at,
                timezone.now() + timedelta(days=2))
    assert key_client(printed["token"]).get("/api/companies").status_code == 200


# --- acting as the user -------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_board_key_acts_as_its_user_across_the_api_over_http(live_server, owner, owner_token, company):
    """Real HTTP, no cookie, no CSRF token, no run header: reads and writes as the owner."""
    elsewhere = CompanyFactory()
    issue = IssueFactory(company=company, title="Board work")
    api = httpx.Client(base_url=f"{live_server.url}/api", headers={"Authorization": f"Bearer {owner_token}"},
                       timeout=10)
    assert [c["id"] for c in api.get("/companies").json()] == [str(company.pk)]
    assert [i["id"] for i in api.get(f"/companies/{company.pk}/issues").json()] == [str(issue.pk)]
    assert api.get(f"/companies/{elsewhere.pk}/issues").status_code == 404
    patched = api.patch(f"/issues/{issue.pk}", json={"title": "Renamed with a key"})
    assert patched.status_code == 200, patched.text
    created = api.post(f"/companies/{company.pk}/issues", json={"title": "Filed with a key"})
    assert created.status_code == 201, created.text
    assert api.post(f"/issues/{issue.pk}/comments", json={"body": "from the CLI"}).status_code == 201
    assert Issue.objects.get(pk=issue.pk).title == "Renamed with a key"
    assert Comment.objects.get(issue=issue).author_user == owner
    # Every row those writes made is the owner's, and names the key.
    key = BoardApiKey.objects.get(key_hash=hash_key(owner_token))
    rows = ActivityLog.objects.filter(company=company).exclude(entity_type="board_api_key")
    assert rows.count() >= 3
    assert all(r.actor_user_id == owner.pk and r.board_key_id == key.pk and r.client_run_id is None for r in rows)
    assert BoardApiKey.objects.get(pk=key.pk).last_used_at is not None


def test_no_csrf_with_a_key_while_the_session_still_needs_it(owner, owner_token, issue):
    session = APIClient(enforce_csrf_checks=True)
    session.force_login(owner)
    assert session.post(f"/api/issues/{issue.pk}/comments", {"body": "x"}, format="json").status_code == 403
    keyed = key_client(owner_token, enforce_csrf_checks=True)
    assert keyed.post(f"/api/issues/{issue.pk}/comments", {"body": "x"}, format="json").status_code == 201


def test_a_run_header_is_recorded_as_the_client_run_id_never_trusted(owner_token, company, agent_client):
    issue = IssueFactory(company=company)
    api = key_client(owner_token)
    client_run = uuid.uuid4()
    response = api.patch(f"/api/issues/{issue.pk}", {"title": "with a run id"}, format="json",
                         HTTP_X_PAPERCLIP_RUN_ID=str(client_run))
    assert response.status_code == 200
    row = ActivityLog.objects.get(action="issue.updated", entity_id=str(issue.pk))
    assert row.client_run_id == client_run and row.run_id is None
    # Even an agent's real run id is only recorded for a board user, never the row's run.
    api.post(f"/api/issues/{issue.pk}/comments", {"body": "x"}, format="json",
             HTTP_X_PAPERCLIP_RUN_ID=str(agent_client.run.pk))
    commented = ActivityLog.objects.get(action="comment.created", entity_id=str(issue.pk))
    assert commented.run_id is None and commented.client_run_id == agent_client.run.pk
    # A header that is no UUID is not recorded (the column is a UUID) and refuses nothing.
    assert api.patch(f"/api/issues/{issue.pk}", {"title": "again"}, format="json",
                     HTTP_X_PAPERCLIP_RUN_ID="run-7").status_code == 200


def test_a_viewers_key_stays_read_only(company, issue):
    viewer = MembershipFactory(company=company, role="viewer", user=UserFactory(username="vera")).user
    _, token = board_key_create(actor=SYSTEM, user=viewer)
    api = key_client(token)
    assert api.get(f"/api/issues/{issue.pk}").status_code == 200
    assert_error(api.patch(f"/api/issues/{issue.pk}", {"title": "x"}, format="json"), 403, "read_only_role")
    assert Issue.objects.get(pk=issue.pk).title == issue.title


def test_a_superusers_key_acts_as_today(company, issue):
    admin = UserFactory(username="root")
    admin.is_superuser = True
    admin.save()
    _, token = board_key_create(actor=SYSTEM, user=admin)
    assert key_client(token).patch(f"/api/issues/{issue.pk}", {"title": "root"}, format="json").status_code == 200


def test_expired_revoked_unknown_and_inactive_keys_are_401(owner, company, issue):
    expired, expired_token = board_key_create(actor=SYSTEM, user=owner, expires_at=timezone.now() + timedelta(days=1))
    BoardApiKey.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    revoked, revoked_token = board_key_create(actor=SYSTEM, user=owner)
    BoardApiKey.objects.filter(pk=revoked.pk).update(revoked_at=timezone.now())
    unknown_token = "pcp_board_" + "0" * 43  # recognised as a board key by its prefix, never as an agent key
    for token, message in ((expired_token, "expired"), (revoked_token, "revoked"), (unknown_token, "Invalid")):
        error = assert_error(key_client(token).get(f"/api/issues/{issue.pk}"), 401, "unauthorized")
        assert message in error["message"]
    _, inactive_token = board_key_create(actor=SYSTEM, user=owner)
    owner.is_active = False
    owner.save()
    assert_error(key_client(inactive_token).get(f"/api/issues/{issue.pk}"), 401, "unauthorized")


def test_last_used_at_is_recorded_and_throttled(owner, owner_token, issue):
    key = BoardApiKey.objects.get(key_hash=hash_key(owner_token))
    api = key_client(owner_token)
    api.get(f"/api/issues/{issue.pk}")
    first = BoardApiKey.objects.get(pk=key.pk).last_used_at
    assert first is not None
    with CaptureQueriesContext(connection) as queries:
        api.get(f"/api/issues/{issue.pk}")
    assert BoardApiKey.objects.get(pk=key.pk).last_used_at == first
    assert not [q for q in queries.captured_queries if q["sql"].startswith("UPDATE")]


def test_agents_get_403_board_only_on_the_board_key_routes(agent_client, owner):
    theirs, _ = board_key_create(actor=SYSTEM, user=owner)
    assert_error(agent_client.get("/api/board-api-keys"), 403, "board_only")
    assert_error(agent_client.post("/api/board-api-keys", {}, format="json"), 403, "board_only")
    assert_error(agent_client.delete(f"/api/board-api-keys/{theirs.pk}"), 403, "board_only")
    assert BoardApiKey.objects.filter(user=owner).count() == 1 and theirs.revoked_at is None


def test_audit_rows_go_to_every_company_the_key_can_act_in(owner, company):
    second = CompanyFactory()
    MembershipFactory(company=second, user=owner, role="viewer")
    key, _ = board_key_create(actor=SYSTEM, user=owner)
    rows = ActivityLog.objects.filter(action="board_api_key.created", entity_id=str(key.pk))
    assert {r.company_id for r in rows} == {company.pk, second.pk}
    assert all(r.details["prefix"] == key.prefix and "token" not in json.dumps(r.details) for r in rows)


def test_the_key_list_is_a_constant_number_of_queries(owner, owner_token):
    api = key_client(owner_token)
    api.get("/api/board-api-keys")  # last_used_at written once, outside the measure
    counts = []
    for total in (10, 10_000):
        BoardApiKey.objects.bulk_create([
            BoardApiKey(user=owner, name=f"k{i}", prefix="pcp_board_x", key_hash=f"{total}-{i:058d}")
            for i in range(total - BoardApiKey.objects.filter(user=owner).count())])
        with CaptureQueriesContext(connection) as queries:
            response = api.get("/api/board-api-keys?limit=20")
        assert response.status_code == 200 and len(response.json()) == min(total, 20)
        counts.append(len(queries.captured_queries))
    # The key lookup and the one list query, whatever the row count.
    assert counts == [2, 2], counts
