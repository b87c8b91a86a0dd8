"""Resolve ids that arrive in request bodies, always inside one company (else 404)."""
from django.core.exceptions import ValidationError

from issues.exceptions import NotFound


def company_object(model, company_id, pk, field: str):
    if pk is None:
        return None
    try:
        return model.objects.get(pk=pk, company_id=company_id)
    except (model.DoesNotExist, ValidationError, ValueError):
        raise NotFound(f"{model._meta.verbose_name.capitalize()} not found.", details={field: [f"No such {model._meta.verbose_name} in this company."]})
