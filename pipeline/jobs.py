"""Bulk indexing orchestration: documents from a loader, written to the engine in batches,
every skipped input and every rejected item counted and reported."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline import attach, enrich
from pipeline.config import Settings
from pipeline.engine import BulkResult, Engine, ItemFailure, MetaBusy, transient_errors
from pipeline.loaders import CorpusError, Document, LoadReport, iter_corpus, iter_jsonl_objects
from pipeline.profile import Profile
from pipeline.schema import ENRICHED, FAILED, OWN, PROPOSED, QUEUED, SIRA, Layout, sira_of

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


def index_as_is(engine: Engine, settings: Settings, path: Path, fields: list[str], *,
                mapping_file: Path | None = None, on_doc: Callable[[], None] | None = None
                ) -> IndexSummary:
    """JSON Lines into a user-shaped index, every field of every line kept as it is (``_id``,
    if a line has one, is its id), then attached with ``fields``. A new index is created from
    ``mapping_file`` (``{"settings": ..., "mappings": ...}`` or a bare mapping) and attached
    before anything is written, or else with the engine's dynamic mapping and attached after
    the first documents gave it its fields."""
    index = settings.index.name
    summary = IndexSummary()
    prompt_version = enrich.prompt_for(settings).version
    policy = Profile.from_settings(settings.enrich).filter_policy().stored()

    def attach_now() -> None:
        try:
            attach.attach(engine, index, fields, prompt_version=prompt_version, policy=policy)
        except attach.AttachError as exc:
            raise CorpusError(str(exc)) from exc

    if not path.is_file():
        raise CorpusError(f"{path}: no such file (--fields indexes JSON Lines as they are)")
    created = False
    if not engine.index_exists(index):
        body: dict = {}
        if mapping_file:
            try:
                body = json.loads(mapping_file.read_text("utf-8"))
            except (OSError, json.JSONDecodeError) as exc:
                raise CorpusError(f"{mapping_file}: not a readable JSON file ({exc})") from exc
            if not isinstance(body, dict):
                raise CorpusError(f"{mapping_file}: expected a JSON object")
            if "mappings" not in body and "settings" not in body:
                body = {"mappings": body}
        engine.create(index, body)
        created = True
    if not created or mapping_file:
        attach_now()

    def documents() -> Iterator[dict]:
        for lineno, obj in iter_jsonl_objects(path, summary.load):
            doc_id = obj.pop("_id", None)
            summary.load.loaded += 1
            if on_doc:
                on_doc()
            yield {"_id": str(doc_id) if doc_id is not None else None, **obj,
                   "_where": f"{path}:{lineno}"}

    summary.bulk = engine.bulk_index(index, documents(), chunk_size=settings.load.bulk_batch_docs)
    engine.refresh(index)
    if created and not mapping_file:
        attach_now()
    return summary


# -- the (re)index job ---------------------------------------------------------------------

PROPOSE_TASK = "sira.propose"  # the worker's task (pipeline.worker)


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
    model_s: float = 0.0  # time workers waited for the model, idle, summed over them
    requeued: int = 0
    taken_over: int = 0  # sent by this job, then queued again by another one
    left_to_others: int = 0  # queued by another running job: left to it
    from_cache: int = 0  # given the proposals the cache holds for their text, not queued
    wall_s: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase
    load: LoadReport = field(default_factory=LoadReport)
    rejected: list[ItemFailure] = field(default_factory=list)
    merged: dict[str, int] | None = None  # segments and deleted copies after a force merge

    def line(self) -> str:
        reasons = "; ".join(f"{r} ({n})" for r, n in self.failure_reasons) or "none"
        return (f"job {self.job}: {self.documents} documents ({self.new} new, {self.changed} "
                f"changed, {self.unchanged} unchanged, {self.skipped_input} bad inputs "
                f"skipped); {self.from_cache} from the proposal cache, {self.sent} sent to "
                f"the model: {self.proposed} proposed, "
                f"{self.failed} failed (top reasons: {reasons})"
                + (f", {self.taken_over} taken over by another job" if self.taken_over else "")
                + (f"; {self.left_to_others} left to another running job"
                   if self.left_to_others else "")
                + f"; {len(self.rejected)} rejected by the engine; {self.enriched} enriched; "
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
                   summary: JobSummary, batch: int = 500,
                   beat: Callable[[], None] | None = None) -> None:
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
            elif sira_of(old).get("content_hash") != doc.content_hash:
                summary.changed += 1
            else:
                summary.unchanged += 1
                continue
            body = doc.to_index()
            body["sira"] |= {"status": QUEUED, "job": summary.job}
            fresh.append(body)
        _with_cached_proposals(engine, settings, fresh, OWN, summary)
        result = engine.bulk_index(index, fresh)
        summary.rejected += result.failures
        summary.documents += len(chunk)
        if beat:
            beat()


def _with_cached_proposals(engine: Engine, settings: Settings, docs: list[dict],
                           layout: Layout, summary: JobSummary) -> None:
    """Put the proposals the cache holds for these documents' texts into the documents
    before they are written: a copy then costs one write and no queueing for them."""
    cached = enrich.cached_fields(engine, settings, {d["_id"]: d for d in docs},
                                  layout=layout, job=summary.job)
    for doc in docs:
        if doc["_id"] in cached:
            doc["sira"] = {**sira_of(doc), **cached[doc["_id"]]["sira"]}
    summary.from_cache += len(cached)


def copy_whole(engine: Engine, settings: Settings, source: str, summary: JobSummary,
               batch: int = 500, beat: Callable[[], None] | None = None) -> None:
    """Copy every document of a user's index as it is, every field (and sira's object, when
    the source was attached: proposals made for the same text are kept); a document already
    in the target with the same fields is left alone (a resumed copy)."""
    target = settings.index.name
    layout = Layout.of(engine.get_meta(target))
    it = engine.scan(source)
    while chunk := [h for _, h in zip(range(batch), it, strict=False)]:
        stored = engine.mget(target, [h["_id"] for h in chunk])
        fresh = []
        for hit in chunk:
            old = stored.get(hit["_id"])
            mine = {k: v for k, v in hit["_source"].items() if k != SIRA}
            if old is None:
                summary.new += 1
            elif {k: v for k, v in old.items() if k != SIRA} != mine:
                summary.changed += 1
            else:
                summary.unchanged += 1
                continue
            fresh.append({"_id": hit["_id"], **hit["_source"]})
        _with_cached_proposals(engine, settings, fresh, layout, summary)
        result = engine.bulk_index(target, fresh)
        summary.rejected += result.failures
        summary.documents += len(chunk)
        summary.load.loaded += len(chunk)
        if beat:
            beat()


def documents_to_send(engine: Engine, settings: Settings, prompt_version: str,
                      live_jobs: set[str] = frozenset()
                      ) -> tuple[list[tuple[str, str | None]], int]:
    """(id, job) of pending, changed, or failed-and-retryable documents (not yet at max
    attempts), and how many are left alone because another running job has them queued."""
    out, left = [], 0
    layout = Layout.of(engine.get_meta(settings.index.name))
    for hit in engine.scan(settings.index.name, source=layout.read()):
        sira = sira_of(hit["_source"])
        if sira.get("status") == FAILED and \
                int(sira.get("attempts") or 0) >= settings.worker.max_doc_attempts:
            continue
        if sira.get("status") == QUEUED and sira.get("job") in live_jobs:
            left += 1
            continue
        if enrich.needs_proposals(hit["_source"], prompt_version, layout):
            out.append((hit["_id"], sira.get("job")))
    return out, left


# -- running jobs, seen by each other through the index's _meta ------------------------------

JOBS_META = "sira_jobs"
HEARTBEAT_S = 15.0  # a running job writes its heartbeat this often
JOB_GONE_S = 120.0  # and counts as gone when it has not for this long
PROBE_S = 10.0  # how often a waiting job checks that the engine still takes writes


def live_jobs(engine: Engine, index: str, *, but: str) -> set[str]:
    beats = engine.get_meta(index).get(JOBS_META) or {}
    now = time.time()
    return {job for job, beat in beats.items()
            if job != but and now - float(beat.get("at", 0)) < JOB_GONE_S}


class Heartbeat:
    """A running job's entry in the index's ``_meta``, written every HEARTBEAT_S by a thread
    of its own while the job is inside ``with``: another job leaves the documents a live job
    has queued alone. Beside the job's requests, not between them, so that a job waiting on a
    busy engine (one request may go again for SIRA_ENGINE__RETRY_S, longer than JOB_GONE_S)
    still reads as live. The engine refusing the entry (not merely unreachable) ends the job
    at its next ``check()``. Entries of jobs gone for a day are dropped."""

    def __init__(self, engine: Engine, index: str, job: str) -> None:
        self.engine, self.index, self.job = engine, index, job
        self.refused: JobFailed | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"sira-heartbeat-{job}",
                                        daemon=True)

    def __enter__(self) -> Heartbeat:
        self._write()  # refused now: the job ends before it starts
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        with contextlib.suppress(Exception):  # else the entry expires by itself
            self._write(done=True)

    def check(self) -> None:
        """End the job if the engine refused its entry."""
        if self.refused is not None:
            raise self.refused

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self._write()
            except JobFailed as exc:
                self.refused = exc
                return

    def _write(self, *, done: bool = False) -> None:
        now = time.time()

        def beat(meta: dict) -> dict:  # under the lock: the other jobs' entries as written
            beats = {j: b for j, b in (meta.get(JOBS_META) or {}).items()
                     if now - float(b.get("at", 0)) < 86400}
            if done:
                beats.pop(self.job, None)
            else:
                beats[self.job] = {"at": now, "host": socket.gethostname(), "pid": os.getpid()}
            return {**meta, JOBS_META: beats}

        try:
            self.engine.update_meta(self.index, beat)
        except (*transient_errors(), MetaBusy):
            return  # the wait loop notices an unreachable engine on its own
        except Exception as exc:
            raise JobFailed(f"the engine refuses to record the job in {self.index}'s _meta: "
                            f"{exc}") from exc


def status_counts(engine: Engine, index: str, job: str | None = None) -> Counter[str]:
    query = {"term": {"sira.job": job}} if job else None
    aggs = engine.aggregate(index, {"s": {"terms": {"field": "sira.status", "size": 20}}},
                            query=query)
    return Counter({b["key"]: b["doc_count"] for b in aggs["s"]["buckets"]})


def task_docs(settings: Settings) -> int:
    """Documents per Celery task."""
    return settings.enrich.batch_docs * settings.worker.task_batches


def _enqueue(app: Celery, index: str, ids: list[str], job: str, batch: int) -> None:
    for start in range(0, len(ids), batch):
        app.send_task(PROPOSE_TASK, args=[index, ids[start:start + batch], job])


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
    fields: list[str] | None = None,
) -> JobSummary:
    """Copy ``source`` into the target index (created from mappings/ if missing; only new
    and changed documents are written), queue every document that needs proposals, wait for
    the workers, then apply the DF filter. Re-running it resumes where it stopped.
    A source index of the user's own (not sira's layout) is copied whole: the target gets its
    mapping and settings plus sira's object, attached with ``fields`` (or the source's
    attached ones), and every field of every document.
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
    if app is None:  # Celery is imported only by the commands that run a job
        from pipeline import worker

        worker.prepare_broker(settings)
        app = worker.make_app(settings)
    whole = bool(source) and not Path(source).exists() and engine.index_exists(source) and \
        not attach.is_own_layout(engine.get_mapping(source))
    if whole:
        try:
            attach.create_copy(engine, source, index, attach.source_fields(engine, source, fields),
                               prompt_version=enrich.prompt_for(settings).version,
                               policy=Profile.from_settings(settings.enrich).filter_policy()
                               .stored())
        except attach.AttachError as exc:
            raise JobFailed(str(exc)) from exc
    else:
        engine.create_index(settings.index)
    with Heartbeat(engine, index, job) as beat:
        if whole:
            copy_whole(engine, settings, source, summary, beat=beat.check)
        elif source:
            copy_documents(engine, settings, source_documents(engine, source, summary.load,
                                                              settings), summary, beat=beat.check)
            summary.skipped_input = summary.load.skipped
        else:
            summary.documents = engine.count(index)
        engine.refresh(index)
        phase("copy")
        _check_writable(engine, index, "before sending any document")
        todo, summary.left_to_others = documents_to_send(
            engine, settings, enrich.prompt_for(settings).version,
            live_jobs(engine, index, but=job))
        restored, cached = enrich.restore_from_cache(engine, settings, [i for i, _ in todo],
                                                     job=job)
        summary.from_cache += len(restored)
        summary.rejected += cached.failures
        todo = [(i, j) for i, j in todo if i not in restored]
        if todo:
            _send_and_wait(engine, settings, app, job, todo, summary, on_progress, poll,
                           timeout, phase, beat)
        counts = status_counts(engine, index, job)
    summary.proposed = counts[PROPOSED] + counts[ENRICHED]
    summary.failed = counts[FAILED]
    summary.taken_over = max(0, summary.sent - summary.proposed - summary.failed)
    sums = engine.aggregate(index, {"c": {"sum": {"field": "sira.calls"}},
                                    "m": {"sum": {"field": "sira.model_ms"}}},
                            query={"term": {"sira.job": job}})
    summary.model_calls = int(sums["c"]["value"] or 0)
    summary.model_s = float(sums["m"]["value"] or 0) / 1000
    reasons = engine.aggregate(index, {"r": {"terms": {"field": "sira.reason", "size": 5}}},
                               query={"bool": {"filter": [{"term": {"sira.job": job}},
                                                          {"term": {"sira.status": FAILED}}]}})
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


def _check_writable(engine: Engine, index: str, when: str, queued: int | None = None) -> None:
    """End the job, naming the engine's reason, if the index refuses writes: documents
    the workers cannot store would otherwise be queued and sent to the model again and
    again."""
    reason = engine.write_refused(index)
    if reason is None:
        return
    left = "" if queued is None else (f"; {queued} documents could not be written and stay "
                                      "queued: the next run sends them again")
    raise JobFailed(f"the engine refuses writes to {index} ({when}): {reason}{left}")


def _send_and_wait(engine: Engine, settings: Settings, app: Celery, job: str,
                   todo: list[tuple[str, str | None]], summary: JobSummary,
                   on_progress: Callable[[int, int], None] | None, poll: float,
                   timeout: float | None, phase: Callable[[str], None], beat: Heartbeat
                   ) -> None:
    index = settings.index.name
    # documents copied now are queued for this job already; older ones are marked, with
    # their model calls for this job at zero. Only documents whose mark was written are sent.
    stale = [i for i, job_of in todo if job_of != job]
    mark = engine.bulk_update(index, [(i, {"sira": {"status": QUEUED, "job": job, "calls": 0,
                                                    "model_ms": 0}}) for i in stale])
    summary.rejected += mark.failures
    unmarked = {f.id for f in mark.failures}
    ids = [i for i, _ in todo if i not in unmarked]
    summary.sent = len(ids)
    engine.refresh(index)
    _enqueue(app, index, ids, job, task_docs(settings))
    phase("queue")
    _wait(engine, settings, app, job, len(ids), summary, on_progress, poll, timeout, beat)
    phase("propose")


def _wait(engine: Engine, settings: Settings, app: Celery, job: str, total: int,
          summary: JobSummary, on_progress: Callable[[int, int], None] | None, poll: float,
          timeout: float | None, beat: Heartbeat) -> None:
    """Until no document of this job is queued. Documents queued with no progress for
    ``requeue_after`` seconds (a lost message, a broker restart) are queued again, at most
    ``max_requeues`` times: tasks are idempotent, so a late duplicate costs no model call.
    Every PROBE_S the job asks the engine whether it still takes writes: workers cannot store
    what they propose into an index that refuses them."""
    index = settings.index.name
    deadline = None if timeout is None else time.monotonic() + timeout
    last_left, last_change = total, time.monotonic()
    last_probe = time.monotonic()
    broker_down_since: float | None = None
    requeues = 0
    while True:
        engine.refresh(index)
        left = status_counts(engine, index, job)[QUEUED]
        if on_progress:
            on_progress(total - left, total)
        if left == 0:
            return
        beat.check()
        now = time.monotonic()
        if now - last_probe > PROBE_S:
            _check_writable(engine, index, "while the workers proposed", queued=left)
            last_probe = now
        if left != last_left:
            last_left, last_change = left, now
        elif now - last_change > settings.worker.requeue_after:
            _check_writable(engine, index, "while the workers proposed", queued=left)
            if requeues >= settings.worker.max_requeues:
                raise JobFailed(f"{left} of {total} documents still queued after "
                                f"{requeues} requeues with no progress: are workers "
                                f"consuming queue '{settings.worker.queue}'? (see their logs)")
            stalled = [h["_id"] for h in engine.scan(index, {"bool": {"filter": [
                {"term": {"sira.job": job}}, {"term": {"sira.status": QUEUED}}]}}, source=False)]
            try:
                _enqueue(app, index, stalled, job, task_docs(settings))
                summary.requeued += len(stalled)
                requeues += 1
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
