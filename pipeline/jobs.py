"""Bulk indexing orchestration: documents from a loader, written to the engine in batches,
every skipped input and every rejected item counted and reported."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline import enrich, worker
from pipeline.config import Settings
from pipeline.engine import BulkResult, Engine
from pipeline.loaders import CorpusError, Document, LoadReport, iter_corpus

if TYPE_CHECKING:
    from celery import Celery

@dataclass
class IndexSummary:
    load: LoadReport = field(default_factory=LoadReport)
    bulk: BulkResult = field(default_factory=BulkResult)

    @property
    def indexed(self) -> int:
        return self.bulk.ok

    def line(self) -> str:
        return (f"loaded {self.load.loaded}, indexed {self.bulk.ok}, "
                f"skipped {self.load.skipped} bad input(s), rejected {self.bulk.failed} by engine")


def _counting(docs: Iterable[Document], on_doc: Callable[[], None] | None) -> Iterator[dict]:
    for doc in docs:
        if on_doc:
            on_doc()
        yield doc.to_index()


def index_corpus(
    engine: Engine,
    settings: Settings,
    path: Path,
    *,
    recreate: bool = False,
    on_doc: Callable[[], None] | None = None,
) -> IndexSummary:
    """Create the index (if needed) from mappings/ and load ``path`` into it."""
    summary = IndexSummary()
    engine.create_index(settings.index, recreate=recreate)
    docs = iter_corpus(path, summary.load, settings.load.max_doc_bytes)
    summary.bulk = engine.bulk_index(
        settings.index.name, _counting(docs, on_doc), chunk_size=settings.load.bulk_batch_docs
    )
    engine.refresh(settings.index.name)
    return summary


# -- the (re)index job ---------------------------------------------------------------------

QUEUED = "queued"


class JobFailed(RuntimeError):
    """The job could not complete; the message says what is missing."""


@dataclass
class JobSummary:
    job: str
    documents: int = 0
    new: int = 0
    changed: int = 0
    unchanged: int = 0
    skipped_input: int = 0
    sent: int = 0  # documents queued for the model in this job
    proposed: int = 0
    enriched: int = 0
    failed: int = 0
    failure_reasons: list[tuple[str, int]] = field(default_factory=list)
    model_calls: int = 0
    model_s: float = 0.0  # time batches waited for the model, summed over all workers
    requeued: int = 0
    wall_s: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase
    load: LoadReport = field(default_factory=LoadReport)
    rejected: list = field(default_factory=list)
    merged: dict[str, int] | None = None  # segments and deleted copies after a force merge

    def line(self) -> str:
        reasons = "; ".join(f"{r} ({n})" for r, n in self.failure_reasons) or "none"
        return (f"job {self.job}: {self.documents} documents ({self.new} new, {self.changed} "
                f"changed, {self.unchanged} unchanged, {self.skipped_input} bad inputs "
                f"skipped); {self.sent} sent to the model: {self.proposed} proposed, "
                f"{self.failed} failed (top reasons: {reasons}); {self.enriched} enriched; "
                f"{self.model_calls} model calls; {self.wall_s:.1f}s ("
                + ", ".join(f"{k} {v:.1f}s" for k, v in self.phases.items()) + ")"
                + (f"; {merge_line(self.merged)}" if self.merged else ""))


def merge_line(merged: dict[str, int]) -> str:
    return (f"force-merged into {merged['segments']} segment(s), "
            f"{merged['deleted_docs']} deleted copies left")


def source_documents(engine: Engine, source: str, report: LoadReport,
                     settings: Settings) -> Iterator[Document]:
    """Documents from a path (the loaders) or, if no such path exists, from an index."""
    path = Path(source)
    if path.exists():
        yield from iter_corpus(path, report, settings.load.max_doc_bytes)
        return
    if not engine.index_exists(source):
        raise CorpusError(f"{source}: neither a file or folder nor an index")
    for hit in engine.scan(source, source=["title", "text", "meta"]):
        body = hit["_source"]
        doc = Document(hit["_id"], str(body.get("title") or ""), str(body.get("text") or ""),
                       body.get("meta") or {}, f"{source}/{hit['_id']}")
        if not doc.title.strip() and not doc.text.strip():
            report.skip(source, None, doc.id, "empty document (no title and no text)")
            continue
        report.loaded += 1
        yield doc


def copy_documents(engine: Engine, settings: Settings, docs: Iterable[Document],
                   summary: JobSummary, batch: int = 500) -> None:
    """Write new and changed documents (by content hash), already queued for this job; leave
    unchanged ones, with their proposals and enrichment, alone."""
    index = settings.index.name
    it = iter(docs)
    while chunk := [d for _, d in zip(range(batch), it, strict=False)]:
        stored = engine.mget(index, [d.id for d in chunk], source=["sira.content_hash"])
        fresh = []
        for doc in chunk:
            old = stored.get(doc.id)
            if old is None:
                summary.new += 1
            elif old.get("sira", {}).get("content_hash") != doc.content_hash:
                summary.changed += 1
            else:
                summary.unchanged += 1
                continue
            body = doc.to_index()
            body["sira"] |= {"status": QUEUED, "job": summary.job}
            fresh.append(body)
        result = engine.bulk_index(index, fresh)
        summary.rejected += result.failures
        summary.documents += len(chunk)


def documents_to_send(engine: Engine, settings: Settings, prompt_version: str
                      ) -> list[tuple[str, str | None]]:
    """(id, job) of pending, changed, or failed-and-retryable documents (not yet at max
    attempts)."""
    out = []
    for hit in engine.scan(settings.index.name, source=["sira"]):
        sira = hit["_source"].get("sira", {})
        if sira.get("status") == "failed" and \
                int(sira.get("attempts") or 0) >= settings.worker.max_doc_attempts:
            continue
        if enrich.needs_proposals(hit["_source"], prompt_version):
            out.append((hit["_id"], sira.get("job")))
    return out


def status_counts(engine: Engine, index: str, job: str | None = None) -> Counter[str]:
    query = {"term": {"sira.job": job}} if job else None
    aggs = engine.aggregate(index, {"s": {"terms": {"field": "sira.status", "size": 20}}},
                            query=query)
    return Counter({b["key"]: b["doc_count"] for b in aggs["s"]["buckets"]})


def _enqueue(app: Celery, index: str, ids: list[str], job: str, batch: int) -> None:
    for start in range(0, len(ids), batch):
        app.send_task(worker.PROPOSE, args=[index, ids[start:start + batch], job])


def reindex(
    engine: Engine,
    settings: Settings,
    source: str | None,
    *,
    app: Celery | None = None,
    on_progress: Callable[[int, int], None] | None = None,
    poll: float = 1.0,
    timeout: float | None = None,
    force_merge: bool = False,
) -> JobSummary:
    """Copy ``source`` into the target index (created from mappings/ if missing; only new
    and changed documents are written), queue every document that needs proposals, wait for
    the workers, then apply the DF filter. Re-running it resumes where it stopped.
    ``force_merge``: end by merging the index into one segment without deleted copies."""
    started = time.monotonic()
    job = uuid.uuid4().hex[:12]
    summary = JobSummary(job)

    clock = [started]

    def phase(name: str) -> None:
        now = time.monotonic()
        summary.phases[name] = now - clock[0]
        clock[0] = now

    index = settings.index.name
    app = app or worker.make_app(settings)
    engine.create_index(settings.index)
    if source:
        copy_documents(engine, settings, source_documents(engine, source, summary.load,
                                                          settings), summary)
        summary.skipped_input = summary.load.skipped
    else:
        summary.documents = engine.count(index)
    engine.refresh(index)
    phase("copy")

    todo = documents_to_send(engine, settings, enrich.prompt_for(settings).version)
    summary.sent = len(todo)
    if todo:
        # documents copied now are queued for this job already; older ones are marked
        stale = [i for i, job_of in todo if job_of != job]
        mark = engine.bulk_update(index, [(i, {"sira": {"status": QUEUED, "job": job}})
                                          for i in stale])
        summary.rejected += mark.failures
        engine.refresh(index)
        todo = [i for i, _ in todo]
        _enqueue(app, index, todo, job, settings.enrich.batch_docs)
        phase("queue")
        _wait(engine, settings, app, job, len(todo), summary, on_progress, poll, timeout)
        phase("propose")

    counts = status_counts(engine, index, job)
    summary.proposed = counts["proposed"]
    summary.failed = counts["failed"]
    if counts[QUEUED]:
        raise JobFailed(f"{counts[QUEUED]} documents are still queued: not applying")
    sums = engine.aggregate(index, {"c": {"sum": {"field": "sira.calls"}},
                                    "m": {"sum": {"field": "sira.model_ms"}}},
                            query={"term": {"sira.job": job}})
    summary.model_calls = int(sums["c"]["value"] or 0)
    summary.model_s = float(sums["m"]["value"] or 0) / 1000
    reasons = engine.aggregate(index, {"r": {"terms": {"field": "sira.reason", "size": 5}}},
                               query={"bool": {"filter": [{"term": {"sira.job": job}},
                                                          {"term": {"sira.status": "failed"}}]}})
    summary.failure_reasons = [(b["key"][:160], b["doc_count"]) for b in reasons["r"]["buckets"]]
    applied = enrich.apply(engine, settings)
    summary.enriched = applied.enriched
    summary.rejected += applied.rejected
    phase("apply")
    if force_merge:
        summary.merged = engine.force_merge(index)
        phase("merge")
    summary.wall_s = time.monotonic() - started
    return summary


def _wait(engine: Engine, settings: Settings, app: Celery, job: str, total: int,
          summary: JobSummary, on_progress: Callable[[int, int], None] | None, poll: float,
          timeout: float | None) -> None:
    """Until no document of this job is queued. Documents queued with no progress for
    ``requeue_after`` seconds (a lost message, a broker restart) are queued again: tasks are
    idempotent, so a late duplicate costs no model call."""
    index = settings.index.name
    deadline = None if timeout is None else time.monotonic() + timeout
    last_left, last_change = total, time.monotonic()
    broker_down_since: float | None = None
    while True:
        engine.refresh(index)
        left = status_counts(engine, index, job)[QUEUED]
        if on_progress:
            on_progress(total - left, total)
        if left == 0:
            return
        now = time.monotonic()
        if left != last_left:
            last_left, last_change = left, now
        elif now - last_change > settings.worker.requeue_after:
            stalled = [h["_id"] for h in engine.scan(index, {"bool": {"filter": [
                {"term": {"sira.job": job}}, {"term": {"sira.status": QUEUED}}]}}, source=False)]
            try:
                _enqueue(app, index, stalled, job, settings.enrich.batch_docs)
                summary.requeued += len(stalled)
                broker_down_since = None
            except Exception as exc:  # the broker is unreachable: wait for it, not forever
                broker_down_since = broker_down_since or now
                if now - broker_down_since > 3 * settings.worker.requeue_after:
                    raise JobFailed(f"{left} documents still queued and the broker cannot be "
                                    f"reached to queue them again: {exc}") from exc
            last_change = now
        if deadline is not None and now > deadline:
            raise JobFailed(f"timed out with {left} of {total} documents still queued")
        time.sleep(poll)
