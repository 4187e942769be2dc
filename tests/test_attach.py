"""Plugin-style: sira attached to a user's own index (any mapping, strict dynamic), fed by
a plain writer, followed, searched; the proposal cache; bad input leaves the index untouched.
Every test runs on OpenSearch and Elasticsearch, through the CLI as a user runs it."""

from __future__ import annotations

import copy
import json
import signal
import uuid
from collections.abc import Iterator

import pytest
from test_cli import engine_env
from test_query import numbers_as_numbers
from typer.testing import CliRunner

from pipeline.bench.stand_in import StandInModel
from pipeline.cli import app
from pipeline.engine import Engine

runner = CliRunner()

USER_BODY = {
    "settings": {"index": {"number_of_shards": 2, "number_of_replicas": 0},
                 "analysis": {"analyzer": {"catalogue": {
                     "type": "custom", "tokenizer": "standard", "filter": ["lowercase"]}}}},
    "mappings": {"dynamic": "strict", "_meta": {"owner": "shop team"}, "properties": {
        "name": {"type": "text", "analyzer": "catalogue",
                 "fields": {"raw": {"type": "keyword"}}},
        "description": {"type": "text"},
        "brand": {"type": "keyword"},
        "price": {"type": "float"},
        "released": {"type": "date"},
        "specs": {"properties": {"color": {"type": "keyword"}}},
    }},
}
PRODUCTS = {
    "p1": {"name": "Trail runner", "description": "A light shoe for mountain paths.",
           "brand": "acme", "price": 89.5, "released": "2025-03-01",
           "specs": {"color": "red"}},
    "p2": {"name": "Rain jacket", "description": "Keeps you dry on long walks.",
           "brand": "northwind", "price": 120.0, "released": "2024-10-12",
           "specs": {"color": "blue"}},
    "p3": {"name": "Head torch", "description": "Bright light for night hikes.",
           "brand": "acme", "price": 35.0, "released": "2023-01-20",
           "specs": {"color": "black"}},
}
ANSWERS = {"Trail runner": ["zephyrsole grip", "mountain paths"],
           "Rain jacket": ["stormshell membrane"], "Head torch": ["lumenbeam lamp"]}


def write(engine: Engine, index: str, docs: dict[str, dict]) -> None:
    """An application writing plain documents (no sira fields, no ingest pipeline)."""
    result = engine.bulk_index(index, [{"_id": i, **d} for i, d in docs.items()])
    assert result.failed == 0, result.failures
    engine.refresh(index)


def user_part(source: dict) -> dict:
    return {k: v for k, v in source.items() if k != "sira"}


@pytest.fixture
def products(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    engine_env(engine, monkeypatch)
    index = f"products-{uuid.uuid4().hex[:8]}"
    cache = f"sira-cache-test-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("SIRA_ENRICH__CACHE_INDEX", cache)
    engine.create(index, copy.deepcopy(USER_BODY))
    write(engine, index, PRODUCTS)
    yield index
    engine.delete_index(index)
    engine.delete_index(cache)


def invoke(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def test_attach_follow_and_the_cache(engine: Engine, products: str,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    index = products
    before = engine.get_mapping(index)
    free_text = {"query": {"query_string": {"query": "stormshell"}}}  # Discover, no field
    assert engine.search(index, free_text)["hits"]["total"]["value"] == 0

    out = invoke("attach", index, "--fields", "name,description")
    assert "added the sira object" in out
    after = engine.get_mapping(index)
    assert after["properties"]["sira"]["properties"]["echo"]["analyzer"] == "catalogue"
    assert {k: v for k, v in after["properties"].items() if k != "sira"} == \
        before["properties"]  # no user field, mapping or analyzer changed
    assert after["dynamic"] == "strict" and after["_meta"]["owner"] == "shop team"
    assert after["_meta"]["sira_attach"]["fields"] == ["name", "description"]
    assert "nothing to do" in invoke("attach", index, "--fields", "name,description")
    assert engine.get_mapping(index) == after

    with StandInModel(ANSWERS) as fake:
        monkeypatch.setenv("SIRA_LLM__URL", fake.url)
        on_sigterm = signal.getsignal(signal.SIGTERM)
        out = invoke("follow", index, "--once")
        assert "lag 0 pending" in out and "3 proposed" in out, out
        # the process may go on (a caller, these tests): its SIGTERM handler is its own again
        assert signal.getsignal(signal.SIGTERM) == on_sigterm
        assert fake.requests == 3
        for doc_id, doc in PRODUCTS.items():  # the user's values are untouched
            stored = engine.get(index, doc_id)
            assert user_part(stored) == doc
            assert stored["sira"]["status"] == "enriched"
        assert engine.get(index, "p2")["sira"]["bridge"] == ["stormshell membrane"]
        # free text with no field named reaches the document through its enrichment
        hits = engine.search(index, free_text)["hits"]["hits"]
        assert [h["_id"] for h in hits] == ["p2"]

        # the app overwrites p1 unchanged, changes p3's text, updates p2's price only
        write(engine, index, {"p1": PRODUCTS["p1"],
                              "p3": {**PRODUCTS["p3"], "description": "Red light mode."}})
        engine.bulk_update(index, [("p2", {"price": 99.0})])
        engine.refresh(index)
        assert "sira" not in engine.get(index, "p1")
        out = invoke("follow", index, "--once")
        assert fake.calls == {"Trail runner": 1, "Rain jacket": 1, "Head torch": 2}, out
        assert "1 from the cache, 1 proposed" in out, out
        assert engine.get(index, "p1")["sira"]["status"] == "enriched"
        assert engine.get(index, "p2")["price"] == 99.0
        assert "0 found" in invoke("follow", index, "--once")
        assert fake.requests == 4

    # no model server at all: an overwrite with unchanged text is restored from the cache
    monkeypatch.delenv("SIRA_LLM__URL")
    write(engine, index, {"p2": {**PRODUCTS["p2"], "price": 99.0}})
    out = invoke("follow", index, "--once")
    assert "1 from the cache" in out and "lag 0 pending" in out, out
    assert engine.get(index, "p2")["sira"]["bridge"] == ["stormshell membrane"]
    # a new text waits, named, for a model server
    write(engine, index, {"p4": {"name": "Camp stove", "description": "Boils water."}})
    out = invoke("follow", index, "--once")
    assert "lag 1 pending" in out and "1 waiting for a model server" in out, out

    # searching the attached index: its fields, the enrichment, a user's filter
    hits = json.loads(invoke("search", "--index", index, "lumenbeam", "--json"))["hits"]
    assert [h["id"] for h in hits] == ["p3"] and hits[0]["title"] == "Head torch"
    filtered = json.loads(invoke("search", "--index", index, "light", "--json", "--filter",
                                 '{"term": {"brand": "northwind"}}'))["hits"]
    assert filtered == []
    acme = json.loads(invoke("search", "--index", index, "light", "--json", "--filter",
                             '{"term": {"brand": "acme"}}'))["hits"]
    assert {h["id"] for h in acme} == {"p1", "p3"}

    lag = json.loads(invoke("stats", "--index", index))["follow"]
    assert lag["pending"] == 1 and lag["oldest_pending_s"] >= 0
    stats = json.loads(invoke("cache", "stats"))
    assert stats["entries"] == 4 and stats["by_model_and_prompt"][0]["entries"] == 4
    out = invoke("detach", index)
    assert "stays: the sira object" in out
    assert "sira_attach" not in engine.get_meta(index)
    assert engine.get_meta(index)["owner"] == "shop team"


def test_attached_template_renders_the_search(engine: Engine, products: str) -> None:
    from pipeline import query
    from pipeline.schema import Layout

    out = invoke("attach", products, "--fields", "name,description")
    if not engine.capabilities.search_templates:  # the minimal Elasticsearch (Compatibility)
        assert "no mustache search templates: none stored" in out
        return
    layout = Layout.of(engine.get_meta(products))
    params = query.template_params("light", {"lamp": 1}, w=0.7, layout=layout,
                                   filter={"term": {"brand": "acme"}})
    rendered = engine.render_search_template(layout.template_id, params)
    assert numbers_as_numbers(rendered) == query.build_query(
        "light", {"lamp": 1}, w=0.7, layout=layout, filter={"term": {"brand": "acme"}})
    typed = query.template_params("light", phrases=["lamp"], w=0.7, layout=layout)
    hits = engine.search_template(products, layout.template_id, typed)["hits"]["hits"]
    assert hits and {h["_id"] for h in hits} <= set(PRODUCTS)
    engine.delete_search_template(layout.template_id)


@pytest.mark.parametrize("case", ["missing index", "missing field", "keyword field",
                                  "sira of another shape", "no fields", "unknown analyzer"])
def test_bad_attach_is_one_line_and_touches_nothing(engine: Engine, products: str,
                                                    case: str) -> None:
    index, fields, extra = products, "name,description", []
    if case == "missing index":
        index = f"{products}-nope"
    elif case == "missing field":
        fields = "name,summary"
    elif case == "keyword field":
        fields = "brand"
    elif case == "no fields":
        fields = " , "
    elif case == "unknown analyzer":
        fields, extra = "name", ["--analyzer", "klingon"]
    else:  # a field called sira the user already has
        other = f"{products}-taken"
        body = copy.deepcopy(USER_BODY)
        body["mappings"]["properties"]["sira"] = {"type": "keyword"}
        engine.create(other, body)
        index = other
    before = engine.get_mapping(index) if engine.index_exists(index) else None
    try:
        result = runner.invoke(app, ["attach", index, "--fields", fields, *extra])
        assert result.exit_code == 2
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.output
        expected = {"missing index": "no such index", "missing field": "no field summary",
                    "keyword field": "field brand is keyword, not text",
                    "sira of another shape": "already has a field sira of another shape",
                    "no fields": "name at least one text field",
                    "unknown analyzer": "--analyzer klingon: not an analyzer this index knows",
                    }[case]
        assert expected in lines[0]
        if before is not None:
            assert engine.get_mapping(index) == before
    finally:
        if case == "sira of another shape":
            engine.delete_index(index)


def test_attach_with_an_analyzer_of_the_index(engine: Engine, products: str) -> None:
    invoke("attach", products, "--fields", "description", "--analyzer", "catalogue")
    sira = engine.get_mapping(products)["properties"]["sira"]["properties"]
    assert sira["echo"]["analyzer"] == sira["bridge"]["analyzer"] == "catalogue"
    # the description field's own analyzer (the default, standard) is untouched
    assert "analyzer" not in engine.get_mapping(products)["properties"]["description"]
    again = invoke("attach", products, "--fields", "description")  # the choice is kept
    assert "nothing to do" in again
    recorded = engine.get_meta(products)["sira_attach"]
    assert recorded["enrichment_analyzer"] == recorded["analyzer"] == "catalogue"


def test_the_same_text_in_another_index_costs_no_model_call(
        engine: Engine, monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    engine_env(engine, monkeypatch)
    cache = f"sira-cache-test-{uuid.uuid4().hex[:8]}"
    monkeypatch.setenv("SIRA_ENRICH__CACHE_INDEX", cache)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"_id": i, "title": d["name"],
                                          "text": d["description"]}) + "\n"
                              for i, d in PRODUCTS.items()))
    first, second, third = (f"cached-{uuid.uuid4().hex[:8]}" for _ in range(3))
    try:
        with StandInModel(ANSWERS) as fake:
            monkeypatch.setenv("SIRA_LLM__URL", fake.url)
            for name in (first, second):
                invoke("--index", name, "index", str(corpus))
            assert "3 proposed" in invoke("enrich", "--index", first)
            assert fake.requests == 3
            out = invoke("enrich", "--index", second)
            assert "3 proposed" in out and "0 model calls (3 from the cache)" in out, out
            assert fake.requests == 3
            # the job: the cached proposals are written with the copy, nothing is queued,
            # and each document is written twice (the copy, the enrichment)
            out = invoke("reindex", "--source", str(corpus), "--target", third)
            assert "3 from the proposal cache, 0 sent to the model: 3 proposed" in out, out
            assert "3 enriched" in out and fake.requests == 3, out
            for doc_id in PRODUCTS:
                assert dict(engine.client.get(index=third, id=doc_id))["_version"] == 2
        assert engine.get(second, "p2")["sira"]["bridge"] == \
            engine.get(first, "p2")["sira"]["bridge"] == ["stormshell membrane"]
        pruned = runner.invoke(app, ["cache", "prune", "--older-than", "0"])
        assert pruned.exit_code == 0 and "3 entries deleted" in pruned.output, pruned.output
    finally:
        for name in (first, second, third, cache):
            engine.delete_index(name)


def test_follow_through_celery_workers(opensearch: Engine, monkeypatch: pytest.MonkeyPatch,
                                       tmp_path) -> None:
    """The model calls of a round go through local Celery workers (embedded broker)."""
    engine_env(opensearch, monkeypatch)
    monkeypatch.setenv("SIRA_STATE_DIR", str(tmp_path / "state"))
    index = f"products-{uuid.uuid4().hex[:8]}"
    opensearch.create(index, copy.deepcopy(USER_BODY))
    write(opensearch, index, PRODUCTS)
    try:
        invoke("attach", index, "--fields", "name,description")
        with StandInModel(ANSWERS) as fake:
            monkeypatch.setenv("SIRA_LLM__URL", fake.url)
            out = invoke("follow", index, "--once", "--workers", "1")
            assert "lag 0 pending" in out and "3 proposed" in out, out
            assert fake.requests == 3
        assert {opensearch.get(index, i)["sira"]["status"] for i in PRODUCTS} == {"enriched"}
        assert user_part(opensearch.get(index, "p1")) == PRODUCTS["p1"]
    finally:
        opensearch.delete_index(index)


def test_reindex_a_user_index_keeps_every_field(engine: Engine, products: str,
                                                monkeypatch: pytest.MonkeyPatch,
                                                tmp_path) -> None:
    monkeypatch.setenv("SIRA_STATE_DIR", str(tmp_path / "state"))
    target, again = f"{products}-sira", f"{products}-copy"
    try:
        with StandInModel(ANSWERS) as fake:
            monkeypatch.setenv("SIRA_LLM__URL", fake.url)
            plain = runner.invoke(app, ["reindex", "--source", products, "--target", target])
            assert plain.exit_code == 1 and "name the text fields" in plain.output, plain.output
            assert not engine.index_exists(target)
            out = invoke("reindex", "--source", products, "--target", target,
                         "--fields", "name,description", "--workers", "1")
            assert "3 new" in out and "3 proposed" in out, out
            assert fake.requests == 3
            # from an attached index: its fields and its proposals come along
            out = invoke("reindex", "--source", target, "--target", again, "--workers", "1")
            assert "0 sent to the model" in out and "3 enriched" in out, out
            assert fake.requests == 3
            # a plain copy (no sira object) of the same texts: the job restores them from the
            # proposal cache before queueing anything
            third = f"{products}-plain"
            engine.create(third, copy.deepcopy(USER_BODY))
            write(engine, third, PRODUCTS)
            invoke("attach", third, "--fields", "name,description")
            out = invoke("reindex", "--target", third, "--workers", "1")
            assert "3 from the proposal cache, 0 sent to the model" in out, out
            assert fake.requests == 3
            engine.delete_index(third)
        source_mapping = engine.get_mapping(products)
        for name in (target, again):
            mapping = engine.get_mapping(name)
            assert {k: v for k, v in mapping["properties"].items() if k != "sira"} == \
                source_mapping["properties"]
            assert mapping["dynamic"] == "strict"
            assert engine.index_settings(name)["index"]["number_of_shards"] == "2"
            for doc_id, doc in PRODUCTS.items():
                assert user_part(engine.get(name, doc_id)) == doc
                assert engine.get(name, doc_id)["sira"]["status"] == "enriched"
            # every field searchable and filterable as in the source
            found = engine.search(name, {"query": {"bool": {"filter": [
                {"term": {"brand": "acme"}}, {"range": {"price": {"lt": 50}}},
                {"term": {"specs.color": "black"}}, {"term": {"name.raw": "Head torch"}}]}}})
            assert [h["_id"] for h in found["hits"]["hits"]] == ["p3"]
        hits = json.loads(invoke("search", "--index", again, "stormshell", "--json"))["hits"]
        assert [h["id"] for h in hits] == ["p2"]
    finally:
        for name in (target, again):
            engine.delete_index(name)


@pytest.mark.parametrize("shape", ["mapping", "dynamic"])
def test_index_a_file_in_your_own_shape(engine: Engine, monkeypatch: pytest.MonkeyPatch,
                                        tmp_path, shape: str) -> None:
    engine_env(engine, monkeypatch)
    index = f"shop-{uuid.uuid4().hex[:8]}"
    lines = [json.dumps({"_id": i, **d}) for i, d in PRODUCTS.items()]
    lines.append(json.dumps({"_id": "bad", "name": "Odd", "colour_code": 7}))  # not in a strict map
    data = tmp_path / "products.jsonl"
    data.write_text("\n".join(lines) + "\n")
    args = ["--index", index, "index", str(data), "--fields", "name,description"]
    if shape == "mapping":
        mapping = tmp_path / "mapping.json"
        mapping.write_text(json.dumps(USER_BODY))
        args += ["--mapping", str(mapping)]
    try:
        result = runner.invoke(app, args)
        if shape == "mapping":  # the strict mapping refuses the odd line, named by its line
            assert result.exit_code == 1, result.output
            assert "products.jsonl:4" in result.output and "bad" in result.output
        else:
            assert result.exit_code == 0, result.output
        for doc_id, doc in PRODUCTS.items():
            assert engine.get(index, doc_id) == doc  # every field, nothing added
        assert engine.get_meta(index)["sira_attach"]["fields"] == ["name", "description"]
        with StandInModel(ANSWERS) as fake:
            monkeypatch.setenv("SIRA_LLM__URL", fake.url)
            out = invoke("follow", index, "--once")
            expected = 3 if shape == "mapping" else 4
            assert f"{expected} proposed" in out and "lag 0 pending" in out, out
        assert user_part(engine.get(index, "p1")) == PRODUCTS["p1"]
    finally:
        engine.delete_index(index)


def test_a_follower_killed_mid_round_loses_nothing(opensearch: Engine,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    env = engine_env(opensearch, monkeypatch)
    index = f"products-{uuid.uuid4().hex[:8]}"
    opensearch.create(index, copy.deepcopy(USER_BODY))
    docs = {f"n{i}": {"name": f"Item {i}", "description": f"Thing number {i}."}
            for i in range(200)}
    write(opensearch, index, docs)
    try:
        invoke("attach", index, "--fields", "name,description")
        with StandInModel(delay=0.05) as fake:
            monkeypatch.setenv("SIRA_LLM__URL", fake.url)
            child_env = {**os.environ, **env, "SIRA_LLM__URL": fake.url,
                         "SIRA_LLM__CONCURRENCY": "2", "SIRA_ENRICH__BATCH_DOCS": "10"}
            follower = subprocess.Popen(
                [sys.executable, "-c", "from pipeline.cli import app; app()", "follow", index,
                 "--interval", "1"], env=child_env, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 60
            while opensearch.count(index, {"exists": {"field": "sira.proposed_hash"}}) < 40:
                assert time.monotonic() < deadline and follower.poll() is None
                time.sleep(0.2)
            follower.send_signal(signal.SIGKILL)  # mid-round: no chance to clean up
            follower.wait(timeout=10)
            done_before = opensearch.count(index, {"exists": {"field": "sira.proposed_hash"}})
            assert 40 <= done_before < 200
            out = invoke("follow", index, "--once")
            assert "lag 0 pending" in out, out
            # what the killed follower stored is kept: at most its batch in flight is asked
            # for again
            assert fake.requests <= 200 + 10
            assert max(fake.calls.values()) <= 2
        statuses = {h["_source"]["sira"]["status"] for h in opensearch.scan(index,
                                                                            source=["sira"])}
        assert statuses == {"enriched"}
    finally:
        opensearch.delete_index(index)
