"""Bounded, paged reads of cases, their documents and workflow prompts (seed 001: ``read_case``).

Paging model
------------
A paged read serves one *text* (a JSON document, or a document body, or a workflow prompt) in
pages. ``offsetBytes`` / ``nextOffsetBytes`` / ``totalBytes`` count **bytes of the UTF-8
encoding of that whole text** (not characters, not bytes of the JSON-escaped response). A page
is the text's bytes ``[offsetBytes, nextOffsetBytes)``, at most ``limitBytes`` long, always cut
on a UTF-8 character boundary: a multi-byte character that would straddle the limit moves to the
next page, so every ``readPage.text`` is a valid string and concatenating the pages in order
gives back the exact text. ``limitBytes`` is at least 4 (one character of any width) and at
most ``PAPERCLIP["CASE_READ_MAX_BYTES"]``; an offset that is not a character boundary is a 400.

Bounded memory
--------------
The large parts (``Case.fields``, a document revision body, a workflow prompt) are never
loaded into Python for a page. The database cuts the byte window: PostgreSQL
``substring(convert_to(<text>, 'UTF8') from … for …)`` over ``fields::text``; SQLite
``substr(CAST(<column> AS BLOB), …, …)``. Python only sees the window (``limitBytes + 1``
bytes, the extra byte tells where the next character starts) and the small metadata (on SQLite
also one digest chunk at a time, see :mod:`cases.sqlite_digest`).

Snapshots
---------
Every answer carries a ``snapshot``: an opaque token binding the selected projection
(``case``, ``fields``, ``casedocument:<key>`` or ``document:<issue>:<key>``), the case version (id, ``updated_at``,
the projection's metadata bytes, the byte length of ``fields`` and the md5 of its JSON text
computed by the database in the statement that cuts the page, on both databases), the primary
task's version (id, ``updated_at``) and, for documents, the document identity, latest revision
id, body length and body md5. A same-length edit made behind the ORM (a raw UPDATE that leaves
``updated_at`` alone) therefore still moves the snapshot.
A continuation (``offsetBytes > 0``) must present it; whenever a presented snapshot differs
from the current one the read answers 409 ``read_snapshot_stale`` and the caller restarts at
``offsetBytes=0`` without a snapshot. Each page re-runs the full access checks (company,
``enable_cases``, document linkage), so access lost mid-read is a 404 on the next page.

Workflow prompts use the same pages pinned to the stored content ``fingerprint`` (sha256 of
the prompt): every edit, including one of the same length, moves it and continuations 409.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass

from django.conf import settings
from django.db import connection
from django.db.models import F
from django.utils.encoding import force_str

from issues.actors import Actor
from issues.exceptions import Conflict, InvalidInput, NotFound
from issues.models import Document, DocumentRevision, Issue
from issues.selectors import get_by_ref, scoped_get

from . import sqlite_digest
from .models import Case, CaseDocument, CaseDocumentRevision, CaseHandoff, CaseIssueLink, WorkflowDefinition
from .selectors import CASE_RELATED

DEFAULT_LIMIT_BYTES = 64 * 1024
MAX_LIMIT_BYTES = 256 * 1024
MIN_LIMIT_BYTES = 4  # the widest UTF-8 character: every page makes progress
# No paged text can be this long (PostgreSQL caps a value at 1 GB, SQLite at 1e9 bytes by default),
# and PostgreSQL's substring() takes an ``integer`` start: a larger offset is answered as past the
# end before any SQL runs (it would otherwise fail there, from 2^31 on PostgreSQL, 2^63 on SQLite).
MAX_OFFSET_BYTES = 2**31 - 2
SNAPSHOT_PREFIX = "rs1."
STALE_CODE = "read_snapshot_stale"


def limits() -> tuple[int, int]:
    conf = settings.PAPERCLIP
    maximum = int(conf.get("CASE_READ_MAX_BYTES", MAX_LIMIT_BYTES))
    return min(int(conf.get("CASE_READ_DEFAULT_BYTES", DEFAULT_LIMIT_BYTES)), maximum), maximum


# --- byte windows cut by the database -------------------------------------------------------
@dataclass
class Window:
    total: int  # bytes of the whole UTF-8 text
    digest: str  # md5 of the text, computed by the database (cases.sqlite_digest on SQLite)
    data: bytes  # the requested byte window


def _is_postgres() -> bool:
    return connection.vendor == "postgresql"


def sql_window(model, column: str, pk, start: int, length: int, *, json_text: bool = False,
               guard: dict | None = None) -> Window | None:
    """Bytes ``[start, start + length)`` of the UTF-8 text of ``model.column`` for row ``pk``,
    with the text's byte length and md5, cut inside the database by one statement.

    ``guard`` adds ``AND column = value`` conditions (e.g. the ``updated_at`` the caller already
    read) so the window provably belongs to the same row version; ``None`` when no row matches.
    Only the window crosses into Python, whatever the size of the value."""
    qn = connection.ops.quote_name
    table = qn(model._meta.db_table)
    col = qn(model._meta.get_field(column).column)
    pk_field = model._meta.pk
    where = [f"{qn(pk_field.column)} = %s"]
    params = [pk_field.get_db_prep_value(pk, connection)]
    for name, value in (guard or {}).items():
        field = model._meta.get_field(name)
        where.append(f"{qn(field.column)} = %s")
        params.append(field.get_db_prep_value(value, connection))
    where_sql = " AND ".join(where)
    if _is_postgres():
        expr = f"{col}::text" if json_text else col
        sql = (f"WITH s AS MATERIALIZED (SELECT convert_to({expr}, 'UTF8') AS b FROM {table} WHERE {where_sql}) "
               f"SELECT octet_length(b), md5(b), substring(b from %s for %s) FROM s")
        params += [start + 1, length]
    else:
        sql = sqlite_digest.window_sql(table=table, column=col, where_sql=where_sql)
        params += [start + 1, length]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return None
    total, digest, data = row
    return Window(total=int(total or 0), digest=digest or "", data=bytes(data or b""))


def _utf8_cut(window: bytes, limit: int) -> bytes:
    """The longest prefix of ``window`` of at most ``limit`` bytes that ends on a character
    boundary; ``window`` holds one byte more than the limit when the text goes on."""
    if len(window) <= limit:
        return window
    cut = limit
    while cut > 0 and (window[cut] & 0xC0) == 0x80:  # window[cut] continues a character
        cut -= 1
    return window[:cut]


def _page(window: bytes, offset: int, limit: int, total: int) -> dict:
    if offset > 0 and window and (window[0] & 0xC0) == 0x80:
        raise InvalidInput("offsetBytes is inside a character.", code="invalid_offset",
                           details={"offsetBytes": ["Not a UTF-8 character boundary; use a nextOffsetBytes value."]})
    chunk = _utf8_cut(window, limit)
    text = chunk.decode("utf-8")
    end = offset + len(chunk)
    return {"text": text, "offsetBytes": offset, "nextOffsetBytes": end, "totalBytes": total,
            "limitBytes": limit, "done": end >= total}


def _past_end(reason: str) -> InvalidInput:
    return InvalidInput("offsetBytes is past the end.", code="invalid_offset", details={"offsetBytes": [reason]})


def _check_offset(offset: int, total: int):
    if offset > total:
        raise _past_end(f"Must be at most totalBytes ({total}).")


# --- read parameters ---------------------------------------------------------------------------
@dataclass
class ReadParams:
    offset: int = 0
    limit: int = DEFAULT_LIMIT_BYTES
    snapshot: str | None = None
    section: str | None = None
    document_key: str | None = None
    document_issue_id: object = None


def read_params(*, offset_bytes=None, limit_bytes=None, snapshot=None, section=None, document_key=None,
                document_issue_id=None, snapshot_field="snapshot") -> ReadParams:
    default, maximum = limits()
    limit = default if limit_bytes is None else min(int(limit_bytes), maximum)
    errors = {}
    if limit < MIN_LIMIT_BYTES:
        errors["limitBytes"] = [f"Must be at least {MIN_LIMIT_BYTES}."]
    offset = int(offset_bytes or 0)
    if offset > MAX_OFFSET_BYTES:
        raise _past_end(f"Must be at most totalBytes; no text is longer than {MAX_OFFSET_BYTES} bytes.")
    if offset < 0:
        errors["offsetBytes"] = ["Must be zero or more."]
    if offset > 0 and not snapshot:
        errors[snapshot_field] = [f"Required when offsetBytes > 0: pass the {snapshot_field} of the first page."]
    if section == "document" and not document_key:
        errors["documentKey"] = ["Required with section=document."]
    if section != "document" and (document_key or document_issue_id):
        errors["section"] = ["documentKey and documentIssueId need section=document."]
    if errors:
        raise InvalidInput(details=errors)
    return ReadParams(offset=offset, limit=limit, snapshot=snapshot or None, section=section,
                      document_key=document_key, document_issue_id=document_issue_id)


# --- snapshots -------------------------------------------------------------------------------
def _h(*parts) -> str:
    return hashlib.sha256("\x1f".join(force_str(p) for p in parts).encode("utf-8")).hexdigest()[:32]


def _encode_snapshot(components: dict) -> str:
    raw = json.dumps(components, separators=(",", ":"), sort_keys=True).encode()
    return SNAPSHOT_PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_snapshot(token: str) -> dict:
    try:
        if not token.startswith(SNAPSHOT_PREFIX):
            raise ValueError
        body = token[len(SNAPSHOT_PREFIX):]
        data = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        if not isinstance(data, dict):
            raise ValueError
        return data
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise InvalidInput("Not a read snapshot.", code="invalid_snapshot",
                           details={"snapshot": ["Not a snapshot returned by this read; restart at offsetBytes=0."]})


NAMES = {"p": "projection", "c": "case", "t": "task", "d": "document"}


def check_snapshot(presented: str | None, current: dict):
    """409 ``read_snapshot_stale`` when the presented snapshot is not the current one."""
    if not presented:
        return
    old = _decode_snapshot(presented)
    changed = [NAMES[k] for k in ("p", "c", "t", "d") if old.get(k) != current.get(k)]
    if changed:
        raise Conflict("What this read was paging changed since its snapshot (or a different projection was "
                       "asked for); restart at offsetBytes=0 without a snapshot.", code=STALE_CODE,
                       details={"changed": changed, "restartOffsetBytes": 0})


# --- case projections ------------------------------------------------------------------------
def _case_row(actor: Actor, pk) -> Case:
    """The case (company-scoped, ``enable_cases``) without loading ``fields``."""
    qs = Case.objects.select_related(*CASE_RELATED).defer("fields")
    case = get_by_ref(qs, actor, pk, "Case")  # 404: other company or unknown
    if not case.company.enable_cases:
        raise NotFound("Case not found.")
    return case


def _task_component(case: Case) -> str:
    task = case.primary_task
    return _h(task.pk, task.updated_at.isoformat()) if task is not None else "none"


def _versions(case: Case, document=None) -> dict:
    handoff = (CaseHandoff.objects.filter(case=case).order_by("-created_at", "-id")
               .values("id", "status", "updated_at").first())
    task = case.primary_task
    return {
        "caseId": str(case.pk), "caseUpdatedAt": case.updated_at,
        "primaryTaskId": str(task.pk) if task else None,
        "primaryTaskUpdatedAt": task.updated_at if task else None,
        "primaryTaskStatus": task.status if task else None,
        "currentWorkflowId": str(case.current_workflow_id) if case.current_workflow_id else None,
        "phase": case.phase,
        "latestHandoffId": str(handoff["id"]) if handoff else None,
        "latestHandoffStatus": handoff["status"] if handoff else None,
        "documentRevisionId": str(document.latest_revision_id) if document is not None else None,
    }


def case_projection_head(case: Case) -> dict:
    """The case projection without ``fields`` (the agent-read shape: the case plus its links)."""
    from .api.read_serializers import CaseReadProjectionSerializer

    case.link_rows = list(case.issue_links.select_related("issue").order_by("created_at", "id"))
    return CaseReadProjectionSerializer(case).data


def _json_bytes(value) -> bytes:
    from django.core.serializers.json import DjangoJSONEncoder

    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), cls=DjangoJSONEncoder).encode("utf-8")


def _stale_mid_read():
    return Conflict("The case changed while this page was being read; restart at offsetBytes=0 without a snapshot.",
                    code=STALE_CODE, details={"changed": ["case"], "restartOffsetBytes": 0})


def read_case(*, actor: Actor, pk, params: ReadParams) -> dict:
    """``read_case``: the bounded agent read of a case (see the module docstring).

    * no section: the case projection (the case with ``fields`` and its links). If its JSON fits
      ``limitBytes`` the answer is structured (``case``); otherwise it is paged as JSON text
      (``readPage``) whose bytes are the projection's metadata followed by the database's JSON
      text of ``fields`` (``"fields"`` is the last member).
    * ``section=fields``: always pages, over the database's JSON text of ``fields``.
    * ``section=document``: pages over a document body (:func:`_read_document`)."""
    case = _case_row(actor, pk)
    if params.section == "document":
        return _read_document(actor=actor, case=case, params=params)
    if params.section == "fields":
        projection, head, tail = "fields", b"", b""
    else:
        projection = "case"
        meta = dict(case_projection_head(case))
        head = _json_bytes(meta)[:-1] + b',"fields":'
        tail = b"}"
    # One statement cuts the fields part of the byte window [offset, offset + limit + 1) (the
    # text is head | fields text | tail) and measures the fields text, for this row version only.
    f_start = max(params.offset - len(head), 0)
    f_len = max(params.offset + params.limit + 1 - len(head) - f_start, 0)
    window = sql_window(Case, "fields", case.pk, f_start, f_len, json_text=True,
                        guard={"updated_at": case.updated_at})
    if window is None:
        raise _stale_mid_read()
    fields_bytes = window.total
    total = len(head) + fields_bytes + len(tail)
    components = {"p": projection, "t": _task_component(case),
                  "c": _h(case.pk, case.updated_at.isoformat(), _h(head) if head else "", fields_bytes,
                          window.digest)}
    check_snapshot(params.snapshot, components)
    snapshot = _encode_snapshot(components)

    if projection == "case" and params.offset == 0 and total <= params.limit:
        # Small: the whole fields text is in the window; answer structured.
        return {"mode": "structured", "projection": projection,
                "case": {**meta, "fields": json.loads(window.data)}, "document": None, "readPage": None,
                "snapshot": snapshot, "versions": _versions(case)}

    _check_offset(params.offset, total)
    end = params.offset + params.limit + 1
    parts = [head[params.offset:end], window.data]
    t_start, t_end = max(params.offset - len(head) - fields_bytes, 0), end - len(head) - fields_bytes
    if t_end > t_start:
        parts.append(tail[t_start:t_end])
    page = _page(b"".join(parts), params.offset, params.limit, total)
    return {"mode": "text", "projection": projection, "case": None, "document": None, "readPage": page,
            "snapshot": snapshot, "versions": _versions(case)}


# --- documents -------------------------------------------------------------------------------
def case_document_issue(*, case: Case, issue_id=None) -> Issue:
    """The task named by ``documentIssueId`` whose documents a case read may open: the primary
    task (also when ``issue_id`` is None), or a task linked to the case (any role) in the case's
    company. Anything else is a 404 that says no
    more than a missing document would."""
    not_found = NotFound("Document not found.")
    if issue_id is None:
        if case.primary_task is None:
            raise not_found
        return case.primary_task
    try:
        issue = Issue.objects.get(pk=issue_id, company_id=case.company_id)
    except (Issue.DoesNotExist, ValueError, TypeError):
        raise not_found
    linked = issue.pk == case.primary_task_id or CaseIssueLink.objects.filter(case=case, issue=issue).exists()
    if not linked:
        raise not_found
    return issue


# Documents agents may page: not the host's own (``system``), not withheld by an operator.
PAGE_READABLE = {"system": False, "quarantined_at__isnull": True}


def _read_document(*, actor: Actor, case: Case, params: ReadParams) -> dict:
    """``section=document``: a document body, paged over its raw text (UTF-8 bytes).

    ``documentKey`` alone selects the case's own document of that key (``cases.CaseDocument``,
    seed 001's historical case-owned document); adding ``documentIssueId`` selects the current
    document of the primary task or of a task linked to the case. Every page re-checks the
    selection (the task still primary or linked, in the caller's company), skips system and
    quarantined documents, and binds the snapshot to the document id, its latest revision, the
    body length and the body md5."""
    if params.document_issue_id is None:
        owner, issue = "case", None
        document = CaseDocument.objects.filter(case=case, key=params.document_key, **PAGE_READABLE)
        revisions, projection = CaseDocumentRevision, f"casedocument:{params.document_key}"
        task_component = _task_component(case)
    else:
        owner = "task"
        issue = case_document_issue(case=case, issue_id=params.document_issue_id)
        document = Document.objects.filter(issue=issue, key=params.document_key, **PAGE_READABLE)
        revisions, projection = DocumentRevision, f"document:{issue.pk}:{params.document_key}"
        task_component = (_task_component(case) if issue.pk == case.primary_task_id
                          else _h(issue.pk, issue.updated_at.isoformat()))
    document = document.annotate(revision_number=F("latest_revision__number")).first()
    if document is None or document.latest_revision_id is None:
        raise NotFound("Document not found.")
    revision_id = document.latest_revision_id
    window = sql_window(revisions, "body", revision_id, params.offset, params.limit + 1)
    if window is None:
        raise NotFound("Document not found.")
    components = {"p": projection, "c": _h(case.pk, case.updated_at.isoformat()), "t": task_component,
                  "d": _h(document.pk, revision_id, window.total, window.digest)}
    check_snapshot(params.snapshot, components)
    _check_offset(params.offset, window.total)
    page = _page(window.data, params.offset, params.limit, window.total)
    doc = {"owner": owner, "caseId": str(case.pk), "issueId": str(issue.pk) if issue else None,
           "issueIdentifier": issue.identifier if issue else None, "key": document.key,
           "title": document.title, "format": document.format, "documentId": str(document.pk),
           "revisionId": str(revision_id), "revisionNumber": document.revision_number}
    return {"mode": "text", "projection": "document", "case": None, "document": doc, "readPage": page,
            "snapshot": _encode_snapshot(components), "versions": _versions(case, document)}


# --- workflow prompts ------------------------------------------------------------------------
def read_workflow_prompt(*, actor: Actor, pk, offset: int = 0, limit: int | None = None,
                         fingerprint: str | None = None) -> dict:
    """A page of a workflow definition's prompt, pinned to its content fingerprint.

    Every page re-runs the company/``enable_cases`` check. A continuation (``offset > 0``)
    must carry the first page's fingerprint; any edit since (even one of the same length)
    moves the fingerprint and answers 409 ``read_snapshot_stale``."""
    params = read_params(offset_bytes=offset, limit_bytes=limit, snapshot=fingerprint or None,
                         snapshot_field="fingerprint")
    definition = scoped_get(WorkflowDefinition.objects.select_related("company").defer("prompt"), actor, pk,
                            "Workflow definition")
    if not definition.company.enable_cases:
        raise NotFound("Workflow definition not found.")
    current = definition.fingerprint
    if fingerprint and fingerprint != current:
        raise Conflict("The workflow definition changed since the first page; restart at offsetBytes=0 without "
                       "a fingerprint.", code=STALE_CODE,
                       details={"changed": ["workflow"], "restartOffsetBytes": 0})
    window = sql_window(WorkflowDefinition, "prompt", definition.pk, params.offset, params.limit + 1,
                        guard={"fingerprint": current})
    if window is None:
        raise Conflict("The workflow definition changed while this page was being read; restart at "
                       "offsetBytes=0 without a fingerprint.", code=STALE_CODE,
                       details={"changed": ["workflow"], "restartOffsetBytes": 0})
    _check_offset(params.offset, window.total)
    page = _page(window.data, params.offset, params.limit, window.total)
    return {"id": str(definition.pk), "companyId": str(definition.company_id), "name": definition.name,
            "fingerprint": current, "readPage": page}
