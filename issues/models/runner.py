"""The Paperclip Runner Protocol (PRP) state of a run, host side (issues.runner).

A runner drives a run over HTTP: it says hello (the negotiated version and capability snapshot
land on :class:`RunnerSession`), posts events (each stored once as a :class:`RunnerEvent`, the
per-source cursor in :class:`RunnerSource` is the cumulative acknowledgement) and fetches the
host's :class:`RunnerCommand` rows in ``controller_seq`` order.
"""
from django.db import models
from django.db.models import Q

from issues.choices import RunnerCommandStatus

from .base import choices_check
from .company import Company
from .run import HeartbeatRun
from .thread import Interaction


class RunnerSession(models.Model):
    """One per PRP run: negotiation, the command counter and the projections that are not rows
    of their own (proposed result, terminal, session goal, credential namespace)."""

    run = models.OneToOneField(HeartbeatRun, primary_key=True, on_delete=models.CASCADE,
                               related_name="runner_session")
    company = models.ForeignKey(Company, on_delete=models.CASCADE, related_name="+")
    # Negotiation (hello): what the runner offered and what the host selected.
    protocol_min = models.PositiveSmallIntegerField(null=True, blank=True)
    protocol_max = models.PositiveSmallIntegerField(null=True, blank=True)
    protocol_version = models.PositiveSmallIntegerField(null=True, blank=True, help_text="Selected at hello.")
    capabilities = models.JSONField(default=dict, blank=True, help_text="The capability snapshot, as sent.")
    identity = models.JSONField(default=dict, blank=True, help_text="Runner instance, normalized session, driver ids.")
    runner_instance_id = models.CharField(max_length=160, blank=True)
    hello_at = models.DateTimeField(null=True, blank=True)
    refusal = models.JSONField(default=dict, blank=True, help_text="Why the last hello was refused, if it was.")
    # Counters: events committed (their position) and commands issued (controller_seq).
    event_count = models.PositiveBigIntegerField(default=0)
    controller_seq = models.PositiveBigIntegerField(default=0)
    # Projections.
    proposed_result = models.JSONField(null=True, blank=True)
    terminal = models.JSONField(null=True, blank=True)
    terminal_event_id = models.CharField(max_length=160, blank=True)
    decision = models.JSONField(default=dict, blank=True, help_text="What the host decided from the terminal.")
    usage = models.JSONField(default=dict, blank=True, help_text="Last cumulative session usage (never summed).")
    goal = models.JSONField(null=True, blank=True, help_text="v2 session goal snapshot (null: none or cleared).")
    goal_capability = models.JSONField(null=True, blank=True, help_text="v2 sessionGoals capability.")
    credentials = models.JSONField(default=dict, blank=True,
                                   help_text="auth.credentials.updated by provider/binding; never a secret.")
    activity = models.JSONField(default=dict, blank=True, help_text="runtime.activity.recorded counts by namespace/key.")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(protocol_version__isnull=True) | Q(protocol_version__gte=1),
                name="runner_session_version_positive"),
        ]


class RunnerSource(models.Model):
    """The cumulative acknowledgement of one event source (``sourceKind:sourceInstanceId``) of a
    run: every event up to ``acked_seq`` is committed. Locked while a batch is committed."""

    run = models.ForeignKey(HeartbeatRun, on_delete=models.CASCADE, related_name="runner_sources")
    source_key = models.CharField(max_length=200)
    acked_seq = models.PositiveBigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "source_key"], name="runner_source_unique")]


class RunnerEvent(models.Model):
    """One committed PRP event: the envelope exactly as received (unknown optional properties
    kept) and its canonical-JSON digest, against which a redelivery is compared."""

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(HeartbeatRun, on_delete=models.CASCADE, related_name="runner_events")
    position = models.PositiveBigIntegerField(help_text="Commit order within the run, from 1.")
    source_key = models.CharField(max_length=200)
    source_event_id = models.CharField(max_length=160)
    source_seq = models.PositiveBigIntegerField()
    event_type = models.CharField(max_length=80)
    digest = models.CharField(max_length=64)
    envelope = models.JSONField()
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "position"]
        constraints = [
            models.UniqueConstraint(fields=["run", "position"], name="runner_event_position_unique"),
            models.UniqueConstraint(fields=["run", "source_event_id"], name="runner_event_id_unique"),
            models.UniqueConstraint(fields=["run", "source_key", "source_seq"], name="runner_event_seq_unique"),
        ]


class RunnerCommand(models.Model):
    """A host -> runner command, durable before it is offered; ``controller_seq`` is contiguous
    from 1 per run. The runner's result is stored with its digest (a repeat must match)."""

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(HeartbeatRun, on_delete=models.CASCADE, related_name="runner_commands")
    controller_seq = models.PositiveBigIntegerField()
    command_id = models.CharField(max_length=160, unique=True)
    command_type = models.CharField(max_length=80)
    envelope = models.JSONField(help_text="The command document offered to the runner.")
    status = models.CharField(max_length=16, choices=RunnerCommandStatus.choices,
                              default=RunnerCommandStatus.PENDING)
    delivered_at = models.DateTimeField(null=True, blank=True)
    confirm_by = models.DateTimeField(null=True, blank=True,
                                      help_text="A host stop not confirmed by then treats the runner as lost.")
    result = models.JSONField(null=True, blank=True)
    result_digest = models.CharField(max_length=64, blank=True)
    result_at = models.DateTimeField(null=True, blank=True)
    interaction = models.ForeignKey(Interaction, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "controller_seq"]
        constraints = [
            models.UniqueConstraint(fields=["run", "controller_seq"], name="runner_command_seq_unique"),
            models.CheckConstraint(condition=Q(controller_seq__gte=1), name="runner_command_seq_positive"),
            choices_check("status", RunnerCommandStatus, "runner_command_status_valid"),
        ]
        indexes = [models.Index(fields=["status", "confirm_by"], name="runner_command_confirm_idx")]
