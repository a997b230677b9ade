"""The scheduler: N reference workers and N test workers, long-lived, restarted after a crash.

Each task (entry, dtype, phase) goes to a reference worker, which saves eager's records to a
file, then to a test worker, which runs relay and compares. A test worker that dies (SIGSEGV,
SIGABRT, ...) records the task as a crash, one that passes the per-task timeout is killed
and records a timeout; either way a fresh worker takes its place and the sweep goes on.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import signal
import sys
import time
from multiprocessing.connection import wait

from . import worker

STARTUP_TIMEOUT = 600.0


class WorkerStartError(RuntimeError):
    """A worker process that never became ready: its end, and its log's last lines."""


class Worker:
    def __init__(self, context, role: str, config: worker.Config, log_path: str):
        self.context, self.role, self.config, self.log_path = context, role, config, log_path
        self.info: dict | None = None
        self.start()

    def start(self) -> None:
        with open(self.log_path, "a") as stream:
            stream.write(f"--- {self.role} worker starting\n")
        parent, child = self.context.Pipe()
        self.process = self.context.Process(
            target=worker.main, args=(child, self.role, self.config, self.log_path), daemon=True
        )
        self.process.start()
        child.close()
        self.conn = parent
        self.ready = False
        self.task = None
        self.path = None
        self.progress = None
        self.deadline = time.monotonic() + STARTUP_TIMEOUT

    @property
    def idle(self) -> bool:
        return self.ready and self.task is None

    def assign(self, message: tuple, task, path: str, timeout: float) -> None:
        self.task, self.path, self.progress = task, path, None
        self.deadline = time.monotonic() + timeout
        self.conn.send(message)

    def death(self) -> str:
        """Wait for the dead process and describe how it ended, with its last log line."""
        self.process.join(5)
        code = self.process.exitcode
        negative = code is not None and code < 0
        how = signal.Signals(-code).name if negative else f"exit status {code}"
        return f"{how}; {self.log_tail()}".rstrip("; ")

    def log_tail(self) -> str:
        try:
            with open(self.log_path, errors="replace") as stream:
                lines = [line.strip() for line in stream if line.strip()]
        except OSError:
            return ""
        return " | ".join(lines[-2:])[:300]

    def kill(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5)

    def stop(self) -> None:
        try:
            if self.ready:
                self.conn.send(None)
            self.process.join(10)
        except (OSError, EOFError):
            pass
        self.kill()


class Pool:
    def __init__(self, config: worker.Config, jobs: int, timeout: float, tmpdir: str):
        context = multiprocessing.get_context("spawn")
        self.timeout, self.tmpdir = timeout, tmpdir
        self.refs = [
            Worker(context, "ref", config, os.path.join(tmpdir, f"ref-{i}.log"))
            for i in range(jobs)
        ]
        self.tests = [
            Worker(context, "test", config, os.path.join(tmpdir, f"test-{i}.log"))
            for i in range(jobs)
        ]
        self.counter = 0

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc) -> None:
        for w in self.refs + self.tests:
            w.stop()

    def _await_ready(self, w: Worker) -> None:
        while not w.ready:
            if not w.conn.poll(STARTUP_TIMEOUT):
                raise WorkerStartError(f"{w.role} worker did not start: {w.log_tail()}")
            try:
                message = w.conn.recv()
            except EOFError:
                raise WorkerStartError(f"{w.role} worker died at start: {w.death()}") from None
            self._receive(w, message)

    def _receive(self, w: Worker, message) -> tuple | None:
        kind, *rest = message
        if kind == "ready":
            w.ready, w.info, w.deadline = True, rest[0], None
        elif kind == "progress":
            w.progress = rest[0]
        else:
            w.deadline = None
            return rest[0]
        return None

    def list_tasks(self, **filters) -> list:
        w = self.refs[0]
        self._await_ready(w)
        w.assign(("list", filters), "list", "", STARTUP_TIMEOUT)
        while True:
            if not w.conn.poll(STARTUP_TIMEOUT):
                raise RuntimeError(f"listing the OpInfo entries timed out: {w.log_tail()}")
            payload = self._receive(w, w.conn.recv())
            if payload is not None:
                w.task = None
                return [tuple(task) for task in payload]

    def info(self) -> dict:
        for w in self.tests:
            self._await_ready(w)
        return {**self.tests[0].info, "role": None}

    def run(self, tasks: list, on_result) -> None:
        """Run every task; on_result(task, result) as each finishes."""
        pending = collections.deque(tasks)
        staged: collections.deque = collections.deque()
        left = len(tasks)
        while left:
            for w in self.refs:
                if w.idle and pending and len(staged) < 2 * len(self.tests):
                    task = pending.popleft()
                    self.counter += 1
                    path = os.path.join(self.tmpdir, f"task-{self.counter}.pt")
                    w.assign(("ref", task, path), task, path, self.timeout)
            for w in self.tests:
                if w.idle and staged:
                    task, path = staged.popleft()
                    w.assign(("test", task, path), task, path, self.timeout)
            everyone = self.refs + self.tests
            live = [w for w in everyone if not w.ready or w.task is not None]
            for conn in wait([w.conn for w in live], timeout=1.0):
                w = next(w for w in live if w.conn is conn)
                try:
                    payload = self._receive(w, conn.recv())
                except (EOFError, OSError):
                    left -= self._died(w, on_result, w.death())
                    continue
                if payload is None:
                    continue
                task, w.task = w.task, None
                if w.role == "ref" and payload["status"] == "ready":
                    staged.append((task, w.path))
                else:
                    on_result(task, payload)
                    left -= 1
            now = time.monotonic()
            for w in everyone:
                if w.deadline is not None and now > w.deadline and w.process.is_alive():
                    w.kill()
                    if not w.ready:
                        raise WorkerStartError(f"{w.role} worker did not start: {w.log_tail()}")
                    left -= self._died(w, on_result, None)

    def _died(self, w: Worker, on_result, how: str | None) -> int:
        """Record the task a worker was running when it died (how) or timed out (None),
        restart the worker and return how many tasks finished (0 or 1)."""
        task, progress = w.task, w.progress
        if not w.ready:
            raise RuntimeError(f"{w.role} worker died while starting: {how}")
        w.start()
        if task is None:
            print(f"{w.role} worker died while idle ({how}); restarted", file=sys.stderr)
            return 0
        sample = {"sample": progress}
        if w.role == "ref":
            category = "eager-timeout" if how is None else "eager-crash"
            on_result(task, {"status": "skip", "category": category, "detail": how, **sample})
        elif how is None:
            on_result(
                task,
                {
                    "status": "fail",
                    "class": "timeout",
                    "category": "timeout",
                    "detail": f"over {self.timeout:g} s",
                    **sample,
                },
            )
        else:
            on_result(
                task,
                {"status": "fail", "class": "crash", "category": "crash", "detail": how, **sample},
            )
        return 1
