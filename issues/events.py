"""Domain events the issues app announces; other apps subscribe in AppConfig.ready().

``issues`` never imports ``cases`` or ``connectors``: it sends these signals from services
(on commit, so subscribers never see a rolled-back change).
"""
from django.db import transaction
from django.dispatch import Signal

issue_created = Signal()  # issue, actor
issue_updated = Signal()  # issue, actor, changes
# Sent inside the transaction of the change, after the row is saved: receivers that must hold or
# fall with the change (a case closing with its primary task) act here; an exception rolls back.
issue_updated_atomic = Signal()  # issue, actor, changes
issue_checked_out = Signal()  # issue, actor, run_id
comment_created = Signal()  # comment, actor
# Sent inside the transaction (like issue_updated_atomic): the connectors outbox records its effects here.
comment_created_atomic = Signal()  # comment, actor
issue_checked_out_atomic = Signal()  # issue, actor, run_id
# Facts about a claimed issue that receivers of issue_checked_out_atomic need, answered by the claim
# statement itself (one more RETURNING column each) so a checkout pays no round trip for them:
# name -> SQL boolean over the claimed row, ``{issue}`` standing for the issue table. Registered in
# AppConfig.ready(); the claimed issue carries them as ``claim_facts`` (a receiver asks the database
# itself when a fact is missing). A receiver has work only when its fact holds: on PostgreSQL an
# agent's claim for which no fact holds is one statement that commits on its own, and the signal is
# not sent for it (issues.services.checkout).
CLAIM_FACTS: dict[str, str] = {}
run_finished_atomic = Signal()  # run
# Sent inside the transaction of the write (like comment_created_atomic), for outbound artifact links.
work_product_created_atomic = Signal()  # work_product, actor
document_written_atomic = Signal()  # document, revision, actor
# Sent inside the transaction of a board answer, after the interaction is saved: a PRP runner's
# request becomes its request.resolve command here (issues.runner.requests); an exception rolls back.
interaction_responded_atomic = Signal()  # interaction, actor
run_finished = Signal()  # run
# Sent inside the transaction of an agent purge, before the row goes: an app whose retained history
# names the agent refuses the purge by raising a Conflict (cases: handoffs keep their agents).
agent_purging_atomic = Signal()  # agent
sweep_ticked = Signal()  # now; sent synchronously by the periodic sweep; receivers return a report dict
# The in-process worker (manage.py paperclip_worker) announces its life to the other apps: once at start
# (restart recovery), then on every loop (work the embedded default has no broker for). Receivers return
# a report dict; a failing receiver is logged and never stops the worker.
worker_started = Signal()  # owner
worker_ticked = Signal()  # now


def register_claim_fact(name: str, sql: str):
    CLAIM_FACTS[name] = sql


def announce(signal: Signal, **kwargs):
    transaction.on_commit(lambda: signal.send(sender=None, **kwargs))
