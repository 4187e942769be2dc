"""The reindex job with a real Redis broker, real Celery worker processes, a real engine and
the tests' HTTP model server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import STATE_DIR
from fake_model import FakeModelServer
from redis_server import RedisServer

from pipeline import servers
from pipeline.config import (
    EngineSettings,
    EnrichSettings,
    IndexSettings,
    LLMSettings,
    Settings,
    WorkerSettings,
)
from pipeline.engine import Engine
from pipeline.jobs import JobFailed, JobSummary, index_corpus, reindex, status_counts
from pipeline.localworkers import LocalWorkers


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    yield server
    server.stop()


def make_settings(tmp_path: Path, opensearch: Engine, redis: RedisServer, model: FakeModelServer,
                  read_timeout: float = 20.0, **worker: object) -> Settings:
    record = servers.load_record(STATE_DIR, "test-opensearch")
    return Settings(
        state_dir=tmp_path / "state",
        engine=EngineSettings(kind="opensearch", url=record.url),
        index=IndexSettings(name=f"test-job-{uuid.uuid4().hex[:8]}"),
        llm=LLMSettings(url=model.url, model="test-model", read_timeout=read_timeout,
                        max_attempts=4),
        enrich=EnrichSettings(batch_docs=32, policy="none"),
        worker=WorkerSettings(broker_url=redis.url, queue=f"q-{uuid.uuid4().hex[:6]}",
                              **({"requeue_after": 8.0} | worker)),
    )


def write_corpus(path: Path, n: int, faults: dict[int, str] | None = None) -> Path:
    faults = faults or {}
    with open(path, "w") as fh:
        for i in range(n):
            text = f"body of document {i} {faults.get(i, '')}"
            fh.write(json.dumps({"_id": f"d{i}", "title": f"Doc {i}", "text": text}) + "\n")
    return path


def run_job(engine: Engine, settings: Settings, source: Path | None, workers: int = 2,
            timeout: float = 240) -> JobSummary:
    with LocalWorkers(settings, workers):
        return reindex(engine, settings, str(source) if source else None, timeout=timeout)


def enriched_docs(engine: Engine, index: str) -> dict[str, dict]:
    return {h["_id"]: h["_source"] for h in engine.scan(
        index, source=["sira", "proposed_terms", "enrich_echo", "enrich_bridge"])}


def test_job_enriches_every_document_and_resumes(opensearch: Engine, redis: RedisServer,
                                                 tmp_path: Path) -> None:
    with FakeModelServer() as model:
        settings = make_settings(tmp_path, opensearch, redis, model)
        corpus = write_corpus(tmp_path / "c.jsonl", 2000)
        try:
            summary = run_job(opensearch, settings, corpus)
            assert (summary.documents, summary.new, summary.sent) == (2000, 2000, 2000)
            assert (summary.proposed, summary.failed, summary.enriched) == (2000, 0, 2000)
            assert summary.model_calls == 2000 == sum(model.calls.values())
            docs = enriched_docs(opensearch, settings.index.name)
            assert all(d["sira"]["status"] == "enriched" for d in docs.values())
            assert set(model.calls.values()) == {1}

            # the same job again: nothing to send; a changed and a new document only
            lines = corpus.read_text().splitlines()
            lines[5] = json.dumps({"_id": "d5", "title": "Doc 5", "text": "rewritten"})
            lines.append(json.dumps({"_id": "d2000", "title": "Doc 2000", "text": "new"}))
            corpus.write_text("\n".join(lines) + "\n")
            again = run_job(opensearch, settings, corpus, workers=1)
            assert (again.new, again.changed, again.unchanged) == (1, 1, 1999)
            assert again.sent == 2 and again.model_calls == 2
            assert model.calls["Doc 5"] == 2 and model.calls["Doc 2000"] == 1
            assert again.enriched == 2001
        finally:
            opensearch.delete_index(settings.index.name)


def test_kill_9_of_a_worker_mid_batch(opensearch: Engine, redis: RedisServer,
                                      tmp_path: Path) -> None:
    with FakeModelServer(delay=0.3) as model:
        settings = make_settings(tmp_path, opensearch, redis, model)
        corpus = write_corpus(tmp_path / "c.jsonl", 400)
        index = settings.index.name
        result: dict = {}
        try:
            with LocalWorkers(settings, 2) as pool:
                job = threading.Thread(target=lambda: result.update(
                    summary=reindex(opensearch, settings, str(corpus), timeout=240)))
                job.start()
                victim = None
                deadline = time.monotonic() + 60
                while victim is None and time.monotonic() < deadline:
                    time.sleep(0.2)
                    if not opensearch.index_exists(index):
                        continue
                    opensearch.refresh(index)
                    if status_counts(opensearch, index)["proposed"] >= 64:
                        children = subprocess.run(["pgrep", "-P", str(pool.procs[0].pid)],
                                                  capture_output=True, text=True).stdout.split()
                        victim = int(children[0]) if children else pool.procs[0].pid
                assert victim, "the job made no progress"
                os.kill(victim, signal.SIGKILL)  # a batch of 32 documents is in flight
                job.join(300)
            summary = result["summary"]
            assert summary.proposed == 400 and summary.enriched == 400 and summary.failed == 0
            docs = enriched_docs(opensearch, index)
            assert all(d["sira"]["status"] == "enriched" for d in docs.values())
            for d in docs.values():  # no duplicated proposals
                assert len(d["proposed_terms"]) == len(set(d["proposed_terms"]))
            twice = [k for k, n in model.calls.items() if n > 1]
            assert len(twice) <= settings.enrich.batch_docs  # at most the lost batch again
            assert max(model.calls.values()) <= 2
        finally:
            opensearch.delete_index(index)


def test_flaky_model_and_a_poison_document(opensearch: Engine, redis: RedisServer,
                                           tmp_path: Path) -> None:
    faults = {i: "FAULT:500:1" for i in range(0, 300, 10)}
    faults |= {i: "FAULT:slow:1" for i in range(5, 300, 25)}
    faults[7] = "FAULT:garbage"  # the model never answers this one with JSON
    with FakeModelServer(slow_seconds=1.5) as model:
        settings = make_settings(tmp_path, opensearch, redis, model, read_timeout=1.0)
        corpus = write_corpus(tmp_path / "c.jsonl", 300, faults)
        try:
            summary = run_job(opensearch, settings, corpus)
            assert summary.proposed == 299 and summary.failed == 1
            assert summary.enriched == 299
            assert len(summary.failure_reasons) == 1
            assert "not JSON" in summary.failure_reasons[0][0]
            poison = opensearch.get(settings.index.name, "d7")["sira"]
            assert poison["status"] == "failed" and "stricter retry" in poison["reason"]

            before = dict(model.calls)
            again = run_job(opensearch, settings, corpus, workers=1)
            assert again.sent == 1 and again.failed == 1  # only the poison document
            changed = {k for k in model.calls if model.calls[k] != before.get(k)}
            assert changed == {"Doc 7"}
        finally:
            opensearch.delete_index(settings.index.name)


def test_redis_restart_during_a_job(opensearch: Engine, tmp_path: Path) -> None:
    broker = RedisServer()
    broker.start()
    with FakeModelServer(delay=0.1) as model:
        settings = make_settings(tmp_path, opensearch, broker, model, requeue_after=4.0)
        corpus = write_corpus(tmp_path / "c.jsonl", 500)
        index = settings.index.name
        result: dict = {}
        try:
            with LocalWorkers(settings, 2):
                def job() -> None:
                    try:
                        result["summary"] = reindex(opensearch, settings, str(corpus),
                                                    timeout=240)
                    except JobFailed as exc:
                        result["failed"] = exc

                thread = threading.Thread(target=job)
                thread.start()
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    time.sleep(0.2)
                    if opensearch.index_exists(index):
                        opensearch.refresh(index)
                        if status_counts(opensearch, index)["proposed"] >= 64:
                            break
                broker.stop()  # the queued messages are gone with it (no persistence)
                time.sleep(2)
                broker.start()
                thread.join(300)
            if "failed" in result:  # acceptable only as a loud failure, never a quiet one
                assert "queued" in str(result["failed"])
            else:
                summary = result["summary"]
                assert summary.proposed == 500 and summary.enriched == 500
                assert summary.requeued > 0
                opensearch.refresh(index)
                counts = status_counts(opensearch, index)
                assert counts == {"enriched": 500}
        finally:
            broker.stop()
            opensearch.delete_index(index)


def test_reindex_from_an_existing_index(opensearch: Engine, redis: RedisServer,
                                        tmp_path: Path) -> None:
    with FakeModelServer() as model:
        settings = make_settings(tmp_path, opensearch, redis, model)
        source = settings.model_copy(update={"index": IndexSettings(
            name=settings.index.name + "-src")})
        corpus = write_corpus(tmp_path / "c.jsonl", 40)
        try:
            index_corpus(opensearch, source, corpus)
            with LocalWorkers(settings, 1):
                summary = reindex(opensearch, settings, source.index.name, timeout=120,
                                  force_merge=True)
            assert (summary.documents, summary.new, summary.enriched) == (40, 40, 40)
            # written three times per document, left as one segment with no deleted copies
            assert summary.merged == {"segments": 1, "deleted_docs": 0} and \
                "merge" in summary.phases
            assert opensearch.segments(settings.index.name) == summary.merged
            copied = opensearch.get(settings.index.name, "d7")
            assert copied["title"] == "Doc 7" and copied["text"].startswith("body of document 7")
            assert copied["sira"]["status"] == "enriched"
        finally:
            opensearch.delete_index(settings.index.name)
            opensearch.delete_index(source.index.name)
