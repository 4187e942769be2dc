"""``sira follow``: keep an index's enrichment up to date while any writer feeds it.

Each round finds the documents that need proposals — new ones, ones an application
overwrote (they have no ``sira`` object), ones whose source fields changed (their text hash
differs from the one their proposals were made for) — restores what the proposal cache knows
without a model call, sends the rest to the model (through the Celery workers when a broker
or local workers are given, else from this process), and re-applies the DF filter when
proposals were stored or the collection grew (the cap moves with it; no model call). A
partial update of another field changes no hash and costs nothing. Everything it knows lives
in the index, so a follower killed mid-round loses nothing: the next one carries on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pipeline import enrich
from pipeline.config import Settings
from pipeline.engine import Engine, ItemFailure
from pipeline.jobs import JobSummary
from pipeline.llm import ModelClient
from pipeline.loaders import now_iso
from pipeline.schema import FAILED, PROPOSED, Layout, sira_of

FOLLOW_META = "sira_follow"  # the last round's figures, for `sira stats`


@dataclass
class Round:
    index: str
    pending_before: int = 0
    restored: int = 0  # from the proposal cache
    proposed: int = 0  # by the model
    failed: int = 0
    waiting: int = 0  # no model server configured
    model_calls: int = 0
    pending: int = 0  # after the round
    oldest_s: float | None = None  # age of the oldest pending document, as far as seen
    applied: str | None = None
    rejected: list[ItemFailure] = field(default_factory=list)
    given_up: int = 0  # failed documents at SIRA_WORKER__MAX_DOC_ATTEMPTS

    def line(self) -> str:
        age = "" if self.oldest_s is None else f", oldest {self.oldest_s:.0f}s"
        given_up = f", {self.given_up} failed for good" if self.given_up else ""
        waiting = f", {self.waiting} waiting for a model server" if self.waiting else ""
        applied = f"; {self.applied}" if self.applied else ""
        return (f"{now_iso()} {self.index}: lag {self.pending} pending{age}; this round "
                f"{self.pending_before} found, {self.restored} from the cache, {self.proposed} "
                f"proposed, {self.failed} failed{waiting}{given_up}, {self.model_calls} model "
                f"calls{applied}")


def pending_documents(engine: Engine, settings: Settings) -> tuple[list[str], int]:
    """(ids of the documents that need proposals, failed ones given up on)."""
    index = settings.index.name
    layout = Layout.of(engine.get_meta(index))
    version = enrich.prompt_for(settings).version
    out, given_up = [], 0
    engine.refresh(index)
    for hit in engine.scan(index, source=layout.read()):
        sira = sira_of(hit["_source"])
        if not enrich.needs_proposals(hit["_source"], version, layout):
            continue
        if sira.get("status") == FAILED and sira.get("proposed_hash") is None and \
                int(sira.get("attempts") or 0) >= settings.worker.max_doc_attempts:
            given_up += 1
            continue
        out.append(hit["_id"])
    return out, given_up


class Follower:
    """Rounds over one index; remembers when it first saw each pending document."""

    def __init__(self, engine: Engine, settings: Settings, client: ModelClient | None,
                 run_job: Callable[[], JobSummary] | None = None) -> None:
        self.engine, self.settings, self.client = engine, settings, client
        self.run_job = run_job  # the Celery job, when workers are given
        self.index = settings.index.name
        self.first_seen: dict[str, float] = {}
        stored = engine.get_meta(self.index).get(FOLLOW_META) or {}
        self.restart_floor = stored.get("oldest_pending_at")  # a follower before this one

    def round(self) -> Round:
        result = Round(self.index)
        ids, result.given_up = pending_documents(self.engine, self.settings)
        result.pending_before = len(ids)
        if ids:
            summary = self._propose(ids)
            result.restored, result.proposed = summary.cached, summary.proposed - summary.cached
            result.failed, result.waiting = summary.failed, summary.waiting
            result.model_calls, result.rejected = summary.model_calls, summary.rejected
        if self._needs_apply(result):
            result.applied = enrich.apply(self.engine, self.settings).line()
        left, _ = pending_documents(self.engine, self.settings)
        now = time.time()
        for doc_id in left:
            self.first_seen.setdefault(doc_id, self.restart_floor or now)
        self.first_seen = {i: self.first_seen[i] for i in left}
        self.restart_floor = None
        result.pending = len(left)
        oldest = min(self.first_seen.values(), default=None)
        result.oldest_s = None if oldest is None else now - oldest
        self.engine.put_meta(self.index, {FOLLOW_META: {
            "at": now_iso(), "pending": result.pending, "oldest_pending_at": oldest,
            "oldest_pending_s": result.oldest_s, "last_round": result.line()}})
        return result

    def _propose(self, ids: list[str]) -> enrich.ProposeSummary:
        if self.run_job is None or self.client is None:
            return enrich.propose(self.engine, self.settings, self.client, ids=ids)
        # the job restores what the cache holds, then sends the rest through the workers
        job = self.run_job()
        return enrich.ProposeSummary(
            considered=len(ids), proposed=job.proposed, cached=job.from_cache,
            failed=job.failed, model_calls=job.model_calls, rejected=list(job.rejected))

    def _needs_apply(self, result: Round) -> bool:
        if result.restored or result.proposed:
            return True
        if self.engine.count(self.index, {"term": {"sira.status": PROPOSED}}):
            return True  # proposals stored before (a follower or job that stopped early)
        applied = self.engine.get_meta(self.index).get("sira_filter") or {}
        # the collection grew or shrank since the filter was applied: its cap may move
        return bool(applied) and applied.get("documents") != self.engine.count(self.index)
