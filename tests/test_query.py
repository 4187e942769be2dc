"""The query side against real engines: the stored template, DF validation of sketches, the
two-clause query, caller phrasings, and a model that times out."""

from __future__ import annotations

import json
import random
import uuid
from collections.abc import Iterator

import pytest

from pipeline import dfstats, enrich, query, terms
from pipeline.bench.stand_in import StandInModel
from pipeline.config import EnrichSettings, IndexSettings, LLMSettings, Settings
from pipeline.engine import Engine
from pipeline.llm import ModelClient
from pipeline.loaders import Document
from pipeline.schema import OWN

DOCS = [
    ("heap", "Heap sizing", "Give the JVM half of the memory and keep it under 31 GB."),
    ("disk", "Disk watermarks", "Past the flood stage the index becomes read only."),
    ("bulk", "Bulk indexing", "Send bulk requests and back off on 429 responses."),
    ("snap", "Snapshots", "Register a repository and take snapshots to object storage."),
    ("merge", "Force merge", "Merge segments of read only indices to save memory."),
]
PROPOSALS = {"heap": ["garbage collection", "Xmx"], "disk": ["disk full", "read-only block"],
             "bulk": ["throttling"], "snap": ["backup", "S3"], "merge": ["segment count"]}


def build(engine: Engine, name: str, shards: int = 1) -> Settings:
    settings = Settings(index=IndexSettings(name=name, shards=shards),
                        enrich=EnrichSettings(policy="none"))
    engine.create_index(settings.index)
    engine.bulk_index(name, [Document(i, t, x).to_index() for i, t, x in DOCS])
    engine.refresh(name)
    sources = engine.mget(name, list(PROPOSALS), source=OWN.read())
    enrich.store_proposals(engine, name, PROPOSALS, sources, model="m", prompt_version="p",
                           stance="new+key")
    enrich.apply(engine, settings)
    return settings


@pytest.fixture
def enriched(engine: Engine) -> Iterator[tuple[Engine, Settings]]:
    name = f"test-q-{uuid.uuid4().hex[:8]}"
    settings = build(engine, name)
    yield engine, settings
    engine.delete_index(name)


def ids(result: query.SearchResult) -> list[str]:
    return [h.id for h in result.hits]


INJECTIONS = [
    'read "only" index',
    "memory \\ back\\slash",
    "{braces} } { memory",
    "{{size}} {{#w}}x{{/w}} memory }}",
    "line one\nread only\r\n\tindex",
]


def numbers_as_numbers(body: object) -> object:
    """A rendered template writes ``size`` and ``boost`` as strings (the engine accepts both)."""
    if isinstance(body, dict):
        return {k: float(v) if k in ("size", "boost") else numbers_as_numbers(v)
                for k, v in body.items()}
    if isinstance(body, list):
        return [numbers_as_numbers(v) for v in body]
    return body


def test_template_matches_python_query_and_resists_injection(enriched: tuple[Engine, Settings]
                                                             ) -> None:
    engine, settings = enriched
    index = settings.index.name
    if not engine.capabilities.search_templates:
        with pytest.raises(Exception, match="mustache|script_lang|lang"):
            query.install_template(engine)
        # the Python path, which the CLI and bench use, works without templates
        assert ids(query.search(engine, settings, "read only index"))[:1] == ["disk"]
        return
    query.install_template(engine)
    cases = [("read only index", [], "both"), ("memory", ["garbage collection"], "both"),
             ("memory", ["backup", "S3"], "bridge"), ("bulk", ["disk full"], "echo")]
    cases += [(text, ["backup"], "both") for text in INJECTIONS]
    cases += [("memory", ["backup", text], "both") for text in INJECTIONS]  # in the sketch too
    for text, phrases, classes in cases:
        expansion = query.expansion_terms(terms.normalize(engine, index, phrases))
        as_typed = query.template_params(text, w=0.7, size=5, classes=classes, phrases=phrases)
        for named in (False, True):
            as_sent = query.template_params(text, expansion, w=0.7, size=5, classes=classes,
                                            named=named)
            rendered = engine.render_search_template(query.TEMPLATE_ID, as_sent)
            python = query.build_query(text, expansion, w=0.7, size=5, classes=classes,
                                       named=named)
            literal = rendered["query"]["bool"]["should"][0]["multi_match"]
            assert literal["query"] == text  # the text arrives as text, whatever it holds
            assert numbers_as_numbers(rendered) == python
        via_python = engine.search(index, python)["hits"]["hits"]
        for params in (as_sent, as_typed):  # analysed terms, or phrases the engine analyses
            via_template = engine.search_template(index, query.TEMPLATE_ID, params)
            assert [(h["_id"], round(h["_score"], 4)) for h in via_template["hits"]["hits"]] \
                == [(h["_id"], round(h["_score"], 4)) for h in via_python], (text, phrases)
    typed = query.template_params("memory", phrases=["garbage collection", "backup"], named=True)
    named = engine.search_template(index, query.TEMPLATE_ID, typed)["hits"]["hits"]
    assert {h["_id"]: sorted(h["matched_queries"]) for h in named}["heap"] == \
        ["expansion:garbage collection", "literal"]
    assert [h["_id"] for h in engine.search_template(
        index, query.TEMPLATE_ID, query.template_params(INJECTIONS[0]))["hits"]["hits"]][0] \
        == "disk"


def test_w_zero_is_plain_bm25_and_expansion_helps(enriched: tuple[Engine, Settings]) -> None:
    engine, settings = enriched
    index = settings.index.name
    plain = engine.search(index, {"query": {"multi_match": {
        "query": "memory", "type": "most_fields",
        "fields": ["sira.echo", "sira.bridge", "contents"]}}})["hits"]["hits"]
    zero = query.search(engine, settings, "memory", expansion=["backup"], w=0.0)
    assert [(h.id, round(h.score, 5)) for h in zero.hits] == \
        [(h["_id"], round(h["_score"], 5)) for h in plain]
    assert ids(zero)[:2] == ["heap", "merge"] or ids(zero)[:2] == ["merge", "heap"]
    expanded = query.search(engine, settings, "memory", expansion=["backup"], w=2.0)
    assert "snap" in ids(expanded)  # found through the bridge term "backup" only
    assert "snap" not in ids(zero)


def test_enrichment_classes_and_explain(enriched: tuple[Engine, Settings]) -> None:
    engine, settings = enriched
    assert ids(query.search(engine, settings, "garbage collection"))[:1] == ["heap"]
    assert ids(query.search(engine, settings, "garbage collection", classes="none")) == []
    hit = query.search(engine, settings, "garbage collection memory", explain=True).hits[0]
    assert hit.id == "heap" and hit.matched_queries == ["literal"]
    assert set(hit.matched_terms) == {"sira.bridge", "contents"}
    assert hit.matched_terms["contents"] == ["memori"] if engine.capabilities.stemming \
        else hit.matched_terms["contents"] == ["memory"]
    # each sketch term says whether it matched, whichever clause comes last
    explained = query.search(engine, settings, "object storage",
                             expansion=["backup", "disk full"], explain=True)
    snap = next(h for h in explained.hits if h.id == "snap")
    assert sorted(snap.matched_queries) == ["expansion:backup", "literal"]
    assert sorted(next(h for h in explained.hits if h.id == "disk").matched_queries) == \
        ["expansion:disk", "expansion:full"]
    plain = query.search(engine, settings, "object storage", expansion=["backup", "disk full"])
    assert [h.matched_queries for h in plain.hits] == [[] for _ in plain.hits]  # no names asked
    budget = query.search(engine, settings, "object storage", expansion=["backup", "disk full"],
                          max_sketch_terms=1)
    assert budget.expansion == ["backup"] and "disk" not in ids(budget)
    assert [d.term for d in budget.dropped] == ["disk full"]


def test_caller_phrasings_are_fused(enriched: tuple[Engine, Settings]) -> None:
    engine, settings = enriched
    alone = query.search(engine, settings, "object storage")
    fused = query.search(engine, settings, "object storage", also=["flood stage"])
    assert ids(alone) == ["snap"]
    assert set(ids(fused)) == {"snap", "disk"}
    assert fused.hits[0].score == pytest.approx(fused.hits[1].score)  # equal weight, rank 1


def test_validation_on_a_multi_shard_index(cluster: Engine) -> None:
    name = f"test-v-{uuid.uuid4().hex[:8]}"
    build(cluster, name, shards=3)
    try:
        kept, dropped, searched = query.validate(cluster, name, [
            "memory", "read only", "zebra crossing", "the of", "Xmx heap", "MEMORY"],
            cap=1, max_n=2)
        reasons = {d.term: d.reason for d in dropped}
        assert kept == ["Xmx heap"]  # "xmx" is in one document's enrichment: 0 < DF <= 1
        assert searched == {"xmx": 1, "heap": 1}  # what the search sends: analysed terms
        assert reasons["memory"] == "too common (DF > cap 1)"
        assert reasons["read only"].startswith("too common")
        assert reasons["zebra crossing"] == "not in the index (DF 0)"
        assert "stopwords" in reasons["the of"]
        assert reasons["MEMORY"] == "duplicate"
        kept, _, searched = query.validate(cluster, name, ["read only", "memory", "only"],
                                           cap=None, max_n=2)
        assert kept == ["read only", "memory", "only"]
        assert searched == query.expansion_terms(terms.normalize(cluster, name, kept))
        assert sorted(searched.values()) == [1, 1, 2]  # a term in two phrases counts twice
        # a budget of sketch terms takes whole phrases in order, skipping one that would go over
        kept, dropped, searched = query.validate(
            cluster, name, ["read only", "memory", "only", "Xmx heap"], cap=None, max_n=2,
            max_sketch_terms=2)
        assert kept == ["read only", "only"] and len(searched) == 2
        assert {d.term: d.reason for d in dropped} == {
            "memory": "over the budget of 2 sketch terms",
            "Xmx heap": "over the budget of 2 sketch terms"}
        # many sketches at once (the bench) decide each one as it would be decided alone
        sketches = {"a": ["memory", "Xmx heap", "MEMORY"], "b": ["backup", "the of", "memory"]}
        many = query.validate_many(cluster, name, sketches, cap=1, max_n=2)
        assert many == {key: query.validate(cluster, name, phrases, cap=1, max_n=2)
                        for key, phrases in sketches.items()}
        assert many["b"][0] == ["backup"]
    finally:
        cluster.delete_index(name)


def test_validation_reads_the_term_dictionary_only_where_it_counts_exactly(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """One shard with no deleted copies: validation analyses and counts its words with one
    read of the term dictionary (no count search where a word decides) and decides every
    phrase as the count searches do; once a deleted copy holds a word (an update not merged
    away), the dictionary would still count it, so validation counts with searches again."""
    name = f"test-vd-{uuid.uuid4().hex[:8]}"
    engine.create_index(IndexSettings(name=name, shards=1))
    try:
        engine.bulk_index(name, [Document(i, t, x).to_index() for i, t, x in [
            ("g", "Giraffes", "The giraffe's neck is long."),
            ("z", "Zebras", "Zebra stripes confuse flies."),
            ("l", "Lions", "A lion pride hunts at night; the lion rests by day."),
            ("n", "Night", "Night hunts of the pride."),
            ("x", "X-rays", "An x-ray of a lion."),
        ]])
        engine.refresh(name)
        assert engine.deleted_copies(name) == 0
        sketch = ["giraffes", "Zebra crossing", "the of", "Lion Pride", "LION PRIDE",
                  "x-ray lion", "night hunts", "okapi", "lion"]
        calls: list[str] = []
        for method in ("msearch", "term_statistics", "analyze"):
            real = getattr(engine, method)
            monkeypatch.setattr(engine, method, lambda *a, real=real, method=method, **k:
                                calls.append(method) or real(*a, **k))
        reading = dfstats.dictionary_tokens
        for cap in (None, 3, 2, 1):
            monkeypatch.setattr(dfstats, "dictionary_tokens", lambda *a: None)
            counted = query.validate(engine, name, sketch, cap, max_n=2)
            monkeypatch.setattr(dfstats, "dictionary_tokens", reading)
            query.validate(engine, name, sketch, cap, max_n=2)  # the first look: exact
            assert dfstats.reads_dictionary(engine, name)
            calls.clear()
            read = query.validate(engine, name, sketch, cap, max_n=2)
            assert read == counted, cap
            assert "term_statistics" in calls and "analyze" not in calls, cap
        # cap 1: "lion" and "pride" are in two documents each, "lion pride" in one
        assert read.kept == ["giraffes", "Zebra crossing", "Lion Pride", "x-ray lion",
                             "night hunts"]
        assert {d.term: d.reason for d in read.dropped} == {
            "the of": "nothing left after analysis (stopwords only)",
            "LION PRIDE": "duplicate", "okapi": "not in the index (DF 0)",
            "lion": "too common (DF > cap 1)"}
        assert read.terms == query.expansion_terms(terms.normalize(engine, name, read.kept))
        calls.clear()
        query.validate(engine, name, ["giraffes", "zebra", "okapi"], 3, max_n=2)
        assert calls == ["term_statistics"]  # every word decides: nothing counted
        # the only document with "zebra" no longer has it; its old copy is deleted, not gone
        engine.bulk_index(name, [Document("z", "Stripes", "Stripes confuse flies.").to_index()])
        engine.refresh(name)
        assert engine.deleted_copies(name) == 1
        query.validate(engine, name, ["zebra"], 3, max_n=2)
        assert not dfstats.reads_dictionary(engine, name)
        for _ in range(3):
            calls.clear()
            got = query.validate(engine, name, ["zebra", "giraffes"], 3, max_n=2)
            assert got.kept == ["giraffes"], (calls, dfstats._EXACT_DICTIONARY)
            assert {d.term: d.reason for d in got.dropped} == {
                "zebra": "not in the index (DF 0)"}
            assert "msearch" in calls
    finally:
        engine.delete_index(name)


@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize("phrase_terms", [False, True])
def test_validation_counts_a_phrase_only_where_no_word_decides(
        engine: Engine, phrase_terms: bool, shards: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On both engines, 1 shard (words read from the term dictionary where phrase terms are
    off) and 3: validation decides every phrase as the exact DF of each
    part would (filters aggregation), under caps from none to past the collection, while a
    phrase one of whose words (from the term dictionary) qualifies, or with a word found
    nowhere, is never counted as a phrase (those counts walk their words' postings);
    stopwords and words the analyzer splits included."""
    name = f"test-vw-{uuid.uuid4().hex[:8]}"
    engine.create_index(IndexSettings(name=name, shards=shards, phrase_terms=phrase_terms))
    try:
        rng = random.Random(3)
        vocab = ["alpha", "bravo", "charlie", "delta", "echo", "of", "the", "x-ray"]
        weights = [40, 25, 8, 3, 1, 10, 10, 3]
        engine.bulk_index(name, [Document(f"d{i}", " ".join(rng.choices(vocab, weights, k=2)),
                                          " ".join(rng.choices(vocab, weights, k=6))).to_index()
                                 for i in range(240)])
        engine.refresh(name)
        phrases = ["delta alpha", "alpha bravo", "zulu alpha", "zulu yankee", "alpha x-ray",
                   "bravo the", "echo", "alpha", "charlie delta", "x-ray zulu", "Alpha Bravo"]
        parts = {p: terms.ngrams(terms.words(p), 2) for p in phrases}
        exact = dfstats.document_frequencies(
            engine, name, {q.lower(): q for ps in parts.values() for q in ps}, "text",
            fields=dfstats.ENRICHED_FIELDS)
        order = [exact[w] for w in ("echo", "delta", "charlie", "bravo", "alpha")]
        assert 0 < order[0] and order == sorted(set(order))
        sent: list[str] = []
        msearch = engine.msearch
        monkeypatch.setattr(engine, "msearch", lambda index, bodies: sent.extend(
            json.dumps(b) for b in bodies) or msearch(index, bodies))
        pairs = ("enriched",) if phrase_terms else ()
        for cap in (None, 1, exact["delta"], exact["charlie"], exact["bravo"] - 1, 1000):
            sent.clear()
            got = query.validate(engine, name, phrases, cap, 2, pair_fields=pairs)
            want_kept, want_dropped = [], {}
            for phrase in phrases[:-1]:  # the last one repeats the second
                dfs = [exact[q.lower()] for q in parts[phrase]]
                if any(0 < d and (cap is None or d <= cap) for d in dfs):
                    want_kept.append(phrase)
                else:
                    want_dropped[phrase] = ("not in the index (DF 0)" if not any(dfs)
                                            else f"too common (DF > cap {cap})")
            assert got.kept == want_kept, cap
            assert {d.term: d.reason for d in got.dropped} == \
                want_dropped | {"Alpha Bravo": "duplicate"}, cap
            # phrase counts, not a two-word term's count from the dictionary
            counted = {q for ps in parts.values() for q in ps if len(q.split()) > 1
                       and any(f'"{q}"' in body for body in sent)
                       and not (phrase_terms and dfstats.dictionary_words(q))}
            decided_by_a_word = {q for p, ps in parts.items() for q in ps if len(q.split()) > 1
                                 and any(0 < exact[w.lower()] and (cap is None or
                                                                   exact[w.lower()] <= cap)
                                         for w in q.split() if dfstats.dictionary_words(w))}
            assert not counted & (decided_by_a_word | {"zulu alpha", "zulu yankee",
                                                       "x-ray zulu"}), cap
            if cap == exact["bravo"] - 1 and not phrase_terms:
                assert "alpha bravo" in counted  # both words too common: its count decides
        # one shard written once: its term dictionary counts exactly; three: never read
        assert dfstats.reads_dictionary(engine, name) == (shards == 1 and not phrase_terms)
    finally:
        engine.delete_index(name)


def test_model_timeout_falls_back_to_plain_search(enriched: tuple[Engine, Settings]) -> None:
    engine, settings = enriched
    answers = {"": ["garbage collection", "unknown term"]}
    with StandInModel(answers, slow_seconds=2.0) as model:
        llm = LLMSettings(url=model.url, read_timeout=0.5, max_attempts=1)
        fast = ModelClient(llm, backoff=0.01)
        slow_query = "FAULT:slow how much memory"
        result = query.search(engine, settings, slow_query, expand=True, client=fast)
        assert result.expansion == [] and result.sketch is None
        assert "expansion skipped" in result.expansion_note
        assert "timed out" in result.expansion_note
        plain = query.search(engine, settings, slow_query)
        assert ids(result) == ids(plain) and ids(plain)

        model.answers = {"": ["garbage collection", "unknown term"]}
        ok = query.search(engine, settings, "how much memory", expand=True, client=fast)
        assert ok.sketch == ["garbage collection", "unknown term"]
        assert ok.expansion == ["garbage collection"]
        assert [d.term for d in ok.dropped] == ["unknown term"]
        assert ids(ok)[0] == "heap"
