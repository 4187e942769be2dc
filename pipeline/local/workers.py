"""Local Celery worker processes for `sira reindex --workers N` (the embedded mode and
development); in production workers run anywhere the broker is reachable (Kubernetes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from pipeline.config import Settings

PARENT_ENV = "SIRA_LOCAL_WORKER_PARENT"  # set for the workers this module starts
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In a local worker: ask the kernel for SIGTERM (a warm shutdown: the batch in hand is
    finished and written) when the process that started it dies, even by ``kill -9``;
    without it the workers would live on under PID 1 and keep consuming the queue."""
    parent = os.environ.get(PARENT_ENV)
    if not parent or not sys.platform.startswith("linux"):
        return
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != int(parent):  # it died before the request was made
        os.kill(os.getpid(), signal.SIGTERM)


class LocalWorkers:
    def __init__(self, settings: Settings, count: int, concurrency: int = 1):
        self.settings = settings
        self.count = count
        self.concurrency = concurrency
        self.procs: list[subprocess.Popen] = []
        self.logs = Path(settings.state_dir) / "workers"

    def __enter__(self) -> LocalWorkers:
        self.logs.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.settings.to_env(), PARENT_ENV: str(os.getpid())}
        for i in range(self.count):
            log = open(self.logs / f"worker-{i}.log", "ab")  # noqa: SIM115 (kept by Popen)
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "pipeline.worker", "worker",
                 "--loglevel", "INFO", "--concurrency", str(self.concurrency),
                 "-Q", self.settings.worker.queue, "-n", f"sira-local-{i}-{os.getpid()}@%h",
                 "--without-gossip", "--without-mingle"],
                env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True))
            log.close()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, timeout: float = 30.0) -> None:
        """Warm shutdown (the current task finishes), then kill what is left."""
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
