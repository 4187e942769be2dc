"""The engine adapter and the mappings against real OpenSearch and Elasticsearch servers."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import EngineFarm

from pipeline.config import IndexSettings
from pipeline.engine import META_LOCK_INDEX, Engine, MetaBusy, describe_error

DOCS = [
    {"_id": "d1", "title": "Running dogs", "text": "The dog's owners were running in the park."},
    {"_id": "d2", "title": "Cats", "text": "Cats sleep most of the day."},
    {"_id": "d3", "title": "Lung cancer", "text": "Screening for lung cancer in smokers."},
]


def test_index_created_from_mappings(engine: Engine, fresh_index: IndexSettings) -> None:
    mapping = engine.get_mapping(fresh_index.name)
    props = mapping["properties"]
    assert mapping["dynamic"] == "strict"
    sira = props["sira"]["properties"]
    for field in (props["title"], props["text"], props["contents"], sira["echo"],
                  sira["bridge"]):
        assert field["type"] == "text"
        assert field["similarity"] == "sira_bm25"
    assert sira["echo"]["copy_to"] == sira["bridge"]["copy_to"] == ["enriched"]
    assert sira["proposed_terms"]["type"] == "keyword"
    assert sira["proposals"]["enabled"] is False
    assert props["sira"]["properties"]["content_hash"]["type"] == "keyword"
    assert props["sira"]["properties"]["enriched_at"]["type"] == "date"


def test_bm25_parameters_come_from_settings(engine: Engine, index_settings: IndexSettings
                                            ) -> None:
    settings = index_settings.model_copy(update={"bm25_k1": 0.9, "bm25_b": 0.4})
    engine.create_index(settings)
    try:
        got = engine.client.indices.get_settings(index=settings.name)[settings.name]
        similarity = got["settings"]["index"]["similarity"]["sira_bm25"]
        assert (float(similarity["k1"]), float(similarity["b"])) == (0.9, 0.4)
    finally:
        engine.delete_index(settings.name)


def test_analysis_follows_engine_capabilities(engine: Engine, fresh_index: IndexSettings
                                              ) -> None:
    # OpenSearch has analysis-common; the minimal Elasticsearch gets the project's plugin
    expected = {"opensearch": "english", "elasticsearch": "english-plugin"}[engine.kind]
    assert engine.capabilities.analysis == expected
    tokens = engine.analyze(fresh_index.name, ["The dog's owners were running"],
                            analyzer="sira_english")
    assert tokens == [["dog", "owner", "were", "run"]]  # the same on both engines


def test_analyze_batches_texts_and_splits_them_back(engine: Engine, fresh_index: IndexSettings
                                                    ) -> None:
    texts = ["Lung Cancer", "", "the of", "screening programme", "x"]
    batched = engine.analyze(fresh_index.name, texts, analyzer="sira_english")
    one_by_one = [engine.analyze(fresh_index.name, [t], analyzer="sira_english")[0]
                  for t in texts]
    assert batched == one_by_one
    assert batched[1] == [] and batched[2] == []


def test_bulk_counts_and_reports_rejected_items(engine: Engine, fresh_index: IndexSettings
                                                ) -> None:
    docs = [*DOCS, {"_id": "bad", "title": "x", "not_in_mapping": 1},
            {"_id": "bad-date", "title": "y", "sira": {"indexed_at": "not a date"}}]
    result = engine.bulk_index(fresh_index.name, docs, chunk_size=2)
    assert result.ok == 3
    assert sorted(f.id for f in result.failures) == ["bad", "bad-date"]
    by_id = {f.id: f for f in result.failures}
    assert by_id["bad"].status == 400 and "not_in_mapping" in by_id["bad"].reason
    assert "indexed_at" in by_id["bad-date"].reason
    engine.refresh(fresh_index.name)
    assert engine.count(fresh_index.name) == 3


def test_partial_update_merges_and_reports_missing(engine: Engine, fresh_index: IndexSettings
                                                   ) -> None:
    engine.bulk_index(fresh_index.name, DOCS)
    result = engine.bulk_update(fresh_index.name, [
        ("d1", {"sira": {"proposed_terms": ["canine exercise"], "status": "proposed"}}),
        ("missing", {"sira": {"proposed_terms": ["x"]}}),
    ])
    assert result.ok == 1
    assert [(f.id, f.status) for f in result.failures] == [("missing", 404)]
    stored = engine.get(fresh_index.name, "d1")
    assert stored["title"] == "Running dogs"  # untouched fields stay
    assert stored["sira"]["proposed_terms"] == ["canine exercise"]
    assert stored["sira"]["status"] == "proposed"
    assert engine.get(fresh_index.name, "missing") is None
    # what the job bench counts as writes: every document indexed, every update applied
    assert engine.writes(fresh_index.name) == len(DOCS) + 1
    engine.refresh(fresh_index.name)
    assert engine.size(fresh_index.name) > sum(len(str(d)) for d in DOCS)  # what bench-scale shows


def test_force_merge_drops_deleted_copies_on_elasticsearch(elasticsearch: Engine,
                                                            index_settings: IndexSettings
                                                            ) -> None:
    # (OpenSearch: through `sira refilter --force-merge` and the job, in test_cli / test_jobs)
    elasticsearch.create_index(index_settings)
    try:
        elasticsearch.bulk_index(index_settings.name, DOCS)
        elasticsearch.bulk_update(index_settings.name,
                                  [(d["_id"], {"sira": {"proposed_terms": ["x"]}})
                                   for d in DOCS])
        elasticsearch.refresh(index_settings.name)
        assert elasticsearch.segments(index_settings.name)["deleted_docs"] > 0
        assert elasticsearch.force_merge(index_settings.name) == \
            {"segments": 1, "deleted_docs": 0}
        assert elasticsearch.get(index_settings.name, "d1")["sira"]["proposed_terms"] == ["x"]
    finally:
        elasticsearch.delete_index(index_settings.name)


def test_search_and_aggregations(engine: Engine, fresh_index: IndexSettings) -> None:
    docs = [dict(d, sira={"proposed_terms": terms}) for d, terms in
            zip(DOCS, [["pets", "exercise"], ["pets"], ["oncology"]], strict=True)]
    engine.bulk_index(fresh_index.name, docs)
    engine.refresh(fresh_index.name)
    hits = engine.search(fresh_index.name, {"query": {"match": {"contents": "lung screening"}}})
    assert [h["_id"] for h in hits["hits"]["hits"]] == ["d3"]
    aggs = engine.aggregate(fresh_index.name,
                            {"tags": {"terms": {"field": "sira.proposed_terms"}}})
    counts = {b["key"]: b["doc_count"] for b in aggs["tags"]["buckets"]}
    assert counts == {"pets": 2, "exercise": 1, "oncology": 1}
    responses = engine.msearch(fresh_index.name, [
        {"size": 0, "track_total_hits": True, "query": {"term": {"contents": term}}}
        for term in ("cat", "cats", "lung")
    ])
    totals = [r["hits"]["total"]["value"] for r in responses]
    stem = engine.capabilities.stemming
    assert totals == ([1, 0, 1] if stem else [0, 1, 1])


def test_search_templates_where_supported(engine: Engine, fresh_index: IndexSettings) -> None:
    engine.bulk_index(fresh_index.name, DOCS)
    engine.refresh(fresh_index.name)
    # strings: "{{q}}" (mustache here escapes for JSON); toJson is for lists and objects
    source = '{"query": {"match": {"contents": "{{q}}"}}, "size": {{#toJson}}size{{/toJson}}}'
    if not engine.capabilities.search_templates:
        # the minimal Elasticsearch distribution has no lang-mustache module
        with pytest.raises(Exception, match="mustache|script_lang|lang"):
            engine.put_search_template("test-template", source)
        return
    engine.put_search_template("test-template", source)
    rendered = engine.render_search_template("test-template", {"q": 'lung "cancer"', "size": 3})
    assert rendered == {"query": {"match": {"contents": 'lung "cancer"'}}, "size": 3}
    found = engine.search_template(fresh_index.name, "test-template", {"q": "cats", "size": 5})
    assert [h["_id"] for h in found["hits"]["hits"]] == ["d2"]


@pytest.mark.parametrize("block", ["index.blocks.write",
                                   "index.blocks.read_only_allow_delete"])  # a full disk's
def test_write_refused_names_a_block_and_writes_nothing(engine: Engine, fresh_index: IndexSettings,
                                                        block: str) -> None:
    """A block answers at once, named, and is not taken for a busy engine: past the flood
    stage the engine answers 429, which waiting does not lift."""
    index = fresh_index.name
    assert engine.write_refused(index) is None
    assert engine.get(index, Engine.PROBE_ID) is None  # the probe wrote nothing
    engine.client.indices.put_settings(index=index, body={block: True})
    try:
        before = engine.resent.copy()
        reason = engine.write_refused(index)
        assert reason is not None and "cluster_block_exception" in reason
        assert engine.resent == before  # not sent again
    finally:
        engine.client.indices.put_settings(index=index, body={block: False})


def test_two_creators_of_one_index(engine: Engine, fresh_index: IndexSettings) -> None:
    """Another job created the index a moment ago: creating it again is not an error."""
    from unittest import mock

    with mock.patch.object(engine, "index_exists", return_value=False):
        assert engine.create_index(fresh_index) is False


def test_requests_at_once_keep_their_connections(engine: Engine,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """Requests sent at the same time (validation's ``_analyze`` beside its counts) each keep
    a pooled connection: none is opened for one request and dropped after it."""
    with caplog.at_level("WARNING"), ThreadPoolExecutor(max_workers=4) as pool:
        for _ in range(3):
            list(pool.map(lambda _: engine.client.cluster.health(), range(4)))
    dropped = [r.getMessage() for r in caplog.records if "pool is full" in r.getMessage()]
    assert not dropped, dropped[0]


def test_meta_writers_at_once_keep_each_others_entries(engine: Engine,
                                                       fresh_index: IndexSettings,
                                                       farm: EngineFarm) -> None:
    """The engine replaces ``_meta`` whole, so each write reads it first: four writers at
    once (a job's heartbeat, a follower's round, ``apply``, ``profile apply``; each its own
    connection, as its own process would have) lose none of each other's entries, nor one
    the index's owner wrote."""
    index, rounds, writers = fresh_index.name, 8, ["a", "b", "c", "d"]
    engine.client.indices.put_mapping(index=index, body={"_meta": {"owner": {"team": "x"}}})
    connections = {key: farm.engine(engine.kind) for key in writers}

    def write(key: str) -> None:
        own = connections[key]
        for i in range(rounds):
            own.put_meta(index, {key: i})
        own.drop_meta(index, [f"{key}-never-written"])

    with ThreadPoolExecutor(max_workers=len(writers)) as pool:
        list(pool.map(write, writers))
    for connection in connections.values():
        connection.close()
    meta = engine.get_meta(index)
    assert {k: meta.get(k) for k in writers} == dict.fromkeys(writers, rounds - 1)
    assert meta["owner"] == {"team": "x"}
    assert engine.get(META_LOCK_INDEX, index) is None  # each let go


def test_a_stopped_writers_meta_lock_is_taken_over(engine: Engine,
                                                   fresh_index: IndexSettings) -> None:
    """A process stopped while it held the lock on an index's ``_meta`` blocks the others
    only until the lock is older than a write can take; one kept fresh that long is an
    error naming its holder."""
    index = fresh_index.name
    lock = f"/{META_LOCK_INDEX}/_doc/{index}"
    engine.put_meta(index, {"first": 1})  # creates the lock index
    engine._request("PUT", lock, {"index": index, "host": "gone", "pid": 1, "at": 0})
    engine.put_meta(index, {"second": 2})
    assert engine.get_meta(index) == {"first": 1, "second": 2}
    assert engine.get(META_LOCK_INDEX, index) is None

    hold, stop = engine.meta_hold_s, threading.Event()

    def hold_it() -> None:
        engine._request("PUT", lock, {"index": index, "host": "busy-host", "pid": 7,
                                      "at": time.time()})

    def keep_fresh() -> None:
        while not stop.wait(0.1):
            hold_it()

    hold_it()
    keeper = threading.Thread(target=keep_fresh)
    engine.meta_hold_s = 0.5
    keeper.start()
    try:
        with pytest.raises(MetaBusy, match="locked by busy-host") as busy:
            engine.put_meta(index, {"third": 3})
        assert describe_error(busy.value) == str(busy.value)  # the CLI's one line
    finally:
        stop.set()
        keeper.join()
        engine.meta_hold_s = hold
        engine._request("DELETE", lock)
    assert engine.get_meta(index) == {"first": 1, "second": 2}


def test_a_lock_waited_for_is_dated_when_taken(engine: Engine,
                                               fresh_index: IndexSettings) -> None:
    """A writer that waited for another's lock dates its own from when it took it, or a
    third would find it stale at once and write beside it."""
    from unittest import mock

    index = fresh_index.name
    lock = f"/{META_LOCK_INDEX}/_doc/{index}"
    engine.put_meta(index, {"first": 1})  # creates the lock index
    engine._request("PUT", lock, {"index": index, "host": "other", "pid": 2, "at": time.time()})
    let_go = threading.Timer(1.0, lambda: engine._request("DELETE", lock))
    started, held = time.time(), {}
    get_meta = engine.get_meta

    def read_under_the_lock(name: str) -> dict:
        held.update(engine.get(META_LOCK_INDEX, index) or {})
        return get_meta(name)

    let_go.start()
    with mock.patch.object(engine, "get_meta", side_effect=read_under_the_lock):
        engine.put_meta(index, {"second": 2})
    let_go.join()
    assert held["host"] != "other" and held["at"] >= started + 0.9
    assert engine.get_meta(index) == {"first": 1, "second": 2}
