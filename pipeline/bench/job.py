"""The enrichment job timed against plain bulk indexing of the same documents: ``sira
bench-scale``'s job figures and ``scripts/bench_job.py``.

The job runs as a user runs it (``sira reindex`` with local Celery workers on a throw-away
Redis, the real model client over HTTP) against the stand-in model (``stand_in``), which
answers each document with the proposals recorded or generated for it. What is timed is the
pipeline: the time the workers sat waiting for the model (the job's ``model_s``) is taken out.
"""

from __future__ import annotations

import json
import time
import uuid
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from pipeline.bench.stand_in import StandInModel
from pipeline.config import LLMSettings, Settings, WorkerSettings
from pipeline.engine import Engine
from pipeline.jobs import JobSummary, reindex
from pipeline.local.redis import RedisServer
from pipeline.local.workers import LocalWorkers

WORKER_START_S = 3.0  # the workers connect to the broker before the clock starts
JOB_TIMEOUT_S = 6 * 3600.0


@dataclass
class JobRun:
    summary: JobSummary
    wall_s: float
    writes: float  # index operations per document (the engine's count)

    def without_model(self, workers: int) -> float:
        """Seconds less the time the workers sat waiting for the model, spread over them."""
        return self.wall_s - self.summary.model_s / workers

    def phases(self, workers: int) -> dict[str, float]:
        """Seconds per phase of the job (copy, queue, propose, apply), the model waits taken
        out of ``propose`` as out of the whole."""
        phases = dict(self.summary.phases)
        if "propose" in phases:
            phases["propose"] -= self.summary.model_s / workers
        return phases


def phase_ratios(phases: dict[str, float], plain_s: float) -> str:
    """Each phase against plain bulk indexing of the same documents: "copy 1.23x, …"."""
    return ", ".join(f"{name} {seconds / plain_s:.2f}x" for name, seconds in phases.items())


def answers_by_title(corpus: Path, proposals: Path) -> dict[str, list[str]]:
    """What the stand-in answers for each document, keyed as it finds them (the prompt's
    title line): the proposals recorded or generated for that document."""
    terms: dict[str, list[str]] = {}
    with open(proposals, encoding="utf-8") as fh:
        for line in fh:
            record = json.loads(line)
            if record.get("terms"):
                terms[str(record["doc_id"])] = record["terms"]
    answers: dict[str, list[str]] = {}
    with open(corpus, encoding="utf-8") as fh:
        for line in fh:
            doc = json.loads(line)
            title = (doc.get("title") or "").strip().split("\n")[0]
            if title and str(doc["_id"]) in terms:
                answers[title] = terms[str(doc["_id"])]
    return answers


def run_job(engine: Engine, base: Settings, corpus: Path, broker_url: str, model_url: str,
            workers: int, in_flight: int, *, index: str | None = None,
            cache_index: str | None = None) -> JobRun:
    """One job of ``corpus`` into a new index (``index``, else a name of its own), dropped
    afterwards. ``cache_index``: the proposal cache to use and keep (else one of its own,
    dropped, so that no run finds the proposals of the one before)."""
    suffix = uuid.uuid4().hex[:6]
    index = index or f"bench-job-{suffix}"
    cache = cache_index or f"{index}-cache-{suffix}"
    settings = base.model_copy(update={
        "index": base.index.model_copy(update={"name": index}),
        "llm": LLMSettings(url=model_url, model="stand-in", read_timeout=600,
                           concurrency=max(1, in_flight // workers)),
        "worker": WorkerSettings(broker_url=broker_url, queue=f"bench-{suffix}"),
        "enrich": base.enrich.model_copy(update={"cache_index": cache}),
    })
    try:
        with LocalWorkers(settings, workers):
            time.sleep(WORKER_START_S)  # worker start-up is not the job
            started = time.monotonic()
            summary = reindex(engine, settings, str(corpus), timeout=JOB_TIMEOUT_S)
            wall = time.monotonic() - started
        return JobRun(summary, wall, engine.writes(index) / max(summary.documents, 1))
    finally:  # the error to show is the job's
        with suppress(Exception):
            engine.delete_index(index)
        if cache_index is None:
            with suppress(Exception):
                engine.delete_index(cache)


def measure(engine: Engine, settings: Settings, corpus: Path, proposals: Path,
            workers: int) -> dict:
    """The job over ``corpus`` twice, ``workers`` local workers: into a new index with the
    proposal cache empty (every document sent to the stand-in), then again with the cache the
    first filled (a rebuild: no model call). Figures keyed as ``bench-scale`` shows them."""
    index = f"{settings.index.name}-job"
    cache = f"{index}-cache"
    in_flight = workers * settings.llm.concurrency
    with RedisServer() as redis, StandInModel(answers_by_title(corpus, proposals)) as model:
        try:
            empty = run_job(engine, settings, corpus, redis.url, model.url, workers, in_flight,
                            index=index, cache_index=cache)
            calls = model.requests
            filled = run_job(engine, settings, corpus, redis.url, model.url, workers,
                             in_flight, index=index, cache_index=cache)
        finally:
            with suppress(Exception):
                engine.delete_index(cache)
    return {
        "job_workers": workers,
        "job_s": empty.wall_s,
        "job_own_s": empty.without_model(workers),
        "job_enriched": empty.summary.enriched,
        "job_phases": empty.phases(workers),
        "job_cached_phases": filled.phases(workers),
        "job_writes": empty.writes,
        "job_cached_s": filled.wall_s,
        "job_cached_enriched": filled.summary.enriched,
        "job_cached_model_calls": model.requests - calls,
        "job_cached_from_cache": filled.summary.from_cache,
    }
