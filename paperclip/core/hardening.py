"""Process hardening applied once, when a process loads the project (``paperclip/__init__.py``: the
web server and gunicorn's master, ``manage.py`` commands and the in-process worker, Celery).

Agent processes and workspace hooks run as the server's own user, so without this they could read
``/proc/<server pid>/environ`` (SECRET_KEY, DATABASE_URL, provider tokens) and the server's memory.
``prctl(PR_SET_DUMPABLE, 0)`` makes the server's ``/proc/<pid>`` entries root's and refuses ptrace
to anyone without CAP_SYS_PTRACE; a child gets its own flag back when it execs, so agents still read
their own ``/proc/self``. It only holds while the server does not run as root (root reads anyway).
A no-op off Linux or where prctl is unavailable.
"""
from __future__ import annotations

import ctypes
import sys

PR_GET_DUMPABLE, PR_SET_DUMPABLE = 3, 4


def _prctl():
    if not sys.platform.startswith("linux"):
        return None
    try:
        # The process's own symbols include libc's (find_library would run ldconfig at every start).
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def deny_environ_readers() -> bool:
    """Make this process non-dumpable; True when it is (False where that is not possible)."""
    prctl = _prctl()
    if prctl is None:
        return False
    prctl.restype = ctypes.c_int
    if prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        return False
    return prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 0


def dumpable() -> int | None:
    """This process's dumpable flag (None off Linux)."""
    prctl = _prctl()
    return None if prctl is None else prctl(PR_GET_DUMPABLE, 0, 0, 0, 0)
