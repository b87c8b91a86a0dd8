"""Process groups a harness started (``start_new_session=True``), ended when the runner ends:
SIGTERM to each group still alive, SIGKILL to what is left 2 s later."""
from __future__ import annotations

import logging
import os
import signal
import threading
import time

log = logging.getLogger("prp_runner")


class ProcessGroups:
    def __init__(self):
        self._lock = threading.Lock()
        self._entries: list[tuple[int, object]] = []  # (process group, Popen)

    def register(self, popen) -> None:
        try:
            group = os.getpgid(popen.pid)
        except ProcessLookupError:
            return  # already gone, and reaped
        if group != os.getpgid(0):  # never the runner's own group
            with self._lock:
                self._entries.append((group, popen))

    def kill_all(self, grace: float = 2.0) -> None:
        with self._lock:
            alive = [(g, p) for g, p in self._entries if _signal(g, signal.SIGTERM)]
        deadline = time.monotonic() + grace
        while alive and time.monotonic() < deadline:
            for _, popen in alive:
                popen.poll()  # reap the leader: a zombie would keep its group "alive"
            alive = [(g, p) for g, p in alive if _signal(g, 0)]
            if alive:
                time.sleep(0.05)  # polling a process group: there is nothing to wait on
        for group, popen in alive:
            log.warning("process group %d still alive %.0f s after SIGTERM: SIGKILL", group, grace)
            _signal(group, signal.SIGKILL)
            popen.poll()


def _signal(group: int, signum: int) -> bool:
    try:
        os.killpg(group, signum)
        return True
    except (ProcessLookupError, PermissionError):
        return False
