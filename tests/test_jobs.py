"""The reindex job with a real Redis broker, real Celery worker processes, a real engine and
the tests' HTTP model server."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import STATE_DIR, EngineFarm

from pipeline.bench.stand_in import StandInModel
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
from pipeline.local import servers
from pipeline.local.redis import RedisServer
from pipeline.local.workers import LocalWorkers


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    yield server
    server.stop()


def make_settings(tmp_path: Path, opensearch: Engine, redis: RedisServer, model: StandInModel,
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


def job_in_background(engine: Engine, settings: Settings, source: Path,
                      timeout: float) -> tuple[threading.Thread, dict]:
    """The job in a thread; its summary, or the JobFailed it ended with, lands in the dict."""
    result: dict = {}

    def job() -> None:
        try:
            result["summary"] = reindex(engine, settings, str(source), timeout=timeout)
        except JobFailed as exc:
            result["failed"] = exc

    thread = threading.Thread(target=job)
    thread.start()
    return thread, result


def enriched_docs(engine: Engine, index: str) -> dict[str, dict]:
    return {h["_id"]: h["_source"] for h in engine.scan(
        index, source=["sira"])}


def test_job_enriches_every_document_and_resumes(opensearch: Engine, redis: RedisServer,
                                                 tmp_path: Path) -> None:
    with StandInModel() as model:
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
    with StandInModel(delay=0.3) as model:
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
                assert len(d["sira"]["proposed_terms"]) == len(set(d["sira"]["proposed_terms"]))
            # every request is counted, the killed batches' too (a first request is counted
            # before it is sent, so a kill between the two can only over-count); a worker has
            # at most two batches unstored: one being stored, the next one in flight
            in_hand = 2 * settings.enrich.batch_docs
            assert 0 <= summary.model_calls - model.requests <= in_hand
            twice = [k for k, n in model.calls.items() if n > 1]
            assert len(twice) <= in_hand  # at most the lost batches again
            assert max(model.calls.values()) <= 2
        finally:
            opensearch.delete_index(index)


def test_flaky_model_and_a_poison_document(opensearch: Engine, redis: RedisServer,
                                           tmp_path: Path) -> None:
    faults = {i: "FAULT:500:1" for i in range(0, 300, 10)}
    faults |= {i: "FAULT:slow:1" for i in range(5, 300, 25)}
    faults[7] = "FAULT:garbage"  # the model never answers this one with JSON
    with StandInModel(slow_seconds=1.5) as model:
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
    with StandInModel(delay=0.1) as model:
        settings = make_settings(tmp_path, opensearch, broker, model, requeue_after=4.0)
        corpus = write_corpus(tmp_path / "c.jsonl", 500)
        index = settings.index.name
        try:
            with LocalWorkers(settings, 2):
                thread, result = job_in_background(opensearch, settings, corpus, 240)
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
    with StandInModel() as model:
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


def block_writes(engine: Engine, index: str, blocked: bool) -> None:
    engine.client.indices.put_settings(index=index, body={"index.blocks.write": blocked})


def wait_for(predicate, seconds: float = 60) -> None:  # noqa: ANN001 (a test helper)
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.2)


def proposed_count(engine: Engine, index: str) -> int:
    if not engine.index_exists(index):
        return 0
    engine.refresh(index)
    counts = status_counts(engine, index)
    return counts["proposed"] + counts["enriched"]


def test_an_over_long_id_in_a_job_loses_only_itself(opensearch: Engine, redis: RedisServer,
                                                    tmp_path: Path) -> None:
    with StandInModel() as model:
        settings = make_settings(tmp_path, opensearch, redis, model)
        corpus = write_corpus(tmp_path / "c.jsonl", 300)
        lines = corpus.read_text().splitlines()
        lines[50] = json.dumps({"_id": "x" * 600, "title": "Doc long", "text": "body"})
        corpus.write_text("\n".join(lines) + "\n")
        try:
            summary = run_job(opensearch, settings, corpus, workers=1)
            assert [(f.id, f.where) for f in summary.rejected] == [("x" * 600, f"{corpus}:51")]
            assert "validation" in summary.rejected[0].reason
            assert (summary.sent, summary.proposed, summary.enriched) == (299, 299, 299)
            assert "1 rejected by the engine" in summary.line()
            assert opensearch.count(settings.index.name) == 299
        finally:
            opensearch.delete_index(settings.index.name)


def test_a_write_block_ends_the_job_naming_it(opensearch: Engine, redis: RedisServer,
                                              tmp_path: Path) -> None:
    """Refused writes: the job ends by itself, names the engine's reason, and the model is
    not called again and again for documents that cannot be stored."""
    with StandInModel(delay=0.05) as model:
        settings = make_settings(tmp_path, opensearch, redis, model, requeue_after=3.0)
        corpus = write_corpus(tmp_path / "c.jsonl", 600)
        index = settings.index.name
        try:
            with LocalWorkers(settings, 2):
                thread, result = job_in_background(opensearch, settings, corpus, 300)
                wait_for(lambda: proposed_count(opensearch, index) >= 64)
                block_writes(opensearch, index, True)
                blocked_at = time.monotonic()
                thread.join(120)
                assert not thread.is_alive(), "the job did not end by itself"
                ended_after = time.monotonic() - blocked_at
            assert "summary" not in result, result.get("summary")
            message = str(result["failed"])
            assert "cluster_block_exception" in message and "stay queued" in message
            assert ended_after < 60
            assert model.requests <= 2 * 600
            opensearch.refresh(index)
            counts = status_counts(opensearch, index)
            assert counts["queued"] > 0 and counts["queued"] + counts["proposed"] == 600

            # before a job: it ends at once, with no model call
            before = model.requests
            with pytest.raises(JobFailed, match="cluster_block_exception"):
                reindex(opensearch, settings, str(corpus), timeout=60)
            assert model.requests == before

            # unblocked, the next run sends what was left, once, and counts every request
            block_writes(opensearch, index, False)
            again = run_job(opensearch, settings, corpus)
            assert again.enriched == 600 and again.failed == 0
            assert again.model_calls == model.requests - before == again.sent
        finally:
            with contextlib.suppress(Exception):
                block_writes(opensearch, index, False)
            opensearch.delete_index(index)


def test_two_jobs_on_one_target(opensearch: Engine, redis: RedisServer,
                                tmp_path: Path) -> None:
    """The target missing: both jobs create it (neither crashes). The target present: a
    second job leaves the documents a running job has queued to it, and each job accounts
    for every document it sent."""
    with StandInModel(delay=0.02) as model:
        settings = make_settings(tmp_path, opensearch, redis, model)
        corpus = write_corpus(tmp_path / "c.jsonl", 400)
        index = settings.index.name
        results: dict[str, object] = {}

        def job(name: str) -> None:
            try:
                results[name] = reindex(opensearch, settings, str(corpus), timeout=240)
            except Exception as exc:  # noqa: BLE001 (the test reports it)
                results[name] = exc

        try:
            with LocalWorkers(settings, 2):
                threads = [threading.Thread(target=job, args=(n,)) for n in ("a", "b")]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join(300)
                for summary in results.values():
                    assert isinstance(summary, JobSummary), summary
                    assert summary.proposed + summary.failed + summary.taken_over == summary.sent
                assert opensearch.count(index) == 400
                assert status_counts(opensearch, index) == {"enriched": 400}
                assert model.requests <= 2 * 400

                # present: job a is waiting for its documents when job b starts
                lines = corpus.read_text().splitlines()
                corpus.write_text("\n".join(line.replace("body of", "new body of")
                                            for line in lines) + "\n")
                before = model.requests
                first = threading.Thread(target=job, args=("a",))
                first.start()
                wait_for(lambda: status_counts(opensearch, index)["queued"] >= 200)
                second = reindex(opensearch, settings, None, timeout=240)
                first.join(300)
            a = results["a"]
            assert isinstance(a, JobSummary), a
            assert second.sent == 0 and second.left_to_others > 0
            assert (a.sent, a.proposed, a.taken_over) == (400, 400, 0)
            assert model.requests - before == 400 == a.model_calls
            assert status_counts(opensearch, index) == {"enriched": 400}
        finally:
            opensearch.delete_index(index)


def test_kill_9_of_the_job_takes_its_workers_along(opensearch: Engine, tmp_path: Path) -> None:
    """`kill -9` of `sira reindex --workers N`: its workers must not live on under PID 1,
    consuming the queue. The broker's password never appears in the output."""
    broker = RedisServer(password="supersecret123")
    broker.start()
    with StandInModel(delay=0.2) as model:
        settings = make_settings(tmp_path, opensearch, broker, model)
        corpus = write_corpus(tmp_path / "c.jsonl", 400)
        env = {**os.environ, **settings.to_env()}
        log = tmp_path / "job.log"
        try:
            with open(log, "wb") as out:
                job = subprocess.Popen(
                    [str(Path(os.sys.executable).parent / "sira"), "reindex", "--target",
                     settings.index.name, "--source", str(corpus), "--workers", "2"],
                    env=env, stdout=out, stderr=subprocess.STDOUT)
            wait_for(lambda: proposed_count(opensearch, settings.index.name) >= 32, 90)
            workers = [int(p) for p in subprocess.run(
                ["pgrep", "-P", str(job.pid)], capture_output=True, text=True).stdout.split()]
            assert len(workers) == 2
            pool = [int(p) for w in workers for p in subprocess.run(
                ["pgrep", "-P", str(w)], capture_output=True, text=True).stdout.split()]
            job.kill()
            job.wait()
            wait_for(lambda: not any(servers._alive(p) for p in workers + pool), 60)
            output = log.read_text()
            assert "starting 2 local worker(s) on redis://***@127.0.0.1" in output
            assert "supersecret123" not in output
        finally:
            subprocess.run(["pkill", "-9", "-f", "--", f"-Q {settings.worker.queue}"])
            broker.stop()
            opensearch.delete_index(settings.index.name)


def test_a_worker_logs_what_the_engines_pressure_cost(opensearch: Engine, redis: RedisServer,
                                                      tmp_path: Path) -> None:
    """The engine answers a worker's first write busy: the worker sends it again, nothing is
    lost, and its log says how many requests went again and why."""
    from test_reliability import busy_at_first

    with StandInModel() as model:
        settings = make_settings(tmp_path, opensearch, redis, model)
        corpus = write_corpus(tmp_path / "c.jsonl", 50)
        try:
            with busy_at_first(settings.engine.url, ("/_bulk",)) as url:
                busy = settings.model_copy(update={
                    "engine": settings.engine.model_copy(update={"url": url})})
                with LocalWorkers(busy, 1):  # the workers reach the engine through the proxy
                    summary = reindex(opensearch, settings, str(corpus), timeout=120)
            assert (summary.proposed, summary.failed, summary.enriched) == (50, 0, 50)
            log = (tmp_path / "state" / "workers" / "worker-0.log").read_text()
            assert "engine requests sent again when it was busy or slow: 1 after 429" in log, log
        finally:
            opensearch.delete_index(settings.index.name)


def test_a_job_waiting_on_one_request_still_reads_as_live(opensearch: Engine,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A job's heartbeat goes on while the job waits on one request (a busy engine's request
    goes again for up to SIRA_ENGINE__RETRY_S, longer than JOB_GONE_S), so another job does
    not take its documents for abandoned; the engine refusing the entry ends the job at its
    next check, naming it; the entry goes when the job ends."""
    from pipeline import jobs

    monkeypatch.setattr(jobs, "HEARTBEAT_S", 0.2)
    index = f"test-beat-{uuid.uuid4().hex[:8]}"
    opensearch.create(index, {})
    try:
        with jobs.Heartbeat(opensearch, index, "a") as beat:
            first = opensearch.get_meta(index)[jobs.JOBS_META]["a"]["at"]
            time.sleep(1.5)  # the job blocked: nothing of its own runs
            assert opensearch.get_meta(index)[jobs.JOBS_META]["a"]["at"] > first
            assert jobs.live_jobs(opensearch, index, but="b") == {"a"}
            beat.check()
        assert "a" not in opensearch.get_meta(index).get(jobs.JOBS_META, {})
        with jobs.Heartbeat(opensearch, index, "a") as beat:
            opensearch.delete_index(index)
            time.sleep(1.0)
            with pytest.raises(JobFailed, match="refuses to record the job"):
                beat.check()
    finally:
        if opensearch.index_exists(index):
            opensearch.delete_index(index)


def test_two_jobs_heartbeats_at_once_keep_both(opensearch: Engine, farm: EngineFarm) -> None:
    """Each job's entry sits in one ``_meta`` entry shared by the jobs on an index: two jobs
    beating at once (each its own process and connection) keep both entries."""
    from pipeline import jobs

    index = f"test-beats-{uuid.uuid4().hex[:8]}"
    opensearch.create(index, {})
    beats = {job: jobs.Heartbeat(farm.engine("opensearch"), index, job) for job in "ab"}
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            list(pool.map(lambda beat: [beat._write() for _ in range(8)], beats.values()))
        assert set(opensearch.get_meta(index)[jobs.JOBS_META]) == {"a", "b"}
    finally:
        for beat in beats.values():
            beat.engine.close()
        opensearch.delete_index(index)
