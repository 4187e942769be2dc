"""Corpus-side enrichment, in two phases.

``propose``: documents -> model -> raw proposals (normalised, classified echo/bridge, with the
model and prompt version), written to each document by bulk partial update. A document whose
content hash and prompt version are unchanged is not sent to the model again.

``apply``: proposals + collection DF statistics + a filter policy -> the enrichment fields
``sira.echo`` / ``sira.bridge``. It needs no model and can run again at any time (``sira
refilter``), e.g. after the collection grew.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from itertools import islice

from pipeline import dfstats, policies, terms
from pipeline.cache import Entry, ProposalCache
from pipeline.config import DfBasis, Settings
from pipeline.engine import BulkResult, Engine, ItemFailure
from pipeline.llm import ModelClient
from pipeline.loaders import now_iso
from pipeline.profile import Profile
from pipeline.prompts import Prompt, corpus_prompt, document_body
from pipeline.schema import (
    ENRICHED,
    FAILED,
    OWN,
    PROPOSED,
    PROPOSED_HASH,
    PROPOSED_STATES,
    Layout,
    sira_of,
)


def prompt_for(settings: Settings) -> Prompt:
    e = settings.enrich
    return corpus_prompt(e.stance, e.max_terms, settings.index.max_ngram, e.doc_chars)


def needs_proposals(source: dict, prompt_version: str, layout: Layout = OWN) -> bool:
    """Whether a document has no proposals for its current text and the current prompt (a
    document an application wrote or overwrote has no ``sira`` object: it needs them)."""
    sira = sira_of(source)
    return not (
        sira.get("status") in PROPOSED_STATES
        and sira.get("prompt_version") == prompt_version
        and sira.get("proposed_hash") == layout.content_hash(source)
    )


def _batched(items: Iterable, size: int) -> Iterator[list]:
    it = iter(items)
    while batch := list(islice(it, size)):
        yield batch


# -- storing proposals (shared by the model path and import-proposals) ----------------------


def job_share(source: dict, job: str | None, name: str) -> int:
    """What a document has already counted for ``job`` (model calls or ms): the job marks
    its documents with zero, so a later write adds to the figure instead of replacing it."""
    sira = sira_of(source)
    return int(sira.get(name) or 0) if sira.get("job") == job else 0


def store_proposals(engine: Engine, index: str, proposals: dict[str, list[str]],
                    sources: dict[str, dict], *, model: str, prompt_version: str,
                    stance: str, job: str | None = None,
                    calls: dict[str, int] | None = None, model_ms: int = 0,
                    layout: Layout = OWN) -> BulkResult:
    """Normalise and classify ``proposals`` against their documents and write them.
    ``calls``: model requests per document, added to what the document already counted for
    ``job``; ``model_ms``: each document's share of the time its worker sat waiting for the
    model (the job sums them to tell model time apart)."""
    return engine.bulk_update(index, list(proposal_fields(
        engine, index, proposals, sources, model=model, prompt_version=prompt_version,
        stance=stance, job=job, calls=calls, model_ms=model_ms, layout=layout).items()))


def proposal_fields(engine: Engine, index: str, proposals: dict[str, list[str]],
                    sources: dict[str, dict], *, model: str, prompt_version: str,
                    stance: str, job: str | None = None,
                    calls: dict[str, int] | None = None, model_ms: int = 0,
                    layout: Layout = OWN, known: dict[str, list[dict]] | None = None
                    ) -> dict[str, dict]:
    """What ``store_proposals`` writes, per document: ``{"sira": {...}}`` (the documents
    need not be in the index yet: the copy of a job writes them in the same request).
    ``known``: terms already prepared under this index's analysis (the proposal cache), not
    analysed again."""
    known = known or {}
    fresh = {i: p for i, p in proposals.items() if i not in known}
    bodies = {i: document_body(*layout.title_text(sources[i])) for i in fresh}
    prepared = {i: [t.as_json() for t in doc_terms] for i, doc_terms in
                (terms.prepare(engine, index, fresh, bodies) if fresh else {}).items()}
    at = now_iso()
    updates = {}
    for doc_id in proposals:
        doc_terms = known[doc_id] if doc_id in known else prepared[doc_id]
        source = sources[doc_id]
        sira = sira_of(source)
        updates[doc_id] = {
            "sira": {"proposals": {"model": model, "prompt_version": prompt_version,
                                   "stance": stance, "at": at, "raw": proposals[doc_id],
                                   "terms": doc_terms},
                     "proposed_terms": [t["norm"] for t in doc_terms],
                     "status": PROPOSED, "reason": None, "model": model,
                     "prompt_version": prompt_version,
                     "proposed_hash": layout.content_hash(source), "proposed_at": at,
                     "attempts": int(sira.get("attempts") or 0) + 1, "job": job,
                     "calls": job_share(source, job, "calls") + (calls or {}).get(doc_id, 0),
                     "model_ms": job_share(source, job, "model_ms") + model_ms},
        }
    return updates


def record_failures(engine: Engine, index: str, reasons: dict[str, str],
                    sources: dict[str, dict], *, job: str | None = None,
                    calls: dict[str, int] | None = None, model_ms: int = 0) -> BulkResult:
    updates = []
    for doc_id, reason in reasons.items():
        source = sources.get(doc_id, {})
        updates.append((doc_id, {"sira": {
            "status": FAILED, "reason": reason[:2000],
            "attempts": int(sira_of(source).get("attempts") or 0) + 1, "job": job,
            "calls": job_share(source, job, "calls") + (calls or {}).get(doc_id, 0),
            "model_ms": job_share(source, job, "model_ms") + model_ms,
        }}))
    return engine.bulk_update(index, updates)


def claim(engine: Engine, index: str, ids: list[str], sources: dict[str, dict],
          first_requests: list[int], job: str | None) -> tuple[list[str], BulkResult]:
    """Before the model is called: count each document's first request(s) on it, so that
    a worker killed mid-batch leaves its calls counted, and find out whether the engine takes
    writes at all. Returns the documents to send (those whose claim was written)."""
    updates = [(i, {"sira": {"calls": job_share(sources[i], job, "calls") + n}})
               for i, n in zip(ids, first_requests, strict=True)]
    result = engine.bulk_update(index, updates)
    refused = {f.id for f in result.failures}
    for i, n in zip(ids, first_requests, strict=True):
        sira = sources[i].setdefault("sira", {})
        if i not in refused:
            sira["calls"] = job_share(sources[i], job, "calls") + n
            sira["job"] = job
    return [i for i in ids if i not in refused], result


# -- propose -------------------------------------------------------------------------------


@dataclass
class ProposeSummary:
    considered: int = 0
    unchanged: int = 0
    proposed: int = 0  # from the model or from the cache
    cached: int = 0  # of which restored from the proposal cache (no model call)
    waiting: int = 0  # need the model, and none is configured
    failed: int = 0
    model_calls: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    rejected: list[ItemFailure] = field(default_factory=list)

    def line(self) -> str:
        refused = f", {len(self.rejected)} rejected by the engine" if self.rejected else ""
        waiting = (f", {self.waiting} waiting for a model server (SIRA_LLM__URL)"
                   if self.waiting else "")
        cached = f" ({self.cached} from the cache)" if self.cached else ""
        return (f"{self.considered} documents: {self.proposed} proposed, {self.failed} failed, "
                f"{self.unchanged} unchanged (not sent){waiting}{refused}; "
                f"{self.model_calls} model calls{cached}")


def _from_cache(engine: Engine, index: str, cache: ProposalCache, sources: dict[str, dict],
                *, prompt: Prompt, model: str, layout: Layout, job: str | None,
                analysis: str | None) -> dict[str, dict]:
    """The ``sira`` fields of the proposals the cache holds for ``sources``' texts (by id);
    terms prepared under this index's analysis are taken as they are."""
    found = cache.lookup({i: layout.content_hash(src) for i, src in sources.items()},
                         prompt.version, model, analysis or terms.analysis_key(engine, index))
    if not found:
        return {}
    return proposal_fields(engine, index, {i: e.raw for i, e in found.items()}, sources,
                           model=model, prompt_version=prompt.version, stance=prompt.stance,
                           job=job, layout=layout,
                           known={i: e.terms for i, e in found.items() if e.terms is not None})


def restore_cached(engine: Engine, index: str, cache: ProposalCache | None,
                   todo: list[str], sources: dict[str, dict], *, prompt: Prompt, model: str,
                   layout: Layout, job: str | None = None, analysis: str | None = None
                   ) -> tuple[list[str], BulkResult]:
    """Store the cached proposals of ``todo``'s texts; returns the ids still to send.
    ``analysis``: the index's ``terms.analysis_key``, if known already."""
    if cache is None or not todo:
        return todo, BulkResult()
    fields = _from_cache(engine, index, cache, {i: sources[i] for i in todo}, prompt=prompt,
                         model=model, layout=layout, job=job, analysis=analysis)
    if not fields:
        return todo, BulkResult()
    written = engine.bulk_update(index, list(fields.items()))
    stored = set(fields) - {f.id for f in written.failures}
    return [i for i in todo if i not in stored], written


def cached_fields(engine: Engine, settings: Settings, sources: dict[str, dict], *,
                  layout: Layout, job: str | None = None) -> dict[str, dict]:
    """For documents about to be written (``sources`` by id) that need proposals: the
    ``sira`` fields of the proposals the cache holds for their texts, to write with the
    documents themselves (one write instead of two)."""
    cache = ProposalCache.of(engine, settings.enrich.cache_index)
    prompt = prompt_for(settings)
    todo = {i: src for i, src in sources.items()
            if needs_proposals(src, prompt.version, layout)}
    if cache is None or not todo:
        return {}
    return _from_cache(engine, settings.index.name, cache, todo, prompt=prompt,
                       model=settings.llm.model, layout=layout, job=job, analysis=None)


def restore_from_cache(engine: Engine, settings: Settings, ids: list[str], *,
                       job: str | None = None) -> tuple[set[str], BulkResult]:
    """Give ``ids`` the proposals the cache holds for their texts, before anything is
    queued (no model call, no queue, one write each); returns the ids restored."""
    index = settings.index.name
    cache = ProposalCache.of(engine, settings.enrich.cache_index)
    restored: set[str] = set()
    result = BulkResult()
    if cache is None:
        return restored, result
    layout = Layout.of(engine.get_meta(index))
    prompt = prompt_for(settings)
    analysis = terms.analysis_key(engine, index)
    for batch in _batched(ids, settings.enrich.batch_docs * 8):
        sources = engine.mget(index, batch, source=layout.read())
        todo = [i for i in batch if i in sources]
        left, written = restore_cached(engine, index, cache, todo, sources, prompt=prompt,
                                       model=settings.llm.model, layout=layout, job=job,
                                       analysis=analysis)
        restored |= set(todo) - set(left)
        result.merge(written)
    return restored, result


@dataclass
class _Sent:
    """A batch whose model answers are on their way (``propose`` stores one batch while the
    next one's requests are in flight)."""

    todo: list[str]
    sources: dict[str, dict]
    first: list[int]
    answers: Future
    size: int  # documents of the batch, sent or not (for the progress)


def propose(engine: Engine, settings: Settings, client: ModelClient | None, *,
            ids: list[str] | None = None, job: str | None = None,
            on_progress: Callable[[int], None] | None = None) -> ProposeSummary:
    """Give every document that needs proposals (all, or ``ids``) its proposals, in batches:
    from the proposal cache where the same text was proposed for before, else from the model
    (``client``; None: the cache only, the rest wait). ``job`` is recorded on each document
    sent, with its number of model calls. While one batch is being stored the next one's
    requests are already in flight (sharing the client's ``concurrency``), so the model is not
    left waiting on the engine."""
    index = settings.index.name
    layout = Layout.of(engine.get_meta(index))
    prompt = prompt_for(settings)
    model = client.model if client else settings.llm.model
    cache = ProposalCache.of(engine, settings.enrich.cache_index)
    analysis = terms.analysis_key(engine, index) if cache else None
    summary = ProposeSummary()
    if ids is None:
        hits = ((h["_id"], h["_source"]) for h in engine.scan(index, source=layout.read()))
    else:
        hits = iter(engine.mget(index, ids, source=layout.read()).items())

    def send(batch: list[tuple[str, dict]], pool: ThreadPoolExecutor) -> _Sent | None:
        summary.considered += len(batch)
        sources = {doc_id: source for doc_id, source in batch}
        todo = [doc_id for doc_id, source in batch
                if needs_proposals(source, prompt.version, layout)]
        summary.unchanged += len(batch) - len(todo)
        todo, restored = restore_cached(engine, index, cache, todo, sources, prompt=prompt,
                                        model=model, layout=layout, job=job,
                                        analysis=analysis)
        summary.cached += restored.ok
        summary.proposed += restored.ok
        summary.rejected += restored.failures
        todo = [i for i in todo if i not in {f.id for f in restored.failures}]
        if client is None or not todo:
            summary.waiting += len(todo) if client is None else 0
            if on_progress:
                on_progress(len(batch))
            return None
        # the first request of each document is counted before it is sent; the answers
        # then add what came on top (retries, splits)
        todo, claimed = claim(engine, index, todo, sources, client.first_requests(len(todo)),
                              job)
        summary.rejected += claimed.failures  # not sent: it could not have been stored
        first = client.first_requests(len(todo))
        items = [(i, document_body(*layout.title_text(sources[i]))) for i in todo]
        return _Sent(todo, sources, first, pool.submit(client.keywords, prompt, items),
                     len(batch))

    def store(sent: _Sent) -> None:
        assert client is not None
        waited = time.monotonic()
        answers = sent.answers.result()
        # the time this worker waited for the model with nothing else to do (the rest of
        # the batch's wait overlapped the storing of the batch before), shared out
        model_ms = int((time.monotonic() - waited) * 1000 / max(len(sent.todo), 1))
        summary.model_calls += sum(a.calls for a in answers)
        good = {a.key: a.keywords for a in answers if a.ok}
        bad = {a.key: a.reason or "unknown failure" for a in answers if not a.ok}
        calls = {a.key: a.calls - n for a, n in zip(answers, sent.first, strict=True)}
        fields = proposal_fields(engine, index, good, sent.sources, model=client.model,
                                 prompt_version=prompt.version, stance=prompt.stance,
                                 job=job, calls=calls, model_ms=model_ms, layout=layout)
        written = engine.bulk_update(index, list(fields.items()))
        # a document whose proposals the engine refused is a failed document, not a lost one
        bad |= {f.id: f"engine rejected the proposals: {f.reason}" for f in written.failures}
        if cache:
            cache.store([Entry(layout.content_hash(sent.sources[i]), good[i],
                               fields[i]["sira"]["proposals"]["terms"])
                         for i in good if i not in bad], prompt.version, model,
                        analysis)
        failed = record_failures(engine, index, bad, sent.sources, job=job, calls=calls,
                                 model_ms=model_ms)
        summary.proposed += written.ok
        summary.failed += len(bad)
        summary.reasons.update(reason.split(":")[0] for reason in bad.values())
        summary.rejected += failed.failures  # not even the failure could be recorded
        if on_progress:
            on_progress(sent.size)

    pending: _Sent | None = None
    with ThreadPoolExecutor(2, thread_name_prefix="sira-propose") as pool:
        try:
            for batch in _batched(hits, settings.enrich.batch_docs):
                sent = send(batch, pool)
                previous, pending = pending, sent
                if previous is not None:
                    store(previous)
            previous, pending = pending, None
            if previous is not None:
                store(previous)
        finally:
            if pending is not None:  # stopped by an error: the answers paid for are kept
                store(pending)
    return summary


# -- apply ---------------------------------------------------------------------------------


@dataclass
class TermTable:
    """Every distinct proposed term of a collection with its document frequency. The
    proposals of each document stay in the index and are streamed when needed, so memory
    grows with the vocabulary, not with the collection."""

    n_docs: int
    df: dict[str, int]  # norm -> DF under ``basis``
    basis: DfBasis
    bounded: bool = False  # counted only as far as one policy's decisions need


HAS_PROPOSALS = {"exists": {"field": PROPOSED_HASH}}


def proposed_documents(engine: Engine, index: str, source: list[str]
                       ) -> Iterator[tuple[str, dict]]:
    """(id, source) of every document with proposals, streamed with a scroll."""
    for hit in engine.scan(index, HAS_PROPOSALS, source=source):
        yield hit["_id"], hit["_source"]


def stored_terms(source: dict) -> list[dict]:
    """A document's stored proposals: {"text", "norm", "class"} each."""
    return sira_of(source).get("proposals", {}).get("terms", [])


# Counting only as far as a policy needs costs a search per undecided term, whatever the size
# of the collection; an aggregation's cost grows with the matches it visits. Measured with
# sira bench-scale (README): on 2026-12-02 the aggregations were cheaper up to about 50,000
# documents per shard; with the word ranges from the term dictionaries the bounded counts
# took 7.5 s at 10,000 documents against the aggregations' 14.1 s (2026-12-04). Smaller
# collections were not measured again: they keep the aggregations.
BOUNDED_FROM = 10_000


def counts_bounded(n_docs: int, shards: int, bounded_from: int = BOUNDED_FROM) -> bool:
    """Whether ``apply`` gathers an index's DF statistics with bounded counts (else with the
    aggregations)."""
    return n_docs > bounded_from * shards


def term_table(engine: Engine, index: str, basis: DfBasis,
               policy: policies.Policy | None = None, *,
               bounded_from: int = BOUNDED_FROM) -> TermTable:
    """Every distinct proposed term with its DF: exact for every term (``sira stats``, the
    bench's grid over policies, an index of up to ``bounded_from`` documents per shard), or,
    given the ``policy`` it is for, counted only as far as that policy's decisions need
    (``bounded``: each term's range from its words' counts, then a search per term the
    range does not decide, stopping at a bound; the cap it gives is exact)."""
    engine.refresh(index)
    surfaces: dict[str, str] = {}
    proposed: Counter[str] = Counter()  # documents per term: what sira.proposed_terms holds
    for _, source in proposed_documents(engine, index, ["sira.proposals.terms"]):
        stored = stored_terms(source)
        for t in stored:
            surfaces.setdefault(t["norm"], t["text"])
        proposed.update({t["norm"] for t in stored})
    n_docs = engine.count(index)
    layout = Layout.of(engine.get_meta(index))
    fields = layout.phrase_fields(enriched=False)
    if basis == "proposals":
        counts = dfstats.proposal_frequencies(engine, index)
        return TermTable(n_docs, {norm: counts.get(norm, 0) for norm in surfaces}, basis)
    shards = int(engine.index_settings(index)["index"]["number_of_shards"])
    if policy is None or not counts_bounded(n_docs, shards, bounded_from):
        return TermTable(n_docs, dfstats.document_frequencies(
            engine, index, surfaces, basis, fields=fields), basis)
    rank = isinstance(policy, policies.Rank)
    if policy.needs_statistics() and not rank:
        raise ValueError(f"no bounded statistics for the {policy.kind} policy")
    cap = None if rank else policy.cap(n_docs, [])  # else known from the collection's size
    if cap is None and not rank:
        return TermTable(n_docs, {}, basis, bounded=True)  # no cap: nothing to decide
    # under rank, the floor its decisions start from: the K-th largest of a few exact counts
    counted = dfstats.COUNTED_PER_RANK * policy.rank_k if rank else 0
    bounds = dfstats.word_bounds(engine, index, surfaces, basis, fields, proposed, n_docs,
                                 counted=counted)
    if rank:
        df = dfstats.top_frequencies(engine, index, surfaces, policy.rank_k, basis, fields,
                                     pair_fields=layout.pair_fields, bounds=bounds)
    else:
        df = dfstats.capped_frequencies(engine, index, surfaces, cap + 1, fields, basis,
                                        pair_fields=layout.pair_fields, bounds=bounds)
    return TermTable(n_docs, df, basis, bounded=True)


@dataclass
class ApplySummary:
    policy: str
    basis: str
    cap: int | None
    documents: int = 0
    enriched: int = 0
    updated: int = 0  # documents written now (the others were already up to date)
    proposed_terms: int = 0
    kept: Counter[str] = field(default_factory=Counter)  # by class
    rejected: list[ItemFailure] = field(default_factory=list)

    def line(self) -> str:
        kept = sum(self.kept.values())
        cap = "none" if self.cap is None else str(self.cap)
        return (f"policy {self.policy} (DF basis {self.basis}, cap {cap}): "
                f"{self.enriched}/{self.documents} documents enriched ({self.updated} "
                f"updated now), kept {kept} of "
                f"{self.proposed_terms} terms (echo {self.kept['echo']}, "
                f"bridge {self.kept['bridge']})")


def kept_terms(stored: list[dict], df: dict[str, int], cap: int | None) -> list[dict]:
    return [t for t in stored if policies.keeps(df.get(t["norm"], 0), cap)]


def enrichment_fields(kept: list[dict]) -> tuple[list[str], list[str]]:
    """(sira.echo, sira.bridge) values of the kept terms."""
    return ([t["text"] for t in kept if t["class"] == terms.ECHO],
            [t["text"] for t in kept if t["class"] == terms.BRIDGE])


def apply(engine: Engine, settings: Settings, policy: policies.Policy | None = None,
          basis: DfBasis | None = None, table: TermTable | None = None) -> ApplySummary:
    """Write the enrichment fields of every proposed document under ``policy`` (default: the
    index's profile), streaming the documents; only those whose enrichment or status changes
    are written. ``table``: statistics computed before (the bench tries many policies on the
    same proposals)."""
    index = settings.index.name
    if policy is None:  # the one in the index's profile (pipeline.profile)
        policy = Profile.for_index(engine.get_meta(index), settings).filter_policy()
    basis = basis or settings.enrich.df_basis
    table = table or term_table(engine, index, basis, policy)
    cap = policy.cap(table.n_docs, table.df.values())
    summary = ApplySummary(policy.describe(), basis, cap, documents=table.n_docs)
    at = now_iso()

    def updates() -> Iterator[tuple[str, dict]]:
        for doc_id, source in proposed_documents(engine, index, [
                "sira.proposals.terms", "sira.status", "sira.echo", "sira.bridge"]):
            stored = stored_terms(source)
            kept = kept_terms(stored, table.df, cap)
            summary.proposed_terms += len(stored)
            summary.kept.update(t["class"] for t in kept)
            echo, bridge = enrichment_fields(kept)
            sira = sira_of(source)
            status = sira.get("status", "")
            written = "echo" in sira or "bridge" in sira
            if written and (sira.get("echo", []), sira.get("bridge", [])) == (echo, bridge) \
                    and status != PROPOSED:
                continue  # stored exactly so already
            yield doc_id, {"sira": {
                "echo": echo, "bridge": bridge,
                "status": ENRICHED if status in (PROPOSED, ENRICHED) else status,
                "enriched_at": at, "kept": len(kept)}}

    engine.refresh(index)
    result = engine.bulk_update(index, updates())
    summary.updated = result.ok
    summary.rejected = result.failures
    engine.put_meta(index, {"sira_filter": {
        **policy.stored(), "basis": basis, "cap": cap,
        "documents": table.n_docs, "applied_at": at}})
    engine.refresh(index)
    summary.enriched = engine.count(index, {"term": {"sira.status": ENRICHED}})
    return summary


# -- stats ---------------------------------------------------------------------------------

DF_BINS = [(1, 1), (2, 5), (6, 20), (21, 100), (101, 500), (501, None)]


def stats(engine: Engine, settings: Settings) -> dict:
    """Collection figures for ``sira stats``: proposals and kept terms per document, echo vs
    bridge, what each policy would drop, and a DF histogram of the distinct proposed terms."""
    index = settings.index.name
    table = term_table(engine, index, settings.enrich.df_basis)
    e = settings.enrich
    n_with = n_terms = kept_now = 0
    classes: Counter[str] = Counter()
    for _, source in proposed_documents(engine, index, ["sira.proposals.terms", "sira.echo",
                                                        "sira.bridge"]):
        stored = stored_terms(source)
        n_with += 1
        n_terms += len(stored)
        classes.update(t["class"] for t in stored)
        kept_now += len(sira_of(source).get("echo", [])) + len(sira_of(source).get("bridge", []))
    by_policy = {}
    for kind in policies.KINDS:
        p = policies.make(kind, **e.model_dump())
        cap = p.cap(table.n_docs, table.df.values())
        dropped = [n for n, df in table.df.items() if not policies.keeps(df, cap)]
        by_policy[p.describe()] = {"cap": cap, "distinct_terms_dropped": len(dropped)}
    histogram = {}
    for low, high in DF_BINS:
        label = f"{low}" if low == high else (f"{low}-{high}" if high else f">{low - 1}")
        histogram[label] = sum(1 for df in table.df.values()
                               if df >= low and (high is None or df <= high))
    return {
        "documents": table.n_docs,
        "documents_with_proposals": n_with,
        "proposals_per_doc": round(n_terms / n_with, 2) if n_with else 0.0,
        "kept_per_doc": round(kept_now / n_with, 2) if n_with else 0.0,
        "echo_share": round(classes["echo"] / n_terms, 3) if n_terms else 0.0,
        "bridge_share": round(classes["bridge"] / n_terms, 3) if n_terms else 0.0,
        "distinct_terms": len(table.df),
        "df_basis": table.basis,
        "policies": by_policy,
        "df_histogram": histogram,
        # the lag `sira follow` saw in its last round (pending documents, oldest, when)
        "follow": engine.get_meta(index).get("sira_follow"),
    }
