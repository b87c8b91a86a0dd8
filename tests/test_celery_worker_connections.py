"""A real ``celery worker`` (prefork, the default pool) keeps its PostgreSQL connection across tasks
for PAPERCLIP_WORKER_CONN_MAX_AGE seconds, and with 0 opens one per task, as Django does per request.
(Celery's Django fixup used to close it after every task whatever CONN_MAX_AGE said.)

The worker runs ``connectors.tasks.process_task_events`` for tasks that have no events: a claim that
finds nothing, in a transaction, so the task's last statement is its COMMIT. PostgreSQL's
``pg_stat_activity`` shows which backend ran it and since when (the worker's main process keeps a
connection of its own, whose last statement is a read). Needs Redis on 127.0.0.1:6379 (CI starts it)."""
import os
import uuid

import pytest
from django.db import connection

from paperclip.celery import app
from tests.test_celery_topology import Topology, database_url, redis_database, wait_for

pytestmark = [
    pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL backends (SQLite has no server)"),
    # The test process runs its own tasks eagerly; these messages go to the worker's broker on purpose.
    pytest.mark.filterwarnings("ignore::celery.exceptions.AlwaysEagerIgnored"),
]
TASK = "connectors.tasks.process_task_events"


def task_backends() -> list[tuple]:
    """(pid, backend_start) of the idle sessions whose last statement ended a task's transaction."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid, backend_start FROM pg_stat_activity WHERE datname = current_database() "
                       "AND pid <> pg_backend_pid() AND state = 'idle' AND query = 'COMMIT'")
        return cursor.fetchall()


@pytest.fixture
def worker(transactional_db, tmp_path):
    """Starts a prefork worker (one process) on a private Redis database; yields (start, send)."""
    with redis_database() as redis_db:
        broker = f"redis://127.0.0.1:6379/{redis_db}"
        topology = Topology({**os.environ, "DATABASE_URL": database_url(), "CELERY_BROKER_URL": broker,
                             "CELERY_TASK_ALWAYS_EAGER": "false", "LOG_LEVEL": "INFO"}, tmp_path)
        sent = [0]

        def start(max_age: int):
            topology.env["PAPERCLIP_WORKER_CONN_MAX_AGE"] = str(max_age)
            topology.worker("w", pool="prefork", concurrency=1)
            topology.wait_ready("w")

        def send(count: int):
            """Send ``count`` tasks and wait until the worker has run them all."""
            with app.connection_for_write(broker) as conn:
                for _ in range(count):
                    app.send_task(TASK, args=[str(uuid.uuid4()), "no-such-task"], connection=conn)
            sent[0] += count
            wait_for(lambda: succeeded() >= sent[0], timeout=30, what=f"the worker to run {sent[0]} tasks",
                     logs=topology.dump)

        def succeeded() -> int:
            lines = topology.logs["w"].read_bytes().splitlines()
            return sum(1 for line in lines if f"{TASK}[".encode() in line and b" succeeded in " in line)

        try:
            yield start, send
        finally:
            topology.stop_all()


def test_a_worker_keeps_its_connection_across_tasks(worker):
    start, send = worker
    start(60)
    send(3)
    first = wait_for(task_backends, timeout=10, what="the worker's backend to show its last task's end")
    assert len(first) == 1, first
    send(3)
    assert task_backends() == first  # the same backend (pid and start time) ran the second batch


def test_with_no_max_age_a_worker_opens_a_connection_per_task(worker):
    start, send = worker
    start(0)
    send(3)
    # Each task's connection is closed when it ends: no backend is left that ended a task.
    wait_for(lambda: not task_backends(), timeout=10, what="the tasks' connections to close")
