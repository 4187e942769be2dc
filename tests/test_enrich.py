"""Corpus-side enrichment against real engines and the tests' HTTP model server."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline import batchfiles, dfstats, enrich, policies, terms
from pipeline.bench.stand_in import StandInModel
from pipeline.config import EnrichSettings, IndexSettings, LLMSettings, Settings
from pipeline.engine import Engine
from pipeline.llm import ModelClient
from pipeline.loaders import Document
from pipeline.schema import OWN, PHRASE_TERMS_META, Layout

ANSWERS = {
    "Heap sizing": ["JVM heap", "garbage collector", "Xmx flag", "the"],
    "Snapshot repositories": ["S3 backup", "snapshot lifecycle"],
    "Flaky answer": ["rate limited once"],
    "Oversized answer": ["x" * 40_000],  # a keyword term the engine refuses (> 32 KB)
}


@pytest.fixture
def model() -> Iterator[StandInModel]:
    with StandInModel(ANSWERS, slow_seconds=1.5) as fake:
        yield fake


def settings_for(index: IndexSettings, model: StandInModel | None = None,
                 **enrich_options: object) -> Settings:
    llm = LLMSettings(url=model.url if model else None, model="test-model", read_timeout=1.0,
                      max_attempts=3)
    return Settings(index=index, llm=llm, enrich=EnrichSettings(**enrich_options))


def client_for(settings: Settings) -> ModelClient:
    return ModelClient(settings.llm, backoff=0.01, backoff_max=0.05)


def load(engine: Engine, index: str, docs: list[tuple[str, str, str]]) -> None:
    result = engine.bulk_index(index, [Document(i, t, x).to_index() for i, t, x in docs])
    assert result.failed == 0, result.failures
    engine.refresh(index)


DOCS = [
    ("heap", "Heap sizing", "Give the JVM half the memory."),
    ("snap", "Snapshot repositories", "Register a repository and take snapshots."),
    ("flaky", "Flaky answer", "FAULT:429:1"),
    ("poison", "Poison document", "The model never answers this one properly. FAULT:garbage"),
    ("huge", "Oversized answer", "The engine refuses what the model proposed."),
]


def test_propose_apply_and_idempotence(engine: Engine, fresh_index: IndexSettings,
                                       model: StandInModel) -> None:
    settings = settings_for(fresh_index, model, policy="none")
    load(engine, fresh_index.name, DOCS)
    client = client_for(settings)

    first = enrich.propose(engine, settings, client)
    assert (first.proposed, first.failed, first.unchanged) == (3, 2, 0)
    assert sorted(first.reasons) == ["answer is not JSON (Expecting value)",
                                     "engine rejected the proposals"]
    huge = engine.get(fresh_index.name, "huge")["sira"]
    assert huge["status"] == "failed" and "engine rejected the proposals" in huge["reason"]

    heap = engine.get(fresh_index.name, "heap")
    stored = heap["sira"]["proposals"]
    assert stored["model"] == "test-model"
    assert stored["prompt_version"] == enrich.prompt_for(settings).version
    assert stored["stance"] == "new+key"
    classes = {t["text"]: t["class"] for t in stored["terms"]}
    # "the" analyses to nothing and is dropped; "JVM heap" reuses a document word
    assert classes == {"JVM heap": "echo", "garbage collector": "bridge", "Xmx flag": "bridge"}
    assert heap["sira"]["status"] == "proposed"
    assert heap["sira"]["proposed_hash"] == heap["sira"]["content_hash"]
    poison = engine.get(fresh_index.name, "poison")["sira"]
    assert poison["status"] == "failed" and "stricter retry" in poison["reason"]

    applied = enrich.apply(engine, settings)
    assert applied.enriched == 3 and applied.cap is None
    heap = engine.get(fresh_index.name, "heap")
    assert heap["sira"]["echo"] == ["JVM heap"]
    assert sorted(heap["sira"]["bridge"]) == ["Xmx flag", "garbage collector"]
    assert heap["sira"]["status"] == "enriched"
    assert engine.get(fresh_index.name, "poison")["sira"]["status"] == "failed"
    # a bridge term now finds its document, which the text alone does not
    query = {"query": {"multi_match": {"query": "garbage collector",
                                       "fields": ["contents", "sira.bridge"]}}}
    hits = engine.search(fresh_index.name, query)["hits"]["hits"]
    assert [h["_id"] for h in hits] == ["heap"]

    calls_before = dict(model.calls)
    again = enrich.propose(engine, settings, client)
    assert (again.unchanged, again.proposed, again.failed) == (3, 0, 2)  # only the failures
    assert {k: model.calls[k] - calls_before.get(k, 0) for k in model.calls} == {
        "Heap sizing": 0, "Snapshot repositories": 0, "Flaky answer": 0, "Poison document": 2,
        "Oversized answer": 1}

    load(engine, fresh_index.name, [("snap", "Snapshot repositories",
                                     "Now about searchable snapshots.")])
    calls_before = dict(model.calls)
    changed = enrich.propose(engine, settings, client)
    assert changed.proposed == 1
    assert model.calls["Snapshot repositories"] - calls_before["Snapshot repositories"] == 1
    assert model.calls["Heap sizing"] == calls_before["Heap sizing"]


def test_batches_overlap_within_the_concurrency(engine: Engine, fresh_index: IndexSettings
                                                ) -> None:
    """The next batch's requests are in flight while a batch is stored, and two batches in
    flight still share the client's concurrency."""
    docs = [(f"d{i:02d}", f"Note {i:02d}", "shard and replica placement") for i in range(40)]
    docs[0] = ("d00", "Note 00", "a slow answer, well within the timeout FAULT:slow:1")
    load(engine, fresh_index.name, docs)
    with StandInModel(delay=0.05, slow_seconds=0.5) as model:
        settings = settings_for(fresh_index, model, policy="none", batch_docs=8)
        settings.llm.concurrency = 4
        summary = enrich.propose(engine, settings, client_for(settings),
                                 ids=[d[0] for d in docs])
        assert (summary.proposed, summary.model_calls, model.requests) == (40, 40, 40)
        assert model.peak == 4  # reached, never passed
        spans = {key: (start, end) for key, start, end in model.spans}
        batches = [[f"Note {i:02d}" for i in range(b, b + 8)] for b in range(0, 40, 8)]
        # while the first batch's slow answer holds one slot, the second batch uses the others
        assert min(spans[t][0] for t in batches[1]) < spans["Note 00"][1], \
            "the second batch waited for the first to be answered and stored"


def test_df_is_exact_on_a_multi_shard_index(cluster: Engine, index_settings: IndexSettings
                                            ) -> None:
    index = index_settings.model_copy(update={"shards": 3, "replicas": 1})
    cluster.create_index(index)
    try:
        rng = random.Random(11)
        vocab = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]
        docs, proposals = [], {}
        for i in range(240):
            words = [rng.choice(vocab) for _ in range(6)]
            docs.append((f"d{i}", f"doc {i}", " ".join(words)))
            proposals[f"d{i}"] = rng.sample(vocab, 2) + [f"{words[0]} {words[1]}"]
        load(cluster, index.name, docs)
        sources = cluster.mget(index.name, list(proposals), source=OWN.read())
        enrich.store_proposals(cluster, index.name, proposals, sources, model="m",
                               prompt_version="p", stance="new+key")
        cluster.refresh(index.name)

        texts = {d: f" {x} " for d, _, x in docs}
        candidates = sorted({t for terms in proposals.values() for t in terms})
        in_text = {t: {d for d, x in texts.items() if f" {t} " in x} for t in candidates}
        proposed = {t: {d for d, terms in proposals.items() if t in terms} for t in candidates}
        norm = dict(zip(candidates, terms.normalize(cluster, index.name, candidates),
                        strict=True))  # e.g. charlie -> charli
        assert len(set(norm.values())) == len(candidates)
        surfaces = {norm[t]: t for t in candidates}
        for basis, truth in [("text", in_text), ("proposals", proposed),
                             ("both", {t: in_text[t] | proposed[t] for t in candidates})]:
            got = dfstats.document_frequencies(cluster, index.name, surfaces, basis, batch=7)
            assert got == {norm[t]: len(truth[t]) for t in candidates}, basis
        assert dfstats.proposal_frequencies(cluster, index.name, page=5) == \
            Counter({norm[t]: len(proposed[t]) for t in candidates})
        # what sketch validation asks: min(DF, bound), each shard stopping at the bound
        for bound in (1, 5, 40, 1000):
            got = dfstats.bounded_frequencies(cluster, index.name, surfaces, bound,
                                              dfstats.TEXT_FIELDS, batch=7)
            assert got == {norm[t]: min(len(in_text[t]), bound) for t in candidates}, bound
        # what apply counts for its policy gives the exact cap and the same decisions
        n = cluster.count(index.name)
        for basis in ("text", "both"):
            exact = enrich.term_table(cluster, index.name, basis).df
            assert not enrich.term_table(cluster, index.name, basis).bounded
            # an index this small: the aggregations, for apply too
            assert not enrich.term_table(cluster, index.name, basis, policies.Rank(3)).bounded
            for policy in [policies.Ratio(0.05), policies.Ratio(0.5), policies.Absolute(5),
                           policies.Absolute(100), policies.Rank(1), policies.Rank(3),
                           policies.Rank(10), policies.Rank(1000), policies.Rank(0),
                           policies.NoCap()]:
                table = enrich.term_table(cluster, index.name, basis, policy, bounded_from=0)
                cap = policy.cap(n, exact.values())
                assert table.bounded and policy.cap(n, table.df.values()) == cap, policy
                assert [policies.keeps(table.df.get(t, 0), cap) for t in exact] == \
                    [policies.keeps(df, cap) for df in exact.values()], policy
            # every word reaches the first bounds: exactly k of them, and all of them
            words = {norm[w]: w for w in vocab}
            for some, k, first, step in [(surfaces, 1, 2, 3), (surfaces, 5, 2, 2),
                                         (surfaces, 40, 3, 2), (surfaces, 10**4, 2, 3),
                                         (words, 8, 2, 2), (words, 100, 2, 3)]:
                top = dfstats.top_frequencies(cluster, index.name, some, k, basis,
                                              dfstats.TEXT_FIELDS, batch=7, first=first,
                                              step=step)
                want = sorted((exact[n] for n in some), reverse=True)[min(k, len(some)) - 1]
                assert sorted(top.values(), reverse=True)[min(k, len(top)) - 1] == want, k
                cap = policies.Rank(k).cap(n, (exact[n] for n in some))
                assert [policies.keeps(top[t], cap) for t in some] == \
                    [policies.keeps(exact[t], cap) for t in some], k
    finally:
        cluster.delete_index(index.name)


def test_phrase_terms_count_two_words_whole_and_exact(cluster: Engine,
                                                     index_settings: IndexSettings,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """An index made with phrase_terms indexes two-word phrases of the text and enriched
    fields as terms (index_phrases, said in _meta); its counts of one and two words go whole
    (the term dictionary) and are exact on 3 shards, under every DF basis — the counts of the
    same phrases by position in the same documents and proposals indexed without it — with
    stopwords and words the analyzer splits; apply's bounded term table is the same too."""
    index = index_settings.model_copy(update={"shards": 3, "replicas": 1, "phrase_terms": True})
    plain = index_settings.model_copy(update={"name": f"{index_settings.name}-plain"})
    cluster.create_index(index)
    cluster.create_index(plain)
    try:
        mapping = cluster.get_mapping(index.name)["properties"]
        assert mapping["contents"]["index_phrases"] and mapping["enriched"]["index_phrases"]
        assert cluster.get_meta(index.name)[PHRASE_TERMS_META] == ["contents", "enriched"]
        assert PHRASE_TERMS_META not in cluster.get_meta(plain.name)
        assert Layout.of(cluster.get_meta(index.name)).pair_fields == ("contents", "enriched")
        assert not Layout.of(cluster.get_meta(plain.name)).pair_fields
        # an index made when the setting covered the enriched field alone said so with true
        assert Layout.of({PHRASE_TERMS_META: True}).pair_fields == ("enriched",)
        rng = random.Random(5)
        vocab = ["alpha", "bravo", "charlie", "delta", "of", "the", "x-ray"]
        docs = [(f"d{i}", f"doc {i}", " ".join(rng.choice(vocab) for _ in range(5)))
                for i in range(150)]
        parts = ["alpha", "bravo charlie", "alpha of", "of the", "delta alpha", "x-ray alpha",
                 "charlie of delta", "alpha alpha", "doc alpha", "zulu", "bravo zulu"]
        # proposed for some documents whether or not their text has them (zulu never does)
        proposals = {d: rng.sample(parts, 2) for d, _, _ in docs[::3]}
        for name in (index.name, plain.name):
            load(cluster, name, docs)
            sources = cluster.mget(name, list(proposals), source=OWN.read())
            enrich.store_proposals(cluster, name, proposals, sources, model="m",
                                   prompt_version="p", stance="new+key")
            cluster.refresh(name)
        truth = {p: cluster.count(plain.name, {"match_phrase": {"enriched": p}}) for p in parts}
        assert 0 < truth["bravo charlie"] < truth["alpha"] and truth["zulu"] == 0
        surfaces = dict(zip(terms.normalize(cluster, index.name, parts), parts, strict=True))
        for bound in (1, 5, 40, 1000):
            got = dfstats.bounded_frequencies(cluster, index.name, {p: p for p in parts}, bound,
                                              dfstats.ENRICHED_FIELDS, batch=4,
                                              pair_fields=("enriched",))
            assert got == {p: min(df, bound) for p, df in truth.items()}, bound
            want = {basis: dfstats.bounded_frequencies(cluster, plain.name, surfaces, bound,
                                                       dfstats.TEXT_FIELDS, basis)
                    for basis in ("text", "both", "proposals")}
            zulu = next(n for n, p in surfaces.items() if p == "zulu")
            assert want["text"][zulu] == 0 < want["both"][zulu]  # proposed, never in a text
            for basis, counts in want.items():  # apply's counts, on the text field
                got = dfstats.bounded_frequencies(cluster, index.name, surfaces, bound,
                                                  dfstats.TEXT_FIELDS, basis, batch=4,
                                                  pair_fields=("contents",))
                assert got == counts, (basis, bound)
        n = cluster.count(index.name)
        for basis in ("text", "both"):
            exact = enrich.term_table(cluster, plain.name, basis).df
            for policy in (policies.Rank(1), policies.Rank(2), policies.Rank(5),
                           policies.Absolute(20)):
                got = enrich.term_table(cluster, index.name, basis, policy, bounded_from=0)
                cap = policy.cap(n, exact.values())
                assert got.bounded and policy.cap(n, got.df.values()) == cap, (basis, policy)
                assert {t: policies.keeps(df, cap) for t, df in got.df.items()} == \
                    {t: policies.keeps(df, cap) for t, df in exact.items()}, (basis, policy)
        # two words counted whole: a first round stopping at a low bound, then one whole
        # count for those that reached it; counted by position, they go round after round
        whole = {n: p for n, p in surfaces.items()
                 if p in ("bravo charlie", "delta alpha", "alpha alpha")}
        text_df = dfstats.document_frequencies(cluster, plain.name, whole, "text")
        assert len(whole) == 3 and min(text_df.values()) > 2
        requests: list[str] = []
        msearch = cluster.msearch
        monkeypatch.setattr(cluster, "msearch",
                            lambda name, bodies: requests.append(name) or msearch(name, bodies))
        top = dfstats.top_frequencies(cluster, index.name, whole, 2, "text",
                                      dfstats.TEXT_FIELDS, first=2, step=2,
                                      pair_fields=("contents",))
        assert top == text_df and len(requests) == 2
        requests.clear()
        dfstats.top_frequencies(cluster, plain.name, whole, 2, "text", dfstats.TEXT_FIELDS,
                                first=2, step=2)
        assert len(requests) > 2
    finally:
        cluster.delete_index(index.name)
        cluster.delete_index(plain.name)


@pytest.mark.parametrize("phrase_terms", [False, True])
def test_rank_counts_stop_only_where_they_must(engine: Engine, index_settings: IndexSettings,
                                               phrase_terms: bool) -> None:
    """On both engines, 3 shards: the rank policy's counts give the exact cap and every
    term's decision, words counted whole (after the first round) keep their whole DF past
    the bound, and only counts that stopped at the bound on some shard go again."""
    index = index_settings.model_copy(update={"shards": 3, "replicas": 0,
                                              "phrase_terms": phrase_terms})
    engine.create_index(index)
    try:
        rng = random.Random(3)
        vocab = ["alpha", "bravo", "charlie", "delta", "echo", "golf"]
        weights = [20, 10, 6, 3, 2, 1]
        # and two words tied at 50 documents below a phrase in 60: ranked, the phrase is
        # first, whatever its count so far, and the cap is 50 - 1
        tied = [(f"t{i}", "tied", "kilo lima mike mike" if i < 50 else "mike mike")
                for i in range(60)]
        load(engine, index.name, [(f"d{i}", f"doc {i}",
                                   " ".join(rng.choices(vocab, weights, k=4)))
                                  for i in range(120)] + tied)
        engine.refresh(index.name)
        phrases = vocab + ["alpha bravo", "bravo alpha", "alpha alpha", "golf echo",
                           "alpha bravo alpha", "x-ray"]
        surfaces = dict(zip(terms.normalize(engine, index.name, phrases), phrases, strict=True))
        exact = dfstats.document_frequencies(engine, index.name, surfaces, "text")
        pairs = Layout.of(engine.get_meta(index.name)).pair_fields
        n = engine.count(index.name)
        three = {"kilo": "kilo", "lima": "lima", "mike mike": "mike mike"}
        top = dfstats.top_frequencies(engine, index.name, three, 2, "text",
                                      dfstats.TEXT_FIELDS, first=2, step=2, pair_fields=pairs)
        assert policies.Rank(2).cap(n, top.values()) == 49 and top["mike mike"] > 49
        for k in (1, 2, 3, 5, 8, 100):
            top = dfstats.top_frequencies(engine, index.name, surfaces, k, "text",
                                          dfstats.TEXT_FIELDS, batch=5, first=2, step=2,
                                          pair_fields=pairs)
            cap = policies.Rank(k).cap(n, exact.values())
            assert policies.Rank(k).cap(n, top.values()) == cap, k
            assert {t: policies.keeps(df, cap) for t, df in top.items()} == \
                {t: policies.keeps(df, cap) for t, df in exact.items()}, k
            whole = [t for t, p in surfaces.items() if " " not in p and "-" not in p]
            assert all(top[t] == exact[t] for t in whole), k  # whole, past the bound
        got = dfstats.bounded_frequencies(engine, index.name, surfaces, 2, dfstats.TEXT_FIELDS,
                                          pair_fields=pairs)
        assert got == {t: min(df, 2) for t, df in exact.items()}
    finally:
        engine.delete_index(index.name)


def test_index_counts_bound_what_phrase_queries_find(engine: Engine,
                                                    index_settings: IndexSettings) -> None:
    """On both engines, 3 shards, with the deleted copies updates leave: a word's count from
    the term dictionaries is at least the documents its phrase query finds, in a plain field,
    a multi-field, a copy_to target and an object's field, and in several at once, words the
    analyzer splits (their rarest piece) and words after characters outside the BMP
    included; stopwords are left out, words whose pieces overlap (an analyzer that keeps the
    word beside its pieces: the phrase finds the pieces apart too), and every word of a field
    searched with an analyzer of its own (synonyms at search time, say, find more than the
    word's term)."""
    name = f"{index_settings.name}-counts"
    # a word kept beside its pieces: analysis-common's filter (the minimal Elasticsearch has
    # not that module)
    common = engine.capabilities.analysis == "english"
    analysis = {"filter": {"pieces": {"type": "word_delimiter_graph", "preserve_original": True},
                           "same": {"type": "synonym", "synonyms": ["car, automobile"]}},
                "analyzer": {"pieces": {"tokenizer": "whitespace",
                                        "filter": ["pieces", "lowercase"]},
                             "same": {"tokenizer": "standard",
                                      "filter": ["lowercase", "same"]}}}
    subfields = {"plain": {"type": "text", "analyzer": "standard"}}
    if common:
        subfields["pieces"] = {"type": "text", "analyzer": "pieces"}
        subfields["same"] = {"type": "text", "analyzer": "same"}  # synonyms: counted together
    engine.create(name, {
        "settings": {"number_of_shards": 3, "number_of_replicas": 0,
                     **({"analysis": analysis} if common else {})},
        "mappings": {"properties": {
            "body": {"type": "text", "analyzer": "stop", "copy_to": "all",
                     "fields": subfields},
            "meta": {"properties": {"note": {"type": "text"}}},
            "all": {"type": "text", "analyzer": "stop"},
            "searched": {"type": "text", "analyzer": "whitespace",
                         "search_analyzer": "simple"}}}})
    try:
        rng = random.Random(3)
        vocab = ["car", "automobile", "the", "alpha", "bravo", "cars", "x-ray", "ray", "x",
                 "\U0001d6fc\U0001d6fc\U0001d6fc", "\U0001d6fd-sheet"]

        def text(k: int) -> str:
            return " ".join(rng.choices(vocab, [5, 5, 3, 4, 2, 2, 1, 2, 2, 1, 1], k=k))

        docs = [{"_id": str(i), "body": text(3), "meta": {"note": text(2)},
                 "searched": text(2)} for i in range(150)]
        assert engine.bulk_index(name, docs).failed == 0
        engine.refresh(name)  # then half of them written again: deleted copies stay behind
        assert engine.bulk_update(name, [(str(i), {"body": text(3)})
                                         for i in range(0, 150, 2)]).failed == 0
        engine.refresh(name)
        split = ["x-ray", "\U0001d6fd-sheet"]
        words = ["car", "automobile", "the", "alpha", "bravo", "cars", *split, "zulu",
                 "\U0001d6fc\U0001d6fc\U0001d6fc", "\U0001d6fe-zulu"]
        for fields in (["body"], ["body.plain"], ["all"], ["meta.note"], ["body", "meta.note"],
                       *([["body.pieces"], ["body.same"]] if common else [])):
            counts = dfstats.index_counts(engine, name, words, fields, per_request=4)
            stopword = [] if {"body", "all"} & set(fields) else ["the"]  # the stop analyzer's
            pieces = [] if fields == ["body.pieces"] else [*split, "\U0001d6fe-zulu"]
            if fields == ["body.same"]:  # a word and its synonym: either one's documents
                plain = dfstats.index_counts(engine, name, ["car", "automobile"],
                                             ["body.plain"])
                assert counts["car"] == counts["automobile"] >= max(plain.values())
            assert sorted(counts) == sorted(["car", "automobile", "alpha", "bravo", "cars",
                                             "zulu", "\U0001d6fc\U0001d6fc\U0001d6fc",
                                             *stopword, *pieces]), fields
            for word, count in counts.items():
                found = engine.count(name, {"multi_match": {"query": word, "type": "phrase",
                                                            "fields": fields}})
                assert count >= found, (fields, word)
            assert counts["zulu"] == 0 and counts.get("\U0001d6fe-zulu", 0) == 0
            assert all(counts[w] > 0 for w in pieces if "zulu" not in w), fields
        assert dfstats.index_counts(engine, name, words, ["body", "searched"]) == {}
    finally:
        engine.delete_index(name)


def test_word_bounds_hold_and_spare_the_phrase_counts(engine: Engine,
                                                      index_settings: IndexSettings,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """On both engines, 3 shards: every term's DF lies in the range its words' counts and its
    proposals give — stopwords, words the analyzer splits, words found nowhere, one field or
    several — and with the ranges apply counts far fewer terms for the same cap and the same
    decision on every term, under every policy and basis."""
    index = index_settings.model_copy(update={"shards": 3, "replicas": 0})
    engine.create_index(index)
    try:
        rng = random.Random(8)
        vocab = ["alpha", "bravo", "charlie", "delta", "of", "the", "x-ray", "echo"]
        weights = [30, 20, 8, 4, 10, 10, 3, 1]
        docs = [(f"d{i}", " ".join(rng.choices(vocab, weights, k=2)),
                 " ".join(rng.choices(vocab, weights, k=6))) for i in range(240)]
        phrases = ["alpha", "bravo", "echo", "alpha bravo", "bravo alpha alpha", "of charlie",
                   "charlie delta", "x-ray", "x-ray alpha", "zulu", "zulu alpha",
                   "echo echo echo", "delta of bravo", "alpha alpha", "the bravo alpha"]
        proposals = {d: rng.sample(phrases, 3) for d, _, _ in docs[::2]}
        load(engine, index.name, docs)
        sources = engine.mget(index.name, list(proposals), source=OWN.read())
        enrich.store_proposals(engine, index.name, proposals, sources, model="m",
                               prompt_version="p", stance="new+key")
        engine.refresh(index.name)
        surfaces = dict(zip(terms.normalize(engine, index.name, phrases), phrases, strict=True))
        assert len(surfaces) == len(phrases)
        n = engine.count(index.name)
        proposed = dfstats.proposal_frequencies(engine, index.name)
        for fields in (dfstats.TEXT_FIELDS, ["title", "text"]):
            for basis in ("text", "both"):
                exact = dfstats.document_frequencies(engine, index.name, surfaces, basis,
                                                     fields=fields)
                for counted in (0, 2, len(surfaces)):  # one-word terms counted exactly
                    bounds = dfstats.word_bounds(engine, index.name, surfaces, basis, fields,
                                                 proposed, n, counted=counted)
                    ranges = {t: bounds.range(t, p) for t, p in surfaces.items()}
                    assert {t: low <= exact[t] <= high for t, (low, high) in ranges.items()} \
                        == dict.fromkeys(exact, True), (fields, basis, counted)
                    assert len(bounds.counted) == min(counted, 5)  # x-ray too: its pieces
                if fields == dfstats.TEXT_FIELDS and basis == "text":  # one word: exact
                    df = {p: exact[t] for t, p in surfaces.items()}
                    high = {p: ranges[t][1] for t, p in surfaces.items()}
                    one = [t for t, p in surfaces.items() if p in ("alpha", "zulu")]
                    assert [ranges[t] for t in one] == [(exact[t], exact[t]) for t in one]
                    # a phrase is in no more documents than its rarest word: none, with a
                    # word found nowhere; a stopword (also counted 0) bounds nothing
                    assert high["zulu alpha"] == 0 and df["zulu"] == 0
                    assert high["the bravo alpha"] == min(df["bravo"], df["alpha"]) < n
                    # the dictionaries count the copies the rewrites left: over alpha's DF
                    # and a level just above it; counted, alpha and the phrases with it
                    # lie under it
                    none = dfstats.word_bounds(engine, index.name, surfaces, basis, fields,
                                               proposed, n)
                    alpha = next(t for t, p in surfaces.items() if p == "alpha")
                    level = df["alpha"] + 1
                    assert none.range(alpha, "alpha")[1] >= level
                    for at in (1, 10, level, n):
                        tight = dfstats.exact_words(engine, index.name, none, surfaces, at,
                                                    fields)
                        spans = {t: tight.range(t, p) for t, p in surfaces.items()}
                        assert all(low <= exact[t] <= high for t, (low, high) in spans.items())
                        if at == level:
                            assert spans[alpha] == (df["alpha"], df["alpha"])
                            assert all(spans[t][1] < level
                                       for t, p in surfaces.items() if "alpha" in p.split())
                    # asked for two, the two most common one-word terms are counted
                    two = dfstats.word_bounds(engine, index.name, surfaces, basis, fields,
                                              proposed, n, counted=2)
                    assert set(two.counted) == {"alpha", "bravo"}
        sent: list[str] = []  # every search apply sends, as JSON
        msearch = engine.msearch
        monkeypatch.setattr(engine, "msearch", lambda name, bodies: sent.extend(
            json.dumps(b) for b in bodies) or msearch(name, bodies))
        rare = ["charlie delta", "of charlie", "echo echo echo", "delta of bravo"]
        for basis in ("text", "both"):
            exact = enrich.term_table(engine, index.name, basis).df
            for policy in (policies.Rank(1), policies.Rank(2), policies.Rank(3),
                           policies.Rank(50), policies.Absolute(10), policies.Ratio(0.5),
                           policies.Rank(0)):
                sent.clear()
                table = enrich.term_table(engine, index.name, basis, policy, bounded_from=0)
                cap = policy.cap(n, exact.values())
                assert table.bounded and policy.cap(n, table.df.values()) == cap, policy
                assert {t: policies.keeps(df, cap) for t, df in table.df.items()} == \
                    {t: policies.keeps(df, cap) for t, df in exact.items()}, (basis, policy)
                if isinstance(policy, policies.Rank) and cap is not None:
                    # from a first bound of 2: a phrase under the cap is counted once, up to
                    # the floor at once
                    layout = Layout.of(engine.get_meta(index.name))
                    fields = layout.phrase_fields(enriched=False)
                    bounds = dfstats.word_bounds(engine, index.name, surfaces, basis, fields,
                                                 proposed, n, counted=4 * policy.rank_k)
                    sent.clear()
                    top = dfstats.top_frequencies(engine, index.name, surfaces,
                                                  policy.rank_k, basis, fields, first=2,
                                                  step=2, pair_fields=layout.pair_fields,
                                                  bounds=bounds)
                    assert policy.cap(n, top.values()) == cap, policy
                    counted = {p: sum(f'"{p}"' in body for body in sent)
                               for t, p in surfaces.items() if " " in p and exact[t] <= cap}
                    assert max(counted.values(), default=0) <= 1, (basis, policy, counted)
                if policy in (policies.Rank(1), policies.Rank(2)):
                    # phrases of rare words are under the cap by their words' counts alone
                    assert not [p for p in rare if any(f'"{p}"' in body for body in sent)], \
                        (basis, policy)
    finally:
        engine.delete_index(index.name)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_ratio_cap_does_not_scale_rank_does(opensearch: Engine, index_settings: IndexSettings,
                                            tmp_path: Path) -> None:
    """The scaling bug: grow the collection with unrelated documents; a term whose DF did not
    change is admitted by the ratio policy, while the rank policy keeps rejecting it."""
    name = index_settings.name
    opensearch.create_index(index_settings)
    try:
        base = [(f"b{i}", f"note {i}", f"base document number {i}") for i in range(100)]
        load(opensearch, name, base)
        rows = []
        for i in range(100):
            terms = [f"specific{i}"]
            if i < 8:
                terms.append("kinase inhibitor")  # DF 8 in every state of the collection
            if i < 30:
                terms.append("study")  # an injected generic tag
            rows.append({"doc_id": f"b{i}", "terms": terms})
        settings = settings_for(index_settings, df_basis="proposals")
        batchfiles.import_proposals(opensearch, settings, write_jsonl(tmp_path / "p.jsonl", rows))

        def kept(policy: policies.Policy) -> list[str]:
            enrich.apply(opensearch, settings, policy)
            doc = opensearch.get(name, "b0")
            return sorted(doc["sira"].get("echo", []) + doc["sira"].get("bridge", []))

        ratio, rank = policies.make("ratio", ratio=0.05), policies.make("rank", rank_k=2)
        assert kept(ratio) == ["specific0"]  # cap 5: both common terms dropped
        assert kept(rank) == ["specific0"]

        noise = [(f"n{i}", f"other {i}", f"unrelated text {i}") for i in range(600)]
        load(opensearch, name, noise)
        more = [{"doc_id": f"n{i}", "terms": [f"noise{i}"]} for i in range(600)]
        batchfiles.import_proposals(opensearch, settings,
                                    write_jsonl(tmp_path / "n.jsonl", more))
        assert kept(ratio) == ["kinase inhibitor", "specific0", "study"]  # cap 35 admits them
        assert kept(rank) == ["specific0"]  # still the two most common terms
        stats = enrich.stats(opensearch, settings.model_copy(update={
            "enrich": settings.enrich.model_copy(update={"rank_k": 2})}))
        assert stats["documents"] == 700 and stats["distinct_terms"] == 702
        assert stats["policies"]["rank K=2"]["distinct_terms_dropped"] == 2
        assert stats["policies"]["ratio 0.05"]["distinct_terms_dropped"] == 0
        assert stats["df_histogram"]["1"] == 700
    finally:
        opensearch.delete_index(name)


def test_batch_output_and_plain_jsonl_store_the_same(engine: Engine, index_settings: IndexSettings,
                                                     tmp_path: Path) -> None:
    docs = DOCS[:2]
    names = [index_settings.name + "-a", index_settings.name + "-b"]
    settings = [settings_for(index_settings.model_copy(update={"name": n})) for n in names]
    for s in settings:
        engine.create_index(s.index)
        load(engine, s.index.name, docs)
    try:
        exported = batchfiles.export_batch(engine, settings[0], tmp_path / "requests.jsonl")
        requests = [json.loads(line) for line in (tmp_path / "requests.jsonl").open()]
        assert exported == 2 and [r["custom_id"] for r in requests] == ["heap", "snap"]
        assert requests[0]["url"] == "/v1/chat/completions"
        assert requests[0]["body"]["response_format"]["type"] == "json_schema"
        assert "Heap sizing" in requests[0]["body"]["messages"][1]["content"]

        terms = {"heap": ["JVM heap", "garbage collector"], "snap": ["S3 backup"]}
        batch_out = [{"id": f"r{i}", "custom_id": doc_id, "error": None, "response": {
            "status_code": 200, "body": {"model": "m1", "choices": [{
                "index": 0, "finish_reason": "stop",
                "message": {"role": "assistant", "content": json.dumps({"keywords": t})}}]}}}
            for i, (doc_id, t) in enumerate(terms.items())]
        plain = [{"doc_id": d, "terms": t, "model": "m1"} for d, t in terms.items()]
        a = batchfiles.import_proposals(engine, settings[0],
                                        write_jsonl(tmp_path / "out.jsonl", batch_out))
        b = batchfiles.import_proposals(engine, settings[1],
                                        write_jsonl(tmp_path / "plain.jsonl", plain))
        assert a.stored == b.stored == 2

        def stored(name: str, doc_id: str) -> dict:
            doc = engine.get(name, doc_id)
            doc["sira"]["proposals"].pop("at")
            return {"sira": {k: doc["sira"][k] for k in (
                "proposals", "proposed_terms", "model", "prompt_version", "status")}}

        for doc_id in terms:
            assert stored(names[0], doc_id) == stored(names[1], doc_id)

        bad = tmp_path / "bad.jsonl"
        bad.write_text('{"doc_id": "heap", "terms": ["x"]}\n{"doc_id": "nope", "terms": ["y"]}\n'
                       '{"doc_id": "snap", "terms": "not a list"}\n{broken\n')
        report = batchfiles.import_proposals(engine, settings[0], bad).report
        problems = {p.line: p.reason for p in report.problems}
        assert problems == {2: "unknown document id", 3: problems[3], 4: problems[4]}
        assert "terms" in problems[3] and "broken JSON" in problems[4]
    finally:
        for n in names:
            engine.delete_index(n)


def test_the_cache_keeps_terms_for_the_analysis_that_made_them(
        engine: Engine, fresh_index: IndexSettings, model: StandInModel,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Proposals restored from the cache into an index analysed the same way are stored as
    they were prepared, with no ``_analyze``; into an index analysed otherwise they are
    normalised and classified again against it."""
    from pipeline import attach
    from pipeline.cache import ProposalCache

    cache = f"test-cache-{fresh_index.name}"
    settings = settings_for(fresh_index, model, policy="none", cache_index=cache)
    docs = [d for d in DOCS if d[0] in ("heap", "snap")]
    same = fresh_index.model_copy(update={"name": f"{fresh_index.name}-same"})
    other = f"{fresh_index.name}-standard"
    try:
        load(engine, fresh_index.name, docs)
        assert enrich.propose(engine, settings, client_for(settings)).proposed == 2
        engine.refresh(cache)
        made = {d: engine.get(fresh_index.name, d)["sira"]["proposals"]["terms"]
                for d, _, _ in docs}
        key = terms.analysis_key(engine, fresh_index.name)
        entries = ProposalCache(engine, cache).lookup(
            {d: OWN.content_hash(engine.get(fresh_index.name, d)) for d in made},
            enrich.prompt_for(settings).version, "test-model", key)
        assert {d: e.terms for d, e in entries.items()} == made

        analysed = []
        real_analyze = engine.analyze
        monkeypatch.setattr(engine, "analyze", lambda *a, **k: analysed.append(a) or
                            real_analyze(*a, **k))
        # the same text in a new index of the same layout: no model, no _analyze
        same_settings = settings.model_copy(update={"index": same,
                                                   "llm": LLMSettings(model="test-model")})
        engine.create_index(same)
        load(engine, same.name, docs)
        restored = enrich.propose(engine, same_settings, None)
        assert (restored.cached, restored.model_calls, analysed) == (2, 0, [])
        assert {d: engine.get(same.name, d)["sira"]["proposals"]["terms"] for d in made} == made

        # the same text in an index whose text is analysed by `standard` (no stemming)
        engine.create(other, {"mappings": {"properties": {
            "title": {"type": "text", "analyzer": "standard"},
            "text": {"type": "text", "analyzer": "standard"}}}})
        engine.bulk_index(other, [{"_id": d, "title": t, "text": x} for d, t, x in docs])
        engine.refresh(other)
        attach.attach(engine, other, ["title", "text"],
                      prompt_version=enrich.prompt_for(settings).version,
                      policy={"kind": "none"}, template=False)
        assert terms.analysis_key(engine, other) != key
        other_settings = same_settings.model_copy(update={
            "index": IndexSettings(name=other)})
        assert enrich.propose(engine, other_settings, None).cached == 2
        assert analysed, "restored into another analysis without analysing again"
        norms = {t["norm"] for t in engine.get(other, "heap")["sira"]["proposals"]["terms"]}
        assert "garbage collector" in norms  # standard: not stemmed
        assert "garbag collector" in {t["norm"] for t in made["heap"]}  # english: stemmed
    finally:
        for name in (cache, same.name, other):
            engine.delete_index(name)
