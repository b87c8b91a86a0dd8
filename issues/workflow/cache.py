"""The last good version of each workflow document (``WorkflowDocumentCache``).

An invalid version never reaches a run or an agent: the last good version of that source stays in
force (stored, so it survives restarts and is shared by workers), and ``on_invalid`` is called once
per invalid version (``error_hash`` remembers the version reported). With no good version yet the
source counts as absent. The caller decides how to report: the connectors record a CONFIG health
entry, the host an activity row (:mod:`issues.workflow.effective`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.db import IntegrityError, transaction
from django.utils import timezone

from issues.models import WorkflowDocumentCache

from .document import WorkflowDocument, digest, parse_document
from .errors import PolicyInvalid

# on_invalid(project, source, version, exc, kept_version): kept_version is "" when none is good yet
OnInvalid = Callable[..., None]


@dataclass(frozen=True)
class Loaded:
    source: str  # project | repository
    version: str  # SHA-256 of the version in force
    document: WorkflowDocument
    stale: bool  # a newer version is invalid; this is the last good one


def load_cached(*, project, source: str, text: str | None, on_invalid: OnInvalid) -> Loaded | None:
    """One workflow document through the last-good cache. A missing or blank document is absent (and
    forgets its cache, so a later invalid version cannot bring an old one back)."""
    cache = WorkflowDocumentCache.objects.filter(project=project, source=source)
    row = cache.first()  # one read; the stall checks come here often
    if not (text or "").strip():
        if row is not None:
            cache.delete()
        return None
    version = digest(text)
    if row and row.content_hash == version:
        if row.error_hash:  # back to the good version: a later invalid edit is reported again
            cache.update(error_hash="", last_error="")
        return Loaded(source, version, WorkflowDocument(row.front_matter or {}, row.template), stale=False)
    if row is None or row.error_hash != version:
        try:
            document = parse_document(text)
        except PolicyInvalid as exc:
            row, first = _remember_invalid(project=project, source=source, version=version, exc=exc, row=row)
            if first:  # of several workers seeing this version at once, one reports it
                on_invalid(project=project, source=source, version=version, exc=exc,
                           kept_version=row.content_hash if row else "")
            if row is None:
                return None
        else:
            WorkflowDocumentCache.objects.update_or_create(
                project=project, source=source,
                defaults={"company_id": project.company_id, "content_hash": version, "front_matter": document.config,
                          "template": document.template, "loaded_at": timezone.now(), "error_hash": "",
                          "last_error": ""})
            return Loaded(source, version, document, stale=False)
    if row.content_hash:  # this version is invalid: keep the last good one
        return Loaded(source, row.content_hash, WorkflowDocument(row.front_matter or {}, row.template), stale=True)
    return None


def _remember_invalid(*, project, source, version, exc, row):
    """Store ``version`` as the reported invalid one; ``(row, True)`` only for the writer that did."""
    fields = {"error_hash": version, "last_error": str(exc)[:2000]}
    cache = WorkflowDocumentCache.objects.filter(project=project, source=source)
    if row is not None:
        first = cache.exclude(error_hash=version).update(**fields) == 1
        row.error_hash, row.last_error = fields["error_hash"], fields["last_error"]
        return row, first
    try:
        with transaction.atomic():
            row = WorkflowDocumentCache.objects.create(project=project, source=source, company_id=project.company_id,
                                                       content_hash="", loaded_at=timezone.now(), **fields)
        return row, True
    except IntegrityError:  # another worker stored this source meanwhile
        return cache.first(), False
