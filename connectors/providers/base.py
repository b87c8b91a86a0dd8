"""The Task Source Adapter contract (External Task Protocol §4.1, §5).

Every provider module implements :class:`TaskSourceAdapter` and returns the normalized
:class:`ExternalTask`; the engine depends only on these shapes and never branches on a provider.
Provider-only data rides in ``envelope`` (opaque to the host)."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar, Mapping

from paperclip.core.links import web_url  # noqa: F401  (re-exported: every provider's task/comment ``url``)
from paperclip.core.outbound_http import url_refusal


class StateCategory:
    BACKLOG = "backlog"
    ACTIVE = "active"
    REVIEW = "review"
    BLOCKED = "blocked"
    TERMINAL = "terminal"
    ALL = (BACKLOG, ACTIVE, REVIEW, BLOCKED, TERMINAL)


class ErrorCategory:
    """§5.4 error categories; stored on inbound events, sync errors and health."""

    PROVIDER_AUTH = "provider_auth"
    PROVIDER_RATE_LIMITED = "provider_rate_limited"
    PROVIDER_REQUEST = "provider_request"
    PROVIDER_STATUS = "provider_status"
    PROVIDER_PAYLOAD = "provider_payload"
    CURSOR_INVALID = "cursor_invalid"
    WEBHOOK_SIGNATURE = "webhook_signature"
    CONFIG = "config"  # the instance's configuration refuses the request (e.g. a non-public baseUrl)
    ALL = (PROVIDER_AUTH, PROVIDER_RATE_LIMITED, PROVIDER_REQUEST, PROVIDER_STATUS, PROVIDER_PAYLOAD,
           CURSOR_INVALID, WEBHOOK_SIGNATURE, CONFIG)


class ProviderError(Exception):
    """An adapter failure with its §5.4 category. ``retry_after`` (seconds) when the provider said."""

    def __init__(self, category: str, message: str, *, status: int | None = None, retry_after: float | None = None):
        super().__init__(message)
        self.category = category
        self.status = status
        self.retry_after = retry_after


def normalize_state_name(name: str | None) -> str:
    """State names compare after trim + lowercase (§4.3)."""
    return (name or "").strip().lower()


def normalize_labels(labels) -> list[str]:
    seen, out = set(), []
    for label in labels or ():
        value = (label or "").strip().lower()
        if value and value not in seen:
            seen.add(value)
            out.append(value)
    return out


@dataclass(frozen=True)
class ExternalActor:
    """Provenance of inbound content (§4.1.6)."""

    provider_key: str
    external_user_id: str
    display_name: str
    is_connector_service_account: bool = False
    mapped_user_id: str | None = None
    mapped_agent_id: str | None = None


@dataclass(frozen=True)
class ExternalState:
    name: str  # provider state/lane name as the provider spells it
    category: str  # StateCategory; decided by the instance's state mapping, not by code


@dataclass(frozen=True)
class ExternalTaskRef:
    external_id: str
    external_key: str | None = None
    state: str | None = None


@dataclass(frozen=True)
class ExternalTask:
    """§4.1.1. Timestamps are timezone-aware UTC datetimes."""

    provider_key: str
    external_id: str
    external_key: str | None
    title: str
    description: str | None
    state: ExternalState
    priority: int | None = None  # 0-4, lower is more urgent
    assignees: tuple[ExternalActor, ...] = ()
    labels: tuple[str, ...] = ()  # trimmed, lowercased
    blocked_by: tuple[ExternalTaskRef, ...] = ()
    url: str | None = None  # adapters pass it through web_url: it becomes a link in the console
    branch_name: str | None = None
    due_at: datetime | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    revision: str | None = None
    container_id: str | None = None  # repository / team / project / board / database
    envelope: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ExternalComment:
    external_comment_id: str
    external_task_id: str
    author: ExternalActor
    body: str  # Markdown, best effort
    url: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    envelope: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Page:
    """One page of a listing. ``cursor`` is provider-opaque; ``None`` means no further page now.

    ``skipped``: records of this page the adapter could not normalize (schema drift, §13.1.8), each
    ``{"recordId": ..., "recordKey": ..., "reason": ...}``. They are left out of ``items`` but the
    cursor still moves past them, so one malformed record never stalls the listing."""

    items: list
    cursor: str | None
    skipped: list = field(default_factory=list)


class EventKind:
    """What a verified webhook says happened, provider-neutral."""

    TASK_UPSERTED = "task.upserted"  # created, edited, state change, labels, assignees...
    TASK_DELETED = "task.deleted"  # deleted, or moved out of the container (transferred)
    COMMENT_UPSERTED = "comment.upserted"
    COMMENT_DELETED = "comment.deleted"
    IGNORED = "ignored"  # a valid delivery the engine has nothing to do for (e.g. a pull request)


@dataclass(frozen=True)
class VerifiedEvent:
    """A webhook delivery that passed verification and parsed (§5.1.5).

    ``event_id`` is the provider's delivery/event id (the inbound idempotency key); providers
    without one use a content hash. ``task`` / ``comment`` carry the normalized content the
    payload holds; ``trusted_content`` is False for providers whose payloads are hints to be
    confirmed by API read-back."""

    event_id: str
    kind: str  # EventKind
    action: str  # the provider's own action name, for history ("issues.labeled")
    external_task_id: str | None
    occurred_at: datetime | None = None
    task: ExternalTask | None = None
    comment: ExternalComment | None = None
    actor: ExternalActor | None = None
    # The container the payload names. ``None`` when the payload does not say (e.g. a comment
    # removal that names only its task): the engine then accepts it only for a task already linked
    # on this instance (§7.1.1). A payload that names another container is rejected by the adapter.
    container_id: str | None = None
    trusted_content: bool = True
    # Signed, but the payload names the comment without its content (Notion, Asana): the engine reads it
    # back through the API like an unverified hint, and the event keeps ``verification: signature``.
    # (A sparse task upsert needs no flag: ``task=None`` already says it.)
    sparse: bool = False
    # Further events the same delivery carries (a Jira issue update that carries a comment): each
    # is stored as its own inbox row, after this one, under its own ``event_id``.
    carried: tuple["VerifiedEvent", ...] = ()


@dataclass(frozen=True)
class WebhookRequest:
    """The raw request the endpoint hands to ``verify_webhook``: exact body bytes, lower-cased headers.
    ``received_at`` (epoch seconds): when the delivery arrived, for a stored delivery verified again
    later (a replay): timestamp checks measure against it instead of the clock."""

    body: bytes
    headers: Mapping[str, str]
    # The public URL the provider was given (``PAPERCLIP_PUBLIC_URL`` + the webhook path, with the
    # ``?scope=`` of a per-container registration): Trello signs it. Never the request's Host.
    url: str = ""
    received_at: float | None = None
    method: str = "POST"  # HEAD for a Trello callback check; everything else is a POST
    # The container a per-container registration named in its callback URL (``?scope=<id>``), e.g. the
    # Asana project whose webhook this is (its events carry ``parent: null``). Only trustworthy once the
    # signature verified: the signing secret of that registration was chosen by it.
    scope: str | None = None


@dataclass(frozen=True)
class HandshakeReply:
    """The answer to a provider's setup request, which is not an event (Appendix A.3-A.5): Asana's
    ``X-Hook-Secret`` echo, Trello's ``HEAD`` check, Notion's one-time ``verification_token``.

    ``secret``: a signing secret the provider handed over in the request; the engine stores it as an
    encrypted connector secret (the instance's, or the ``scope``'s registration's) — and only while a
    handshake is expected (no secret yet, or a registration/verification window is open), else the
    handshake is refused with nothing stored. ``show_operator``: the secret must be shown to the operator
    (Notion's token is pasted back into Notion to finish verification). ``headers``/``body``/``status``
    are what the view answers."""

    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    body: Mapping[str, Any] | None = None
    secret: str | None = None
    show_operator: bool = False
    detail: str = ""  # what happened, for health and the console ("Asana handshake: signing secret received")


@dataclass(frozen=True)
class WebhookRegistration:
    """A provider-side webhook the connector created for one container (``connector_register_webhooks``,
    §13.2). ``external_id`` is the provider's webhook id; ``active`` what the provider says now."""

    scope: str
    external_id: str
    callback_url: str
    active: bool = True
    detail: str = ""


class WebhookRejected(ProviderError):
    """Bad, missing or wrong signature (401), or a payload for another container."""

    def __init__(self, message: str, *, category: str = ErrorCategory.WEBHOOK_SIGNATURE):
        super().__init__(category, message)


class WebhookUnparseable(ProviderError):
    """Signature fine, body not a payload this provider sends (400)."""

    def __init__(self, message: str):
        super().__init__(ErrorCategory.PROVIDER_PAYLOAD, message)


# §8.2 strict comment command verbs. The engine parses and executes them for every provider
# (connectors.services.commands), and every adapter's capability metadata lists them: one list.
COMMAND_VERBS = ("assign", "status", "pause", "resume")


@dataclass(frozen=True)
class Capabilities:
    """§5.2 static capability declaration, read by the console and the API."""

    operations: frozenset[str]  # names of implemented TaskSourceAdapter methods, incl. optional writes
    state_categories: frozenset[str]
    signed_webhooks: bool
    routing_rule_kinds: frozenset[str]
    has_external_keys: bool = True
    # Paperclip fields ``set_fields`` can write (a Paperclip-side edit of another one is never pushed).
    settable_fields: frozenset[str] = frozenset({"title", "description"})
    command_verbs: tuple[str, ...] = COMMAND_VERBS  # §8.2: "all verbs MUST be listed in capability metadata"

    def as_dict(self) -> dict:
        return {"operations": sorted(self.operations), "stateCategories": sorted(self.state_categories),
                "signedWebhooks": self.signed_webhooks, "routingRuleKinds": sorted(self.routing_rule_kinds),
                "hasExternalKeys": self.has_external_keys, "settableFields": sorted(self.settable_fields),
                "commandVerbs": list(self.command_verbs)}


@dataclass(frozen=True)
class AdapterConfig:
    """What an adapter is constructed with. Secrets arrive resolved, never stored here."""

    base_url: str
    containers: tuple[str, ...]  # e.g. ("octo-org/octo-repo",)
    state_mapping: Mapping[str, Any]  # provider-specific, validated by ``validate_state_mapping``
    credentials: str | None = None  # resolved token
    webhook_secret: str | None = None  # resolved secret
    service_account_id: str | None = None  # the connector's own provider user id (echo suppression)
    timeout: float = 10.0
    # Ids of the provider custom fields the instance's ``custom_field`` routing rules read (§8.1): an
    # adapter that fetches fields by name (Jira) requests them, and ``envelope["customFields"]`` holds them.
    custom_fields: tuple[str, ...] = ()
    # The instance's provider-specific settings (``ConnectorInstance.config``, never secrets), e.g. the
    # Asana workspace gid new tasks are created in.
    options: Mapping[str, Any] = field(default_factory=dict)


class TaskSourceAdapter:
    """Implement the required operations; optional writes raise NotImplementedError unless declared."""

    provider_key: ClassVar[str]
    capabilities: ClassVar[Capabilities]
    # The request header carrying the provider's delivery id (lower-case), if it sends one: the inbox
    # key of a delivery that verifies but does not parse (else a content hash, as ``event_id``).
    delivery_id_header: ClassVar[str] = ""
    # What the console's setup form says about each field for this provider (field -> help text):
    # "containers", "baseUrl", "credentials", "webhookSecret", "stateMapping", "serviceAccountId", "config",
    # "webhooks" (how deliveries reach Paperclip: registration, handshake, or by hand), and
    # "stateMappingExample" (a JSON text the form pre-fills).
    setup_help: ClassVar[Mapping[str, str]] = {}
    display_name: ClassVar[str] = ""  # "GitHub Issues", "Trello" (the console's provider choice)
    # A new instance's poll interval when its creator gives none (None: the model's default). Providers
    # whose webhooks are only hints poll more often: polling is their primary channel (Notion).
    default_poll_interval_seconds: ClassVar[int | None] = None

    def __init__(self, config: AdapterConfig):
        self.config = config

    @classmethod
    def base_url_refusal(cls, url: str) -> str | None:
        """Why ``url`` cannot be this provider's base URL, or None. Requests carry the instance's
        credentials, so the URL must pass the server's outbound guard (https, a public address
        unless the operator allowed it)."""
        return url_refusal(url)

    # --- §5.1 required -----------------------------------------------------------------------
    def list_candidate_tasks(self, scope: str, cursor: str | None) -> Page:
        """One page of tasks in container ``scope`` changed since ``cursor`` (items: ExternalTask)."""
        raise NotImplementedError

    def since_cursor(self, scope: str, since: datetime) -> str | None:
        """A ``list_candidate_tasks`` cursor that starts at the tasks updated at or after ``since`` (a
        bounded look for a task created then, e.g. an export retried after a lost answer); ``None``
        when this provider's cursors cannot say it (the listing then starts at the beginning)."""
        return None

    # Lookups take an ExternalTaskRef (stable id + human key as stored on the link): some
    # providers address tasks by key (GitHub "owner/repo#12", Jira "ABC-1"), others by id.
    def get_task(self, ref: ExternalTaskRef) -> ExternalTask:
        """Raises ProviderError(PROVIDER_STATUS, status=404) when the task no longer exists."""
        raise NotImplementedError

    def get_task_states(self, refs: list[ExternalTaskRef]) -> dict[str, ExternalState | None]:
        """Batched state refresh keyed by external id; ``None`` for a task the provider says is gone."""
        raise NotImplementedError

    def list_comments(self, ref: ExternalTaskRef, cursor: str | None) -> Page:
        """Comments since ``cursor`` (items: ExternalComment)."""
        raise NotImplementedError

    def verify_webhook(self, request: WebhookRequest) -> VerifiedEvent:
        """Check the signature in constant time *before* parsing; raise WebhookRejected /
        WebhookUnparseable."""
        raise NotImplementedError

    # --- webhook setup (Appendix A.3-A.5, §13.2) ------------------------------------------------
    def webhook_handshake(self, request: WebhookRequest) -> HandshakeReply | None:
        """The reply to a setup request that is not a delivery (a ``HEAD`` check, a secret echo, a
        verification token), or ``None`` when ``request`` is a delivery for :meth:`verify_webhook`.
        Called before verification, without credentials; a ``HEAD`` nobody answers is a 405."""
        return None

    def register_webhook(self, scope: str, callback_url: str) -> WebhookRegistration:
        """Create the provider's webhook for container ``scope`` calling ``callback_url`` (declared as
        ``register_webhook`` in ``Capabilities.operations``). The provider may call back during the
        request (Asana's handshake, Trello's HEAD): the engine has its handshake window open then."""
        raise NotImplementedError

    def check_webhook(self, registration: WebhookRegistration) -> WebhookRegistration:
        """Re-verify a registration (at worker start, §13.2): the provider's current view of it, with
        ``active=False`` and a reason when it is gone or disabled. Raises ProviderError like any read."""
        raise NotImplementedError

    @classmethod
    def container_key(cls, value: str) -> str:
        """How container ids compare (configured vs. delivered): Notion's dashed and undashed UUIDs are
        one id; others compare trimmed and case-insensitive."""
        return str(value or "").strip().lower()

    def run_mode_refusal(self, run_mode: str) -> str | None:
        """Why this configuration cannot run ``run_mode`` (e.g. the Symphony profile on a Notion database
        without a status property, Appendix A.4), or None."""
        return None

    def validate_state_mapping(self, mapping: Mapping[str, Any]) -> dict[str, list[str]]:
        """Field -> reasons for a bad mapping (empty when valid)."""
        return {}

    @classmethod
    def config_errors(cls, options: Mapping[str, Any]) -> dict[str, list[str]]:
        """Provider-specific checks of the instance's ``config`` (key path -> reasons; empty when valid), e.g.
        Trello's list narrowing. The engine has already refused inline secrets."""
        return {}

    @classmethod
    def routing_match_errors(cls, kind: str, match: Mapping[str, Any]) -> dict[str, list[str]]:
        """Provider-specific checks of a routing rule's ``match`` (key -> reasons; empty when valid), e.g.
        how this provider names custom fields. The kind is already one of ``routing_rule_kinds``."""
        return {}

    def workflow_metadata(self, scope: str) -> Mapping[str, Any] | None:
        """Live workflow of container ``scope`` for setup validation (§7.2: "validated at setup against live
        provider workflow metadata where available"); ``None`` when the provider has none (GitHub).

        Shape: ``{"containerKind": "project", "keys": [spellings mapping overrides may use for this
        container], "nameSections": [state_mapping keys whose keys are state names], "overrideSection":
        state_mapping key of per-container overrides, "states": [{"name", "category", "mapped", ...}]}``.
        Raises ProviderError like any read."""
        return None

    # --- §5.2 optional writes ----------------------------------------------------------------
    def create_task(self, scope: str, projection: Mapping[str, Any]) -> ExternalTask:
        raise NotImplementedError

    def update_task_state(self, ref: ExternalTaskRef, target_state_name: str) -> None:
        raise NotImplementedError

    def state_for_category(self, ref: ExternalTaskRef, category: str) -> str | None:
        """The name of a mapped state of ``category`` this task can be moved to, read from the live
        workflow, for mappings that map state types/categories rather than names (§10.3: projection
        still only moves between states the operator mapped). ``None`` when there is none."""
        raise NotImplementedError

    def post_comment(self, ref: ExternalTaskRef, body: str) -> str:
        raise NotImplementedError

    def set_fields(self, ref: ExternalTaskRef, fields: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def set_backlink(self, ref: ExternalTaskRef, paperclip_url: str) -> None:
        raise NotImplementedError

    # --- §6.3 optional read --------------------------------------------------------------------
    def find_backlinks(self, ref: ExternalTaskRef) -> list[str]:
        """The Paperclip URLs of the backlinks the task carries, exactly as :meth:`set_backlink` writes
        them (a marked comment, a marked attachment, a remote link with the Paperclip global id), in
        the provider's order; ``[]`` when there is none. Only our own format counts: a comment that
        merely quotes a Paperclip URL is not a backlink. Declared as ``find_backlinks`` in
        ``Capabilities.operations``; the engine's dedupe (§6.3 step 2) reads it before it imports a
        task that was linked before. Raises ProviderError like any read."""
        raise NotImplementedError


_REGISTRY: dict[str, type[TaskSourceAdapter]] = {}


def register(cls: type[TaskSourceAdapter]) -> type[TaskSourceAdapter]:
    _REGISTRY[cls.provider_key] = cls
    return cls


def adapter_class(provider_key: str) -> type[TaskSourceAdapter]:
    from . import registry  # noqa: F401  (imports every provider module so they register)

    try:
        return _REGISTRY[provider_key]
    except KeyError:
        raise LookupError(f"Unknown provider '{provider_key}'.") from None


def provider_keys() -> list[str]:
    from . import registry  # noqa: F401

    return sorted(_REGISTRY)
