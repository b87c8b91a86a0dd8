"""The runner's two conversations with the host, each on its own thread and HTTP client.

:class:`Sender` drains the outbox oldest first in batches within the negotiated limits, sending
the stored bytes; every answer's ``ackedSourceSeq`` goes through ``Outbox.ack`` (a backwards or
too-far ACK is rejected there and the batch is simply sent again after a backoff). Connection
errors, 5xx and 429 are retried forever with capped exponential backoff while the outbox keeps
buffering. ``run_not_live`` once the runner's terminal exists means the host ended the run with
it: the sender then offers only the events up to the terminal, and what came after it is left
(the drain counts it). Any other refusal is fatal.

:class:`CommandLane` long-polls ``commands?afterSeq=<last applied>``, applies each command once
and reports results from the outbox until the host has them (200, or a 409/404 saying it holds a
result or no such command: logged). The lane closes on ``run_not_live``; before the runner's
terminal that is the host ending the run on its own, which is fatal.
"""
from __future__ import annotations

import json
import logging
import threading

from .envelope import batch_body
from .transport import Backoff, HostClient, HostRefused, Transient

log = logging.getLogger("prp_runner")


class _Worker(threading.Thread):
    def __init__(self, runner, name: str):
        super().__init__(daemon=True, name=name)
        self.runner, self.outbox = runner, runner.outbox
        self.backoff = Backoff()

    def run(self):
        client = HostClient(self.runner.config.url, self.runner.config.key)
        try:
            self.loop(client)
        except Exception as exc:  # a bug here must end the run visibly, not leave it hanging
            if not self.runner.stopping.is_set():
                log.exception("%s failed", self.name)
                self.runner.fail(f"{self.name}: {exc.__class__.__name__}: {exc}")
        finally:
            client.close()

    def loop(self, client: HostClient):
        raise NotImplementedError


class Sender(_Worker):
    def __init__(self, runner):
        super().__init__(runner, "prp-sender")
        self.offline = False

    def loop(self, client):
        runner, box = self.runner, self.outbox
        while not runner.stopping.is_set():
            through = box.terminal_seq if runner.sender_closed else None
            batch = box.pending(runner.limits["maxBatchEvents"], runner.limits["maxBatchBytes"], through=through)
            if not batch:
                runner.appended.wait(0.5)
                runner.appended.clear()
                continue
            try:
                answer = client.post_events(batch_body(batch))
            except Transient as exc:
                if not self.offline:
                    self.offline = True
                    log.warning("host unreachable (%s): buffering in the outbox, %d pending", exc, box.pending_count)
                self.backoff.wait(runner.stopping)
                continue
            except HostRefused as exc:
                if exc.code == "run_not_live" and box.terminal_seq is not None and not runner.sender_closed:
                    runner.sender_closed = True  # offer the events up to the terminal only
                    continue
                why = "the host ended the run before taking its terminal" if exc.code == "run_not_live" else ""
                runner.fail(f"events refused: {exc} {exc.details} {why}".strip())
                return
            if self.offline:
                self.offline = False
                log.info("host reachable again: %d pending", box.pending_count)
            if box.ack(answer.get("ackedSourceSeq")) and box.acked_seq >= _seq_of_first(batch):
                self.backoff.reset()
            else:
                self.backoff.wait(runner.stopping)  # no progress: do not hammer the host
            runner.changed.set()
            runner.events.report_drops()


def _seq_of_first(batch: list[bytes]) -> int:
    """The sourceSeq of the batch's first envelope: the batch made progress once it is acknowledged."""
    return json.loads(batch[0])["sourceSeq"]


class CommandLane(_Worker):
    def __init__(self, runner, applier):
        super().__init__(runner, "prp-commands")
        self.applier = applier

    def loop(self, client):
        runner, box = self.runner, self.outbox
        while not runner.stopping.is_set():
            self.report(client)
            try:
                answer = client.commands(box.applied_controller_seq, runner.config.poll_wait)
            except Transient as exc:
                log.debug("command lane: %s", exc)
                self.backoff.wait(runner.stopping)
                continue
            except HostRefused as exc:
                if exc.code != "run_not_live" or box.terminal_seq is None:
                    runner.fail(f"command lane refused: {exc} {exc.details}")
                self.report(client)  # results are taken after the end (within the host's grace)
                return
            self.backoff.reset()
            for command in answer.get("commands") or []:
                seq = command.get("controllerSeq")
                if isinstance(seq, int) and seq > box.applied_controller_seq + 1:
                    # commands carry a contiguous controllerSeq (SOURCES.md): never apply past a gap
                    log.warning("command #%s offered after #%s: a gap; polling again from #%s", seq,
                                box.applied_controller_seq, box.applied_controller_seq)
                    self.backoff.wait(runner.stopping)
                    break
                result, stored = self.applier.apply(command)
                if not stored:
                    self.post(client, command["commandId"], result)
                runner.after_command()

    def report(self, client):
        """Post every stored result the host does not have yet, oldest first."""
        for command_id, body in self.outbox.unreported_results():
            if self.post(client, command_id, body):
                self.outbox.mark_reported(command_id)
                self.runner.changed.set()

    def post(self, client, command_id: str, body: dict) -> bool:
        while not self.runner.stopping.is_set():
            try:
                client.post_result(command_id, body)
                self.backoff.reset()
                return True
            except Transient:
                self.backoff.wait(self.runner.stopping)
            except HostRefused as exc:  # it holds another result, or it will take none: nothing to retry
                log.warning("result of command %s not taken: %s", command_id, exc)
                return True
        return False
