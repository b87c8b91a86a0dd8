"""Company labels (upstream ``/companies/{id}/labels``) and resolving an issue's ``labelIds``."""
from __future__ import annotations

from django.db import IntegrityError, transaction

from issues.actors import Actor
from issues.exceptions import Conflict, NotFound
from issues.models import Company, Label

from .activity import activity_record


def _may_write(actor: Actor, company_id):
    actor.ensure_can_write(company_id)
    if actor.is_agent:
        actor.named_live_run()  # not run-scoped (ref §2.3); a header given must name a live run


def label_create(*, actor: Actor, company: Company, name: str, color: str) -> Label:
    """A new label; its name is unique in the company ignoring case (409 ``label_exists``)."""
    _may_write(actor, company.pk)
    name = name.strip()
    if Label.objects.filter(company=company, name__iexact=name).exists():
        raise Conflict("A label with this name already exists in this company.", code="label_exists",
                       details={"name": [f"'{name}' is taken (names are compared ignoring case)."]})
    try:
        with transaction.atomic():
            label = Label.objects.create(company=company, name=name, color=color)
            activity_record(actor=actor, company_id=company.pk, action="label.created", entity_type="label",
                            entity_id=label.pk, details={"name": label.name, "color": label.color})
    except IntegrityError:
        # A concurrent create won the unique index (lower(name), company).
        raise Conflict("A label with this name already exists in this company.", code="label_exists",
                       details={"name": [f"'{name}' is taken (names are compared ignoring case)."]})
    return label


def label_delete(*, actor: Actor, label: Label) -> Label:
    """Delete the label (issues lose it). Returns the removed label, as upstream answers."""
    _may_write(actor, label.company_id)
    pk = label.pk
    with transaction.atomic():
        activity_record(actor=actor, company_id=label.company_id, action="label.deleted", entity_type="label",
                        entity_id=pk, details={"name": label.name, "color": label.color})
        label.delete()
    label.pk = pk  # the response names what was deleted
    return label


def labels_resolve(company_id, label_ids, field: str = "labelIds") -> list[Label]:
    """The company's labels with these ids (one query); any other id is a 404 naming ``field``."""
    wanted = list(dict.fromkeys(str(pk) for pk in label_ids))
    labels = list(Label.objects.filter(company_id=company_id, pk__in=wanted))
    if len(labels) != len(wanted):
        raise NotFound("Label not found.", details={field: ["Every label must belong to this company."]})
    return labels
