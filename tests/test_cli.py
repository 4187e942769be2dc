"""The `sira` commands as a user runs them, against the real engines."""

from __future__ import annotations

import json
import re
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import STATE_DIR
from pydantic import SecretStr
from typer.testing import CliRunner

from pipeline.bench.stand_in import StandInModel
from pipeline.cli import app
from pipeline.config import Settings
from pipeline.engine import Engine
from pipeline.local import servers

runner = CliRunner()


def engine_env(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Point the CLI at ``engine`` through SIRA_* variables, as a user would."""
    name = "test-opensearch" if engine.kind == "opensearch" else "test-elasticsearch"
    record = servers.load_record(STATE_DIR, name)
    env = {"SIRA_ENGINE__URL": record.url, "SIRA_ENGINE__KIND": record.kind}
    if record.password:
        env |= {"SIRA_ENGINE__USERNAME": record.username,
                "SIRA_ENGINE__PASSWORD": record.password,
                "SIRA_ENGINE__CA_FILE": record.ca_file}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "notes.jsonl"
    lines = [
        json.dumps({"_id": "n1", "title": "Heap sizing", "text": "Give the JVM half the RAM."}),
        '{"_id": "n2", "title": "broken',
        json.dumps({"_id": "n3", "title": "Snapshots", "text": "Back up indices to S3."}),
    ]
    path.write_bytes("\n".join(lines).encode() + b"\n" + b'{"_id": "n4", "text": "\xff"}\n')
    return path


def test_index_then_search(engine: Engine, corpus: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = engine_env(engine, monkeypatch)
    index = f"test-cli-{uuid.uuid4().hex[:8]}"
    try:
        result = runner.invoke(app, ["--index", index, "index", str(corpus)])
        assert result.exit_code == 0, result.output
        assert "loaded 2, indexed 2, skipped 2 bad input(s), rejected 0 by engine" in result.output
        assert f"{corpus}:2: broken JSON" in result.output
        assert f"{corpus}:4: invalid UTF-8" in result.output

        strict = runner.invoke(app, ["--index", index, "index", str(corpus), "--strict"])
        assert strict.exit_code == 1

        # the command's own --index works as well as the global one
        found = runner.invoke(app, ["search", "backup snapshots", "--json", "--index", index])
        assert found.exit_code == 0, found.output
        hits = json.loads(found.stdout)["hits"]
        assert [h["id"] for h in hits] == ["n3"]
        if "SIRA_ENGINE__PASSWORD" in env:
            assert env["SIRA_ENGINE__PASSWORD"] not in result.output + found.output
    finally:
        engine.delete_index(index)


def test_no_engine_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SIRA_ENGINE__URL", raising=False)
    result = runner.invoke(app, ["--state-dir", str(tmp_path), "search", "x"])
    assert result.exit_code == 2
    assert "no engine configured" in result.output


def test_status_and_settings_never_show_the_password(elasticsearch: Engine,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    record = servers.load_record(STATE_DIR, "test-elasticsearch")
    assert record.password
    status = runner.invoke(app, ["--state-dir", str(STATE_DIR), "engine", "status",
                                 "--name", "test-elasticsearch"])
    assert status.exit_code == 0, status.output
    shown = json.loads(status.stdout)
    assert shown["health"] in ("green", "yellow") and shown["username"] == "sira"
    assert record.password not in status.output

    monkeypatch.setenv("SIRA_ENGINE__PASSWORD", record.password)
    monkeypatch.setenv("SIRA_ENGINE__API_KEY", "key-that-must-not-leak")
    settings = Settings()
    assert record.password not in repr(settings) + str(settings.model_dump())
    assert "key-that-must-not-leak" not in repr(settings)


def test_wrong_password_and_unverified_tls_are_refused(elasticsearch: Engine) -> None:
    record = servers.load_record(STATE_DIR, "test-elasticsearch")
    base = Settings().engine.model_copy(update={
        "kind": "elasticsearch", "url": record.url, "username": record.username,
        "ca_file": record.ca_file})
    wrong = Engine.connect(base.model_copy(update={"password": "not-the-password"}))
    with pytest.raises(Exception) as refused:
        wrong.health()
    assert "401" in str(refused.value) or "security_exception" in str(refused.value)
    # verification is on by default: without the private CA the certificate is refused
    no_ca = Engine.connect(base.model_copy(update={"ca_file": None,
                                                   "password": record.password}))
    with pytest.raises(Exception, match="(?i)certificate|ssl|tls"):
        no_ca.health()


class _HeaderRecorder(BaseHTTPRequestHandler):
    seen: list[str | None] = []

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        _HeaderRecorder.seen.append(self.headers.get("Authorization"))
        body = json.dumps({"status": "green", "number_of_nodes": 1}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Elastic-Product", "Elasticsearch")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("kind", ["opensearch", "elasticsearch"])
def test_api_key_is_sent_as_apikey_header(kind: str) -> None:
    """The minimal Elasticsearch cannot create API keys (its security index needs the
    analysis-common module), so the header itself is checked on a loopback HTTP server."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _HeaderRecorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        _HeaderRecorder.seen.clear()
        settings = Settings().engine.model_copy(update={
            "kind": kind, "url": f"http://127.0.0.1:{server.server_port}",
            "api_key": SecretStr("c2VjcmV0LWtleQ==")})
        assert Engine.connect(settings).health()["status"] == "green"
        assert _HeaderRecorder.seen == ["ApiKey c2VjcmV0LWtleQ=="]
    finally:
        server.shutdown()


def test_demo_indexes_and_searches_the_sample(opensearch: Engine,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    engine_env(opensearch, monkeypatch)
    index = f"test-demo-{uuid.uuid4().hex[:8]}"
    try:
        result = runner.invoke(app, ["--index", index, "demo", "--queries", "2"])
        assert result.exit_code == 0, result.output
        output = " ".join(result.output.split())  # rich wraps long lines
        assert f"{index}: loaded 30, indexed 30, skipped 0" in output
        # no model server: the recorded output is replayed, and said to be
        assert "replaying model output recorded once for the sample" in output
        assert "proposals for 30 notes, sketches for 8 queries" in output
        assert opensearch.count(index, {"term": {"sira.status": "enriched"}}) == 30
        assert opensearch.get(index, "ops-001")["sira"]["model"] == "frontier-llm-recorded"
        assert "why is my cluster yellow" in output and "ops-001" in output
        assert "worker crashed" not in output  # --queries 2: two of the eight shown
        assert "8 judged sample queries" in output  # ... and all eight measured
        for config in ("BM25", "+ doc terms", "+ sketch"):
            assert re.search(rf"│ {re.escape(config)} │ [01]\.\d{{3}} │ [01]\.\d{{3}} │",
                             output), config
        assert f"The engine is still running at {opensearch.url}, index {index}" in output
        assert f'search "your words" --index {index}' in output
    finally:
        opensearch.delete_index(index)


def test_enrich_refilter_stats_commands(opensearch: Engine, monkeypatch: pytest.MonkeyPatch,
                                        tmp_path: Path) -> None:
    engine_env(opensearch, monkeypatch)
    index = f"test-enrich-{uuid.uuid4().hex[:8]}"
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "title": f"Note {i}",
                                          "text": f"body {i}"}) + "\n" for i in range(6)))
    answers = {f"Note {i}": ["shared tag", f"unique{i}"] for i in range(6)}
    with StandInModel(answers) as model:
        monkeypatch.setenv("SIRA_LLM__URL", model.url)
        try:
            assert runner.invoke(app, ["--index", index, "index", str(corpus)]).exit_code == 0
            result = runner.invoke(app, ["--index", index, "enrich", "--policy", "none"])
            assert result.exit_code == 0, result.output
            assert "6 proposed, 0 failed" in result.output
            assert "6/6 documents enriched (6 updated now), kept 12 of 12 terms" in result.output

            again = runner.invoke(app, ["--index", index, "enrich"])
            assert "0 proposed, 0 failed, 6 unchanged (not sent); 0 model calls" in again.output

            refilter = runner.invoke(app, ["--index", index, "refilter", "--policy", "absolute",
                                           "--cap", "5", "--basis", "proposals"])
            assert refilter.exit_code == 0, refilter.output
            assert "kept 6 of 12 terms" in refilter.output  # "shared tag" has DF 6 > 5
            # the second enrich applied the default rank policy, which had dropped it already
            assert "(0 updated now)" in refilter.output
            none = runner.invoke(app, ["--index", index, "refilter", "--policy", "none"])
            assert "6/6 documents enriched (6 updated now), kept 12 of 12" in none.output
            none = runner.invoke(app, ["--index", index, "refilter", "--policy", "none"])
            assert "(0 updated now)" in none.output
            assert opensearch.segments(index)["deleted_docs"] > 0  # left by the updates
            merged = runner.invoke(app, ["--index", index, "refilter", "--policy", "absolute",
                                         "--cap", "5", "--basis", "proposals", "--force-merge"])
            assert merged.exit_code == 0, merged.output
            assert "force-merged into 1 segment(s), 0 deleted copies left" in merged.output
            assert opensearch.segments(index) == {"segments": 1, "deleted_docs": 0}
            assert opensearch.get(index, "d0")["sira"]["bridge"] == ["unique0"]

            stats = runner.invoke(app, ["--index", index, "stats", "--k", "1"])
            assert stats.exit_code == 0, stats.output
            figures = json.loads(stats.stdout)
            assert figures["documents_with_proposals"] == 6
            assert figures["proposals_per_doc"] == 2.0 and figures["kept_per_doc"] == 1.0
            assert figures["policies"]["rank K=1"]["distinct_terms_dropped"] == 1
        finally:
            opensearch.delete_index(index)


def test_search_with_expansion_explain_and_template(opensearch: Engine,
                                                    monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    engine_env(opensearch, monkeypatch)
    index = f"test-search-{uuid.uuid4().hex[:8]}"
    corpus = tmp_path / "c.jsonl"
    corpus.write_text(
        json.dumps({"_id": "a", "title": "Heap", "text": "JVM memory settings"}) + "\n"
        + json.dumps({"_id": "b", "title": "Snapshots", "text": "copies to object storage"})
        + "\n")
    answers = {"Heap": ["garbage collector"], "Snapshots": ["backup"],
               "": ["backup", "nonexistent words"]}
    with StandInModel(answers) as model:
        monkeypatch.setenv("SIRA_LLM__URL", model.url)
        try:
            runner.invoke(app, ["--index", index, "index", str(corpus)])
            assert runner.invoke(app, ["--index", index, "enrich", "--policy", "none"]
                                 ).exit_code == 0
            result = runner.invoke(app, ["--index", index, "search", "keep a copy safe",
                                         "--expand", "--explain", "--w", "1"])
            assert result.exit_code == 0, result.output
            assert "sketch: ['backup', 'nonexistent words']" in result.output
            assert "expansion: ['backup']" in result.output
            assert "dropped 'nonexistent words': not in the index (DF 0)" in result.output
            # the sketch is scored on `enriched`: the bridge term "backup" found it
            explained = "1. b [literal, expansion:backup] contents: copi; enriched: backup"
            assert explained in result.output

            as_json = runner.invoke(app, ["--index", index, "search", "memory", "--json"])
            payload = json.loads(as_json.stdout)
            assert payload["hits"][0]["id"] == "a" and payload["sketch"] is None

            installed = runner.invoke(app, ["--index", index, "template", "install"])
            assert installed.exit_code == 0 and "sira-two-clause" in installed.output
        finally:
            opensearch.delete_index(index)


def test_demo_runs_the_job_with_the_embedded_broker(opensearch: Engine, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """README command 1 with a model configured: filesystem broker, one local worker."""
    engine_env(opensearch, monkeypatch)
    index = f"test-demo-{uuid.uuid4().hex[:8]}"
    with StandInModel() as model:
        monkeypatch.setenv("SIRA_LLM__URL", model.url)
        monkeypatch.delenv("SIRA_WORKER__BROKER_URL", raising=False)
        try:
            result = runner.invoke(app, ["--state-dir", str(tmp_path), "--index", index,
                                         "demo", "--queries", "1"])
            assert result.exit_code == 0, result.output
            assert "embedded broker (filesystem)" in result.output
            assert "30 documents (30 new" in result.output
            assert "30 sent to the model: 30 proposed, 0 failed" in result.output
            assert "30 enriched; 30 model calls" in result.output
            # one request per note, then one sketch per judged query (all eight measured)
            assert len(model.calls) == 30 + 8
            assert "enrichment from the live model" in " ".join(result.output.split())
            assert opensearch.get(index, "ops-001")["sira"]["status"] == "enriched"
        finally:
            opensearch.delete_index(index)


def test_bench_latency_command(opensearch: Engine, monkeypatch: pytest.MonkeyPatch,
                               tmp_path: Path) -> None:
    from test_bench import make_collection

    engine_env(opensearch, monkeypatch)
    monkeypatch.setenv("SIRA_ENRICH__RANK_K", "1")  # only the tag of every document is dropped
    dataset, proposals, sketches = make_collection(tmp_path / "tiny")
    result = runner.invoke(app, ["bench-latency", "--dataset", str(dataset), "--proposals",
                                 str(proposals), "--sketches", str(sketches), "--repeat", "1"])
    try:
        assert result.exit_code == 0, result.output
        assert "tiny, opensearch: 12 queries x 1, 1.0 sketch phrases (1.0 distinct terms) kept" \
            in result.output
        assert "force-merged (0 deleted copies)" in result.output
        assert "the template given the sketch phrases instead" in result.output
        assert "Sketch validation" in result.output
    finally:
        for name in opensearch.client.indices.get(index="bench-tiny-*"):
            opensearch.delete_index(name)
