"""Work products of an issue: the pull requests, branches, documents and artifacts its work produced."""
from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import transaction

from issues import events
from issues.actors import SYSTEM, Actor
from issues.choices import WorkProductKind
from issues.exceptions import InvalidInput
from issues.models import Issue, WorkProduct

from .activity import activity_record
from .fences import ensure_may_change

_URL = URLValidator(schemes=("http", "https"))
# API field name -> (model field max length)
LIMITS = {"title": 300, "url": 1000, "externalId": 200, "status": 32}


def _clean(kind: str, title: str, url: str, external_id: str, status: str) -> dict:
    errors: dict[str, list[str]] = {}
    if kind not in WorkProductKind.values:
        errors["kind"] = [f"'{kind}' is not one of {', '.join(WorkProductKind.values)}."]
    values = {"title": (title or "").strip(), "url": (url or "").strip(),
              "externalId": (external_id or "").strip(), "status": (status or "").strip()}
    for name, limit in LIMITS.items():
        if len(values[name]) > limit:
            errors[name] = [f"At most {limit} characters."]
    if values["url"] and "url" not in errors:
        try:
            _URL(values["url"])
        except ValidationError:
            errors["url"] = ["Enter an http(s) URL."]
    if not (values["url"] or values["externalId"]):
        # A work product nobody can find is no use to anyone (the tracker links to it).
        errors.setdefault("url", []).append("Give a url or an externalId.")
    if errors:
        raise InvalidInput(details=errors)
    return values


def work_product_create(*, actor: Actor, issue: Issue, kind: str, title: str = "", url: str = "",
                        external_id: str = "", status: str = "") -> WorkProduct:
    """Record a work product on the issue. Agents need their live run (the checkout run while the
    issue is in progress) and an issue of their own (see .fences), board users a write role.
    Announces ``work_product_created_atomic`` inside the transaction, so subscribers' writes
    (connector artifact links) commit with it."""
    values = _clean(kind, title, url, external_id, status)
    actor.ensure_can_write(issue.company_id)
    with transaction.atomic():
        issue = Issue.objects.select_for_update().get(pk=issue.pk)
        ensure_may_change(actor, issue)
        return _create(actor, issue, kind, values, run=actor.run if actor.is_agent else None)


def work_product_record_for_run(*, run, kind: str, url: str, title: str = "") -> tuple[WorkProduct, bool]:
    """The host records a work product a run reported on its issue (the output contract's
    ``pr_url``): validated like any other, linked to the run, attributed to the system (the host
    writes it, so the agent fences do not apply: the run may have lost its checkout by now), and
    idempotent by URL per issue — a result reported twice, or a PR the agent already posted
    itself, is one work product. Returns (work product, created)."""
    values = _clean(kind, title, url, "", "")
    with transaction.atomic():
        issue = Issue.objects.select_for_update().get(pk=run.issue_id)
        existing = WorkProduct.objects.filter(issue=issue, url=values["url"]).first()
        if existing is not None:
            return existing, False
        return _create(SYSTEM, issue, kind, values, run=run), True


def _create(actor: Actor, issue: Issue, kind: str, values: dict, *, run) -> WorkProduct:
    """Inside the caller's transaction, on the locked issue row."""
    work_product = WorkProduct.objects.create(
        company_id=issue.company_id, issue=issue, kind=kind, title=values["title"], url=values["url"],
        external_id=values["externalId"], status=values["status"], run=run)
    activity_record(actor=actor, company_id=issue.company_id, action="work_product.created", entity_type="issue",
                    entity_id=issue.pk, run=run, details={"workProductId": str(work_product.pk), "kind": kind,
                                                          "url": values["url"], "externalId": values["externalId"]})
    events.work_product_created_atomic.send(sender=None, work_product=work_product, actor=actor)
    return work_product
