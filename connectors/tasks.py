"""Thin Celery tasks: ids in, services do the work."""
from celery import shared_task


@shared_task(ignore_result=True, acks_late=True)
def process_task_events(instance_id: str, external_task_id: str):
    from connectors.services.inbound import task_events_process

    task_events_process(instance_id=instance_id, external_task_id=external_task_id)


@shared_task(ignore_result=True, acks_late=True)
def process_task_events_many(keys: list):
    """Several tasks' queues (the kicks of a burst share a message)."""
    from connectors.services.inbound import task_queues_process

    task_queues_process(keys)


@shared_task(ignore_result=True, acks_late=True)
def resync_link(link_id: str):
    from connectors.services.interventions import link_resync_now

    link_resync_now(link_id=link_id)


@shared_task(ignore_result=True, acks_late=True)
def poll_instance(instance_id: str):
    from connectors.services.polling import instance_poll

    instance_poll(instance_id=instance_id)


@shared_task(ignore_result=True, acks_late=True)
def reconcile_instance(instance_id: str):
    from connectors.services.polling import instance_reconcile

    instance_reconcile(instance_id=instance_id)


@shared_task(ignore_result=True, acks_late=True)
def check_mapping(instance_id: str, changed: list, user_id: int | None = None, trigger: str = "update"):
    """The state-mapping check after an instance creation or update, off the request thread (provider calls)."""
    from django.contrib.auth import get_user_model

    from connectors.services.mapping_check import check_after_update
    from issues.actors import SYSTEM, Actor

    user = get_user_model().objects.filter(pk=user_id).first() if user_id else None
    check_after_update(actor=Actor(user=user) if user else SYSTEM, instance_id=instance_id, changed=set(changed),
                       trigger=trigger)


@shared_task(ignore_result=True, acks_late=True)
def deliver_outbound(effect_id: int):
    from connectors.services.outbound import effect_deliver

    try:
        effect_deliver(effect_id=effect_id)
    except Exception:  # never lose the worker: the sweep retries what is still pending
        import logging

        logging.getLogger("connectors.outbound").exception("outbound effect %s delivery crashed", effect_id)


@shared_task(ignore_result=True)
def sweep():
    """The beat safety net: due retries, pending events whose kick was lost (restart recovery),
    and due polls / reconciliation ticks."""
    from connectors.services.outbound import effects_due
    from connectors.services.polling import due_instances, events_due, retention_prune

    for instance_id, task_id in events_due():
        process_task_events.delay(str(instance_id), task_id)
    for instance_id, poll, reconcile in due_instances():
        if poll:
            poll_instance.delay(str(instance_id))
        if reconcile:
            reconcile_instance.delay(str(instance_id))
    for effect_id in effects_due():
        deliver_outbound.delay(effect_id)
    retention_prune()


@shared_task(ignore_result=True, acks_late=True)
def restart_recovery():
    """§13.2, queued by a Celery worker when it is ready: one recovery pass per instance (idempotent
    across workers starting together)."""
    from connectors.services.drain import restart_recover

    restart_recover()
