from issues.actors import Actor
from issues.models import ActivityLog


def activity_record(*, actor: Actor, company_id, action: str, entity_type: str, entity_id, details=None, run=None):
    """Append one audit row; call inside the transaction of the change it describes."""
    fields = actor.activity_fields()
    if run is not None:
        fields["run"] = run
    return ActivityLog.objects.create(
        company_id=company_id,
        action=action,
        entity_type=entity_type,
        entity_id=str(entity_id),
        details=details or {},
        **fields,
    )
