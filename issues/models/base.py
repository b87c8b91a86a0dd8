import uuid

from django.db import models


def choices_check(field, choices, name):
    """A CHECK constraint that keeps a TextChoices column inside its enum."""
    return models.CheckConstraint(condition=models.Q(**{f"{field}__in": choices.values}), name=name)


class UUIDModel(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    created_at = models.DateTimeField(auto_now_add=True, db_index=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True
