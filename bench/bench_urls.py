"""URLconf for the checkout benchmark: the real app's routes plus bare baseline endpoints.

The baseline view is deliberately minimal (no DRF, no authentication, no serializer): in one
transaction it locks an issue row with ``SELECT ... FOR UPDATE`` and writes the same columns
a checkout writes, then answers with a small JSON body. The DRF floor does exactly that inside a
DRF ``APIView`` with the app's authentication (the agent key, one lookup) and body parsing: what any
authenticated API request costs before the checkout's own work.
"""
import json

from django.db import connection, transaction
from django.http import JsonResponse
from django.urls import path
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from rest_framework.response import Response
from rest_framework.views import APIView

from issues.models import Issue
from paperclip.urls import handler404, handler500  # noqa: F401
from paperclip.urls import urlpatterns as app_urlpatterns

TABLE = Issue._meta.db_table


def _bare_claim(issue_id, agent_id, run_id) -> bool:
    now = timezone.now()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {TABLE} WHERE id = %s FOR UPDATE", [issue_id])
        if cursor.fetchone() is None:
            return False
        cursor.execute(
            f"UPDATE {TABLE} SET status = 'in_progress', assignee_agent_id = %s, checkout_run_id = %s, "
            f"execution_run_id = %s, execution_locked_at = %s, started_at = COALESCE(started_at, %s), "
            f"updated_at = %s WHERE id = %s",
            [agent_id, run_id, run_id, now, now, now, issue_id],
        )
    return True


@csrf_exempt
def baseline_claim_sql(request, issue_id):
    body = json.loads(request.body)
    if not _bare_claim(issue_id, body["agentId"], body["runId"]):
        return JsonResponse({"error": "not_found"}, status=404)
    return JsonResponse({"id": str(issue_id), "status": "in_progress"})


class DrfFloorClaim(APIView):
    """The bare claim behind DRF and the agent-key authentication (the settings' classes)."""

    def post(self, request, issue_id):
        if not _bare_claim(issue_id, request.data["agentId"], request.data["runId"]):
            return Response({"error": "not_found"}, status=404)
        return Response({"id": str(issue_id), "status": "in_progress"})


@csrf_exempt
def baseline_claim_orm(request, issue_id):
    body = json.loads(request.body)
    now = timezone.now()
    with transaction.atomic():
        issue = Issue.objects.select_for_update().get(pk=issue_id)
        Issue.objects.filter(pk=issue.pk).update(
            status="in_progress", assignee_agent_id=body["agentId"], checkout_run_id=body["runId"],
            execution_run_id=body["runId"], execution_locked_at=now, started_at=issue.started_at or now,
            updated_at=now,
        )
    return JsonResponse({"id": str(issue_id), "status": "in_progress"})


urlpatterns = [
    path("bench/baseline/<uuid:issue_id>/claim", baseline_claim_sql, name="bench-baseline"),
    path("bench/baseline-orm/<uuid:issue_id>/claim", baseline_claim_orm, name="bench-baseline-orm"),
    path("bench/drf-floor/<uuid:issue_id>/claim", DrfFloorClaim.as_view(), name="bench-drf-floor"),
    *app_urlpatterns,
]
