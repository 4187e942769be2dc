"""The Celery app and its one task. Thin on purpose: the task calls ``enrich.propose`` for a
batch of document ids; state lives in the index (per-document status), not in a result
backend, and the task is idempotent (already proposed documents are not sent again).

Run workers with ``celery -A pipeline.worker worker`` (settings from ``SIRA_*``), or let
``sira reindex --workers N`` start local ones.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from celery import Celery, signals
from celery.utils.log import get_task_logger

from pipeline import enrich, local
from pipeline.config import Settings
from pipeline.engine import Engine, resent_line, transient_errors
from pipeline.jobs import PROPOSE_TASK
from pipeline.llm import ModelClient

log = get_task_logger(__name__)


def broker_url(settings: Settings) -> str:
    return settings.worker.broker_url or "filesystem://"


def broker_folder(settings: Settings) -> Path:
    return Path(settings.state_dir) / "broker"


def prepare_broker(settings: Settings) -> None:
    """The embedded broker's folders, made when a job or a worker starts (importing this
    module writes nothing)."""
    if not settings.worker.broker_url:
        for sub in ("queue", "processed", "control"):
            (broker_folder(settings) / sub).mkdir(parents=True, exist_ok=True)


def make_app(settings: Settings) -> Celery:
    app = Celery("sira", broker=broker_url(settings))
    transport: dict = {"visibility_timeout": settings.worker.visibility_timeout}
    if not settings.worker.broker_url:
        folder = broker_folder(settings)
        transport |= {"data_folder_in": str(folder / "queue"),
                      "data_folder_out": str(folder / "queue"),
                      "processed_folder": str(folder / "processed"), "store_processed": False,
                      # exchange tables; kombu's default is ./control, in the caller's folder
                      "control_folder": str(folder / "control")}
    app.conf.update(
        task_acks_late=True,  # a worker killed mid-batch leaves the message to be redelivered
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,  # long model-bound tasks: take one at a time
        task_soft_time_limit=settings.worker.soft_time_limit,
        task_time_limit=settings.worker.time_limit,
        task_ignore_result=True,  # task state lives in the index
        task_default_queue=settings.worker.queue,
        task_serializer="json", accept_content=["json"],
        broker_transport_options=transport,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    return app


app = make_app(Settings())


@signals.worker_init.connect
def _on_worker_start(**_: object) -> None:
    from pipeline.local.workers import die_with_parent

    prepare_broker(Settings())
    die_with_parent()


@cache
def _resources() -> tuple[Settings, Engine, ModelClient]:
    settings = Settings()
    return settings, local.connect(settings), ModelClient(settings.llm)


@app.task(name=PROPOSE_TASK, bind=True, autoretry_for=transient_errors(),
          retry_backoff=True, retry_backoff_max=120, retry_jitter=True, max_retries=8)
def propose_task(self, index: str, ids: list[str], job: str | None = None) -> dict:
    settings, engine, client = _resources()
    settings = settings.model_copy(update={
        "index": settings.index.model_copy(update={"name": index})})
    before = engine.resent.copy()
    summary = enrich.propose(engine, settings, client, ids=ids, job=job)
    resent = engine.resent - before
    if resent:  # the engine's pressure, in the worker's log: nothing was lost by it
        log.warning("%d documents of %s: engine requests sent again when it was busy or "
                    "slow: %s", len(ids), index, resent_line(resent))
    return {"proposed": summary.proposed, "failed": summary.failed,
            "unchanged": summary.unchanged, "model_calls": summary.model_calls,
            "resent": dict(resent)}
