"""Connectors API: instance CRUD, health, links, conflicts, events and operator interventions.
Thin: parse, call a selector or service, serialize. Board users only; another company's ids are a
404 like ids that do not exist."""
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from issues.actors import actor_from_request
from issues.api.serializers import ErrorSerializer
from issues.api.views import ERRORS, LIST_PARAMS, parse
from issues.filtersets import openapi_parameters
from issues.models import Issue

from ..models import Conflict
from issues.selectors import get_by_ref

from .. import selectors
from ..filtersets import ConflictFilterSet, InboundEventFilterSet, TaskLinkFilterSet
from ..services import instances as instance_services
from ..services import interventions as iv
from . import export_serializers as xs
from . import serializers as s

def _config(request, serializer_class):
    """(validated data, config fields keyed by model field name, routing rules or None)."""
    from ..services.instances import CONFIG_FIELDS

    data = parse(serializer_class, request)
    fields = {k: v for k, v in data.items() if k in CONFIG_FIELDS}
    rules = [dict(r) for r in data["routingRules"]] if "routingRules" in data else None
    return data, fields, rules


def _instance(request, instance_id, *, board_check=True):
    actor = actor_from_request(request)
    instance = selectors.instance_get(actor=actor, pk=instance_id)
    if board_check:
        iv.require_board(actor)
    return actor, instance


def _link(request, link_id):
    actor = actor_from_request(request)
    link = selectors.link_get(actor=actor, pk=link_id)
    iv.require_board(actor)
    return actor, link


class CompanyConnectorsView(APIView):
    @extend_schema(parameters=LIST_PARAMS, responses={200: s.InstanceSerializer(many=True), **ERRORS},
                   operation_id="company_connectors_list")
    def get(self, request, company_id):
        actor = actor_from_request(request)
        company = actor.company(company_id)
        iv.require_board(actor)
        return Response(s.InstanceSerializer(selectors.instance_list(company=company, params=request.query_params),
                                             many=True).data)

    @extend_schema(request=s.InstanceCreateSerializer, responses={201: s.InstanceSerializer, **ERRORS},
                   operation_id="company_connectors_create",
                   description="Owners and admins. credentials/webhookSecret: 'env:NAME' or {\"value\": …} "
                               "(stored encrypted, never returned).")
    def post(self, request, company_id):
        actor = actor_from_request(request)
        company = actor.company(company_id)
        data, fields, rules = _config(request, s.InstanceCreateSerializer)
        fields.pop("name", None)
        instance = instance_services.instance_create(
            actor=actor, company=company, name=data["name"], provider_key=data["provider"],
            credentials=data.get("credentials"), webhook_secret=data.get("webhookSecret"), routing_rules=rules,
            **fields)
        return Response(s.InstanceSerializer(selectors.instance_get(actor=actor, pk=instance.pk)).data,
                        status=status.HTTP_201_CREATED)


class ConnectorDetailView(APIView):
    @extend_schema(responses={200: s.InstanceSerializer, **ERRORS}, operation_id="connectors_retrieve")
    def get(self, request, instance_id):
        _, instance = _instance(request, instance_id)
        return Response(s.InstanceSerializer(instance).data)

    @extend_schema(request=s.InstancePatchSerializer, responses={200: s.InstanceSerializer, **ERRORS},
                   operation_id="connectors_update", description="Owners and admins.")
    def patch(self, request, instance_id):
        actor, instance = _instance(request, instance_id, board_check=False)  # the service checks the role
        _, fields, rules = _config(request, s.InstancePatchSerializer)
        instance_services.instance_update(actor=actor, instance=instance, changes=fields, routing_rules=rules)
        return Response(s.InstanceSerializer(selectors.instance_get(actor=actor, pk=instance.pk)).data)


class ConnectorHealthView(APIView):
    @extend_schema(responses={200: OpenApiTypes.OBJECT, **ERRORS}, operation_id="connectors_health")
    def get(self, request, instance_id):
        _, instance = _instance(request, instance_id)
        return Response(selectors.instance_health(instance))


class ConnectorLinksView(APIView):
    @extend_schema(parameters=[*openapi_parameters(TaskLinkFilterSet), *LIST_PARAMS],
                   responses={200: s.LinkSerializer(many=True), **ERRORS}, operation_id="connectors_links_list")
    def get(self, request, instance_id):
        _, instance = _instance(request, instance_id)
        return Response(s.LinkSerializer(selectors.link_list(instance=instance, params=request.query_params),
                                         many=True).data)

    @extend_schema(request=s.ManualLinkSerializer, responses={200: OpenApiTypes.OBJECT, **ERRORS},
                   operation_id="connectors_links_create",
                   description="Manual link (originSide=manual_link): pair an existing external task with an "
                               "existing issue; divergence becomes conflicts.")
    def post(self, request, instance_id):
        actor, instance = _instance(request, instance_id, board_check=False)
        data = parse(s.ManualLinkSerializer, request)
        issue = get_by_ref(Issue.objects.filter(company_id=instance.company_id), actor, data["issueId"], "Issue")
        return Response(iv.link_manual_create(actor=actor, instance=instance, issue=issue,
                                              idempotency_key=data["idempotencyKey"],
                                              external_task_id=data.get("externalTaskId"),
                                              external_key=data.get("externalKey")))


class ConnectorImportView(APIView):
    @extend_schema(request=s.ImportSerializer, responses={200: OpenApiTypes.OBJECT, **ERRORS},
                   operation_id="connectors_import",
                   description="Import one external task now (dedupe per §6.3; terminal tasks too).")
    def post(self, request, instance_id):
        actor, instance = _instance(request, instance_id)
        data = parse(s.ImportSerializer, request)
        return Response(iv.task_import_manual(actor=actor, instance=instance, idempotency_key=data["idempotencyKey"],
                                              external_task_id=data.get("externalTaskId"),
                                              external_key=data.get("externalKey")))


class ConnectorConflictsView(APIView):
    @extend_schema(parameters=[*openapi_parameters(ConflictFilterSet), *LIST_PARAMS],
                   responses={200: s.ConflictSerializer(many=True), **ERRORS},
                   operation_id="connectors_conflicts_list")
    def get(self, request, instance_id):
        _, instance = _instance(request, instance_id)
        return Response(s.ConflictSerializer(selectors.conflict_list(instance=instance, params=request.query_params),
                                             many=True).data)


class ConnectorEventsView(APIView):
    @extend_schema(parameters=[*openapi_parameters(InboundEventFilterSet), *LIST_PARAMS],
                   responses={200: s.EventSerializer(many=True), **ERRORS}, operation_id="connectors_events_list")
    def get(self, request, instance_id):
        _, instance = _instance(request, instance_id)
        return Response(s.EventSerializer(selectors.event_list(instance=instance, params=request.query_params),
                                          many=True).data)


def _intervention(fn_name):
    class View(APIView):
        @extend_schema(request=s.InterventionSerializer, responses={200: s.InterventionResultSerializer, **ERRORS},
                       operation_id=f"connectors_{fn_name}")
        def post(self, request, instance_id):
            actor, instance = _instance(request, instance_id)
            data = parse(s.InterventionSerializer, request)
            result = getattr(iv, fn_name)(actor=actor, instance=instance, idempotency_key=data["idempotencyKey"],
                                          reason=data["reason"])
            return Response(result)

    View.__name__ = f"Connector_{fn_name}_View"
    return View


ConnectorPauseView = _intervention("instance_pause")
ConnectorResumeView = _intervention("instance_resume")


class ConnectorCredentialsView(APIView):
    @extend_schema(request=s.CredentialsRotateSerializer, responses={200: s.InterventionResultSerializer, **ERRORS},
                   operation_id="connectors_credentials_rotate", description="Owners and admins.")
    def post(self, request, instance_id):
        actor, instance = _instance(request, instance_id)
        data = parse(s.CredentialsRotateSerializer, request)
        result = iv.credentials_rotate(actor=actor, instance=instance, idempotency_key=data["idempotencyKey"],
                                       credentials=request.data.get("credentials"),
                                       webhook_secret=request.data.get("webhookSecret"), reason=data["reason"])
        return Response(result)


class LinkDetailView(APIView):
    @extend_schema(responses={200: s.LinkDetailSerializer, **ERRORS}, operation_id="connector_links_retrieve")
    def get(self, request, link_id):
        _, link = _link(request, link_id)
        return Response(s.LinkDetailSerializer(link).data)

    @extend_schema(request=s.LinkPatchSerializer, responses={200: s.LinkDetailSerializer, **ERRORS},
                   operation_id="connector_links_partial_update",
                   description="Owners and admins: the link's own §7.4 close policy ('' follows the connector's). "
                               "Audited when it changes; repeating a PATCH changes nothing.")
    def patch(self, request, link_id):
        from ..services.close_reopen import link_close_policy_set

        actor, link = _link(request, link_id)
        data = parse(s.LinkPatchSerializer, request)
        if "close_policy" in data:
            link = link_close_policy_set(actor=actor, link=link, close_policy=data["close_policy"])
        return Response(s.LinkDetailSerializer(selectors.link_get(actor=actor, pk=link.pk)).data)


class LinkActivityView(APIView):
    @extend_schema(parameters=LIST_PARAMS, responses={200: s.ActivitySerializer(many=True), **ERRORS},
                   operation_id="connector_links_activity")
    def get(self, request, link_id):
        _, link = _link(request, link_id)
        return Response(s.ActivitySerializer(selectors.link_activity(link=link, params=request.query_params),
                                             many=True).data)


def _link_intervention(fn_name):
    class View(APIView):
        @extend_schema(request=s.InterventionSerializer, responses={200: s.InterventionResultSerializer, **ERRORS},
                       operation_id=f"connector_{fn_name}")
        def post(self, request, link_id):
            actor, link = _link(request, link_id)
            data = parse(s.InterventionSerializer, request)
            return Response(getattr(iv, fn_name)(actor=actor, link=link, idempotency_key=data["idempotencyKey"],
                                                 reason=data["reason"]))

    View.__name__ = f"Link_{fn_name}_View"
    return View


LinkPauseView = _link_intervention("link_pause")
LinkResumeView = _link_intervention("link_resume")
LinkResyncView = _link_intervention("link_resync")
LinkUnlinkView = _link_intervention("link_unlink")


class EventReplayView(APIView):
    @extend_schema(request=s.InterventionSerializer, responses={200: s.InterventionResultSerializer, **ERRORS},
                   operation_id="connector_events_replay")
    def post(self, request, event_id):
        actor = actor_from_request(request)
        event = selectors.event_get(actor=actor, pk=event_id)
        iv.require_board(actor)
        data = parse(s.InterventionSerializer, request)
        return Response(iv.event_replay(actor=actor, event=event, idempotency_key=data["idempotencyKey"],
                                        reason=data["reason"]))


class IssueConnectorLinksView(APIView):
    @extend_schema(responses={200: s.LinkSerializer(many=True), **ERRORS}, operation_id="issues_connector_links")
    def get(self, request, issue_id):
        actor = actor_from_request(request)
        links = selectors.issue_links(actor=actor, issue_ref=issue_id)
        iv.require_board(actor)
        return Response(s.LinkSerializer(links, many=True).data)

    @extend_schema(request=xs.ExportRequestSerializer,
                   responses={201: xs.ExportSerializer, 200: xs.ExportSerializer, **ERRORS,
                              502: ErrorSerializer, 503: ErrorSerializer},
                   operation_id="issues_connector_links_export",
                   description="Export (§6.2.2): create the issue's task in one of the instance's containers and "
                               "link it (originSide=paperclip; Paperclip owns title/description/priority/labels/"
                               "dueAt, state is shared). Board writers. Idempotent on idempotencyKey: a repeat of "
                               "a linked export answers 200 with the same export and link, and a retry after a "
                               "failed or lost answer looks for the task it created before creating one. 400 "
                               "container/instanceId (capability_missing), 409 already_linked / connector_paused / "
                               "export_in_progress / idempotency_key_reused, 502 (503 when rate-limited) when the "
                               "provider did not create the task (the export is failed, nothing is linked).")
    def post(self, request, issue_id):
        from issues.selectors import scoped_get

        from ..models import ConnectorInstance
        from ..services.export import issue_export

        actor = actor_from_request(request)
        issue = get_by_ref(Issue.objects.all(), actor, issue_id, "Issue")
        data = parse(xs.ExportRequestSerializer, request)
        # another company's instance is a 404 for everyone, before the board-only check (as for issueId)
        instance = scoped_get(ConnectorInstance.objects.filter(company_id=issue.company_id), actor,
                              data["instanceId"], "Connector")
        iv.require_board(actor)
        outcome = issue_export(actor=actor, instance=instance, issue=issue, container=data.get("container"),
                               idempotency_key=data["idempotencyKey"], reason=data["reason"])
        return Response(xs.ExportSerializer(outcome).data,
                        status=status.HTTP_201_CREATED if outcome.created else status.HTTP_200_OK)


def _conflict(request, conflict_id):
    from ..services.conflicts import conflict_get

    actor = actor_from_request(request)
    conflict = conflict_get(actor=actor, pk=conflict_id)
    iv.require_board(actor)
    return actor, conflict


class ConflictDetailView(APIView):
    @extend_schema(responses={200: s.ConflictDetailSerializer, **ERRORS}, operation_id="connector_conflicts_retrieve")
    def get(self, request, conflict_id):
        _, conflict = _conflict(request, conflict_id)
        return Response(s.ConflictDetailSerializer(conflict).data)


class ConflictResolveView(APIView):
    @extend_schema(request=s.ConflictResolveSerializer, responses={200: s.ConflictDetailSerializer, **ERRORS},
                   operation_id="connector_conflicts_resolve",
                   description="Operators and above. keep_paperclip / keep_external / merge_manual (mergedValue) / "
                               "unlink / dismiss. 409 conflict_not_open when someone resolved it meanwhile.")
    def post(self, request, conflict_id):
        from ..services.conflicts import conflict_resolve

        actor, conflict = _conflict(request, conflict_id)
        data = parse(s.ConflictResolveSerializer, request)
        row = conflict_resolve(actor=actor, conflict=conflict, action=data["action"],
                               merged_value=data.get("mergedValue"), expected_status=data["expectedStatus"],
                               idempotency_key=data["idempotencyKey"])
        row = Conflict.objects.select_related("link").get(pk=row.pk)
        return Response(s.ConflictDetailSerializer(row).data)


class LinkOutboundView(APIView):
    @extend_schema(parameters=LIST_PARAMS, responses={200: s.OutboundEffectSerializer(many=True), **ERRORS},
                   operation_id="connector_links_outbound",
                   description="The link's outbound effects (the write outbox, §10), newest first.")
    def get(self, request, link_id):
        from issues.selectors import list_window

        from ..models import OutboundEffect

        _, link = _link(request, link_id)
        limit, offset = list_window(request.query_params)
        effects = OutboundEffect.objects.filter(link=link).order_by("-id")[offset:offset + limit]
        return Response(s.OutboundEffectSerializer(effects, many=True).data)
