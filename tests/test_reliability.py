"""What a careless or hostile user meets: one bad document loses only itself, every refusal
is counted and named, mistakes get one line instead of a traceback, nothing secret is shown.
Against the real engines (both) through the `sira` command line."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from test_cli import engine_env, runner

from pipeline.cli import app
from pipeline.config import EngineSettings, Settings
from pipeline.engine import Engine, status_of
from pipeline.loaders import CorpusError, LoadReport, iter_corpus
from pipeline.local import servers


def write_lines(path: Path, n: int, long_id_at: int | None = None) -> Path:
    with open(path, "w") as fh:
        for line in range(1, n + 1):
            doc_id = "x" * 600 if line == long_id_at else f"d{line}"
            fh.write(json.dumps({"_id": doc_id, "title": f"Doc {line}", "text": "body"}) + "\n")
    return path


def no_traceback(output: str) -> None:
    assert "Traceback" not in output and output.count("error:") <= 1, output


def test_an_over_long_id_loses_only_itself(engine: Engine, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine refuses a bulk request holding a 600-byte id as a whole; the request is
    split until only that line fails, and the line is named."""
    engine_env(engine, monkeypatch)
    corpus = write_lines(tmp_path / "c.jsonl", 1000, long_id_at=251)
    index = f"test-rel-{uuid.uuid4().hex[:8]}"
    try:
        result = runner.invoke(app, ["--index", index, "index", str(corpus)])
        assert result.exit_code == 1, result.output
        assert "indexed 999" in result.output and "rejected 1 by engine" in result.output
        assert f"{corpus}:251: document xxxx" in result.output
        assert "(600 chars)" in result.output and "validation" in result.output
        assert engine.count(index) == 999
    finally:
        engine.delete_index(index)


def test_import_names_proposals_the_engine_refuses(engine: Engine, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    engine_env(engine, monkeypatch)
    corpus = write_lines(tmp_path / "c.jsonl", 3)
    proposals = tmp_path / "p.jsonl"
    proposals.write_text(json.dumps({"doc_id": "d1", "terms": ["x" * 40000]}) + "\n"
                         + json.dumps({"doc_id": "d2", "terms": ["fine term"]}) + "\n")
    index = f"test-rel-{uuid.uuid4().hex[:8]}"
    try:
        assert runner.invoke(app, ["--index", index, "index", str(corpus)]).exit_code == 0
        result = runner.invoke(app, ["--index", index, "import-proposals", str(proposals)])
        assert result.exit_code == 1, result.output
        assert "1 documents stored, 1 recorded as failed (1 of them refused by the engine)" \
            in result.output
        assert "document d1: rejected by the engine" in result.output
        stored = engine.get(index, "d1")["sira"]
        assert stored["status"] == "failed" and "engine rejected" in stored["reason"]
        assert engine.get(index, "d2")["sira"]["status"] == "enriched"
    finally:
        engine.delete_index(index)


def test_engine_mistakes_are_one_line(engine: Engine, tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    env = engine_env(engine, monkeypatch)
    missing = f"test-missing-{uuid.uuid4().hex[:8]}"
    for command in (["search", "x"], ["refilter"], ["stats"], ["export-batch",
                                                                str(tmp_path / "b.jsonl")]):
        result = runner.invoke(app, ["--index", missing, *command])
        assert result.exit_code == 2, (command, result.output)
        assert "error: no such index" in result.output and missing in result.output
        no_traceback(result.output)
    monkeypatch.setenv("SIRA_LLM__URL", "http://127.0.0.1:9/v1")
    result = runner.invoke(app, ["--index", missing, "enrich"])
    assert result.exit_code == 2 and "error: no such index" in result.output, result.output

    # a query of 1,100 words: over OpenSearch's clause limit, said so in one line
    index = f"test-rel-{uuid.uuid4().hex[:8]}"
    try:
        corpus = write_lines(tmp_path / "c.jsonl", 3)
        assert runner.invoke(app, ["--index", index, "index", str(corpus)]).exit_code == 0
        words = " ".join(f"w{i}" for i in range(1100))
        result = runner.invoke(app, ["--index", index, "search", words])
        no_traceback(result.output)
        if engine.kind == "opensearch":
            assert result.exit_code == 2 and "clause limit" in result.output, result.output
        else:  # Elasticsearch 9 sizes its limit from the heap: the search may just run
            assert result.exit_code == 0 or "clause limit" in result.output, result.output
    finally:
        engine.delete_index(index)

    if "SIRA_ENGINE__PASSWORD" in env:
        monkeypatch.setenv("SIRA_ENGINE__PASSWORD", "not-the-password")
        result = runner.invoke(app, ["search", "x", "--index", missing])
        assert result.exit_code == 2 and "refused the credentials (401)" in result.output
        assert "not-the-password" not in result.output
        monkeypatch.setenv("SIRA_ENGINE__API_KEY", "some-key")
        result = runner.invoke(app, ["search", "x", "--index", missing])
        assert result.exit_code == 2 and "not both" in result.output, result.output
        no_traceback(result.output)


def test_unreachable_engine_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SIRA_ENGINE__URL", "http://user:supersecret123@127.0.0.1:9")
    monkeypatch.setenv("SIRA_ENGINE__REQUEST_TIMEOUT", "2")
    result = runner.invoke(app, ["search", "x"])
    assert result.exit_code == 2, result.output
    assert "error: cannot reach the engine at http://***@127.0.0.1:9" in result.output
    assert "supersecret123" not in result.output
    no_traceback(result.output)


def test_a_dead_local_engine_record_is_refused(tmp_path: Path) -> None:
    record = servers.ServerRecord(name="local", kind="opensearch", version="x",
                                  url="http://127.0.0.1:9", pid=2 ** 22 + 17, nodes=1,
                                  home=str(tmp_path), log_file=str(tmp_path / "log"))
    servers._save_record(tmp_path, record)
    result = runner.invoke(app, ["--state-dir", str(tmp_path), "search", "x"])
    assert result.exit_code == 2 and "is not running" in result.output, result.output


def test_files_that_load_nothing_or_look_wrong(engine: Engine, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    engine_env(engine, monkeypatch)
    index = f"test-rel-{uuid.uuid4().hex[:8]}"
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"_id": 1, "title": "unterminated\n')
    array = tmp_path / "array.json"
    array.write_text(json.dumps([{"_id": "a", "title": "A", "text": "t"}], indent=2))
    try:
        result = runner.invoke(app, ["--index", index, "index", str(broken)])
        assert result.exit_code == 1 and "no document could be loaded" in result.output
        result = runner.invoke(app, ["--index", index, "index", str(array)])
        assert result.exit_code == 2 and "a JSON array, not JSON Lines" in result.output
        no_traceback(result.output)
    finally:
        engine.delete_index(index)


def test_loader_input_mistakes(tmp_path: Path) -> None:
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps({"_id": "a", "title": "A"}).encode() + b"\n"
                    + json.dumps({"_id": True, "title": "B"}).encode() + b"\n")
    report = LoadReport()
    docs = list(iter_corpus(bom, report, 10_000))
    assert [d.id for d in docs] == ["a"]  # the byte order mark costs nothing
    assert [(p.line, p.reason) for p in report.problems] == [
        (2, '"_id" must be a string, got bool')]

    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "list.md").write_text("---\n- a\n- b\n---\nBody text\n")
    (notes / "ok.md").write_text("---\ntitle: Fine\n---\nBody\n")
    report = LoadReport()
    assert [d.id for d in iter_corpus(notes, report, 10_000)] == ["ok.md"]
    assert [str(p) for p in report.problems] == [
        f"{notes / 'list.md'}:2 (document list.md): YAML front matter must be key: value "
        "pairs, got a list"]

    with pytest.raises(CorpusError, match="JSON array"):
        array = tmp_path / "one-line.jsonl"
        array.write_text('[{"_id": "a"}]\n')
        list(iter_corpus(array, LoadReport(), 10_000))


def test_bench_refuses_to_tune_on_the_reported_split(opensearch: Engine, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    engine_env(opensearch, monkeypatch)
    dataset = tmp_path / "beir"
    (dataset / "qrels").mkdir(parents=True)
    write_lines(dataset / "corpus.jsonl", 3)
    (dataset / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    result = runner.invoke(app, ["bench", "--dataset", str(dataset), "--out",
                                 str(tmp_path / "out")])
    assert result.exit_code == 2 and "no queries.jsonl" in result.output, result.output
    (dataset / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "doc"}) + "\n")
    sketches = tmp_path / "s.jsonl"
    sketches.write_text(json.dumps({"query_id": "q1", "terms": ["body"]}) + "\n")
    result = runner.invoke(app, ["bench", "--dataset", str(dataset), "--sketches",
                                 str(sketches), "--dev-split", "test"])
    assert result.exit_code == 2 and "is the reported split" in result.output, result.output


def test_urls_never_show_credentials() -> None:
    settings = Settings(engine={"url": "http://u:supersecret123@h:1"},
                        worker={"broker_url": "redis://:supersecret123@r:6379/0"},
                        llm={"url": "https://k:supersecret123@m/v1"})
    shown = repr(settings) + str(settings) + repr(settings.worker) + str(settings.llm)
    assert "supersecret123" not in shown
    assert "redis://***@r:6379/0" in shown and "http://***@h:1" in shown
    assert settings.worker.broker_url == "redis://:supersecret123@r:6379/0"  # still usable


def test_foreign_server_on_the_port_is_not_taken_for_the_engine(tmp_path: Path) -> None:
    """Another server answering health green on the chosen port: start must fail, naming
    it, instead of recording the foreign server as the local engine."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Foreign(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            body = {"status": "green", "number_of_nodes": 1} if "health" in self.path else \
                {"nodes": {"x": {"process": {"id": 1}}}}
            data = json.dumps(body).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    port = servers.free_port_range(1, *servers.OPENSEARCH_PORTS)
    foreign = ThreadingHTTPServer(("127.0.0.1", port), Foreign)
    threading.Thread(target=foreign.serve_forever, daemon=True).start()
    try:
        with pytest.raises(servers.EngineError, match="another server answers"):
            servers.start("opensearch", "squatted", tmp_path, port=port, timeout=120)
        assert servers.load_record(tmp_path, "squatted") is None
    finally:
        foreign.shutdown()
        servers.stop(tmp_path, "squatted")



@contextmanager
def stand_in_engine(answer: Callable[[int], tuple]) -> Iterator[tuple[str, list]]:
    """A stand-in engine that answers every request with ``answer(n)`` for the n-th request
    (from 0): (HTTP status, seconds to wait first), or with a third item, the body to answer
    (a function of the request's body, as text); else a health body. Yields its URL and when
    each request came (``time.monotonic()``)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    seen: list[float] = []

    class StandIn(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            sent = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
            status, delay, *body = answer(len(seen))
            seen.append(time.monotonic())
            time.sleep(delay)
            payload = body[0](sent) if body else (
                {"status": "green", "number_of_nodes": 1} if status == 200 else
                {"error": {"type": "busy", "reason": "busy"}, "status": status})
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("X-Elastic-Product", "Elasticsearch")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except OSError:  # the client gave up waiting
                pass

        do_POST = do_PUT = do_GET  # noqa: N815

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()


@pytest.mark.parametrize("kind", ["opensearch", "elasticsearch"])
def test_the_request_timeout_setting_holds_on_both_clients(kind: str) -> None:
    """SIRA_ENGINE__REQUEST_TIMEOUT is how long a request may take before the client gives
    up (and sends it again): an engine slower than it times out, one within it answers once."""
    with stand_in_engine(lambda n: (200, 1.5)) as (url, seen):
        engine = Engine.connect(EngineSettings(kind=kind, url=url, request_timeout=0.3,
                                               retry_s=1))
        with pytest.raises(Exception, match="(?i)time"):
            engine.health()
        assert len(seen) >= 2, seen  # sent again after it timed out
        assert engine.resent == {"timeout": len(seen) - 1}
    with stand_in_engine(lambda n: (200, 1.0)) as (url, seen):
        engine = Engine.connect(EngineSettings(kind=kind, url=url, request_timeout=5))
        assert engine.health()["status"] == "green"
        assert len(seen) == 1, seen


@pytest.mark.parametrize("kind", ["opensearch", "elasticsearch"])
def test_a_busy_engine_is_asked_again_after_growing_waits(kind: str) -> None:
    """An engine that answers 429 (its write queue or memory full) is sent the request again
    after a wait that grows, until SIRA_ENGINE__RETRY_S has passed: a short spell of pressure
    costs a bulk load nothing, a long one ends in one error naming the status."""
    with stand_in_engine(lambda n: (429 if n < 2 else 200, 0)) as (url, seen):
        engine = Engine.connect(EngineSettings(kind=kind, url=url, retry_s=30))
        assert engine.health()["status"] == "green"
        assert len(seen) == 3, seen
        gaps = [b - a for a, b in zip(seen, seen[1:], strict=False)]
        assert min(gaps) >= 0.4 and gaps[1] > gaps[0], gaps  # it waits, longer each time
        assert engine.resent == {"429": 2}
    with stand_in_engine(lambda n: (429, 0)) as (url, seen):
        engine = Engine.connect(EngineSettings(kind=kind, url=url, retry_s=2))
        with pytest.raises(Exception) as refused:
            engine.health()
        assert status_of(refused.value) == 429
        assert 2 <= len(seen) <= 5, seen  # asked again, with waits between


def _bulk_answer(busy: Callable[[str], bool]) -> Callable[[str], dict]:
    """A bulk response to a request's NDJSON body: each item created, or refused as busy
    (429, the engine's write queue full) where ``busy(id)``."""
    def answer(sent: str) -> dict:
        actions = [json.loads(line) for line in sent.splitlines()[::2] if line.strip()]
        ids = [next(iter(a.values()))["_id"] for a in actions]
        refused = [busy(i) for i in ids]
        busy_item = {"status": 429, "error": {"type": "es_rejected_execution_exception",
                                              "reason": "write queue full"}}
        items = [{"index": {"_index": "x", "_id": i,
                            **(busy_item if no else {"status": 201, "result": "created"})}}
                 for i, no in zip(ids, refused, strict=True)]
        return {"took": 1, "errors": any(refused), "items": items}
    return answer


@pytest.mark.parametrize("kind", ["opensearch", "elasticsearch"])
def test_documents_refused_as_busy_are_sent_again_alone(kind: str) -> None:
    """A bulk request whose items the engine refuses one by one as busy (429) is sent again
    with only those items, after a wait; once they are taken nothing is lost."""
    tries: dict[str, int] = {}

    def busy(doc_id: str) -> bool:  # d2 refused twice, then taken
        tries[doc_id] = tries.get(doc_id, 0) + 1
        return doc_id == "d2" and tries[doc_id] <= 2

    with stand_in_engine(lambda n: (200, 0, _bulk_answer(busy))) as (url, seen):
        engine = Engine.connect(EngineSettings(kind=kind, url=url, retry_s=5))
        result = engine.bulk_index("x", [{"_id": f"d{i}", "title": "t"} for i in range(1, 4)])
        assert (result.ok, result.failures) == (3, [])
        assert len(seen) == 3 and tries == {"d1": 1, "d2": 3, "d3": 1}, (seen, tries)
        assert engine.resent == {"429": 2}


@pytest.mark.parametrize("kind", ["opensearch", "elasticsearch"])
def test_a_bulk_request_refused_whole_is_not_retried_twice_over(kind: str) -> None:
    """A bulk request the engine keeps refusing whole (429) is retried for
    SIRA_ENGINE__RETRY_S and then fails, each document named with the status: not retried
    again on top of that, document by document, for many times as long."""
    with stand_in_engine(lambda n: (429, 0)) as (url, seen):
        engine = Engine.connect(EngineSettings(kind=kind, url=url, retry_s=1.5))
        result = engine.bulk_index("x", [{"_id": f"d{i}", "title": "t"} for i in range(1, 4)])
        assert result.ok == 0
        assert [(f.id, f.status) for f in result.failures] == [(f"d{i}", 429) for i in (1, 2, 3)]
        assert 2 <= len(seen) <= 5, len(seen)  # the transport's retries alone


@contextmanager
def busy_at_first(upstream: str, refused: tuple[str, ...]) -> Iterator[str]:
    """A proxy in front of a real engine (plain HTTP) that answers the first request to a
    path holding each of ``refused`` with 429 and passes everything else on. Yields its
    URL."""
    import threading
    import urllib.error
    import urllib.request
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    left = set(refused)

    class Proxy(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            path = self.path.split("?")[0]
            hit = next((r for r in left if r in path), None)
            if hit:
                left.discard(hit)
                status, data = 429, json.dumps({"error": {"type": "es_rejected_execution_exception",
                                                          "reason": "busy"}, "status": 429})
                data = data.encode()
            else:
                request = urllib.request.Request(
                    upstream + self.path, data=body or None, method=self.command,
                    headers={"Content-Type": self.headers.get("Content-Type") or
                             "application/json"})
                try:
                    with urllib.request.urlopen(request, timeout=60) as answer:
                        status, data = answer.status, answer.read()
                except urllib.error.HTTPError as refusal:
                    status, data = refusal.code, refusal.read()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_POST = do_PUT = do_DELETE = do_HEAD = do_GET  # noqa: N815

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()


def test_a_command_says_what_the_engines_pressure_cost(opensearch: Engine, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine answers busy once while documents are loaded and once while searched:
    nothing is lost, and each command ends by saying how many requests went again, why."""
    upstream = engine_env(opensearch, monkeypatch)["SIRA_ENGINE__URL"]
    corpus = write_lines(tmp_path / "c.jsonl", 20)
    index = f"test-rel-{uuid.uuid4().hex[:8]}"
    said = "requests sent again when the engine was busy or slow: 1 after 429"
    try:
        with busy_at_first(upstream, ("/_bulk", "search")) as url:
            monkeypatch.setenv("SIRA_ENGINE__URL", url)
            loaded = runner.invoke(app, ["--index", index, "index", str(corpus)])
            assert loaded.exit_code == 0, loaded.output
            assert "indexed 20" in loaded.output and said in loaded.output
            found = runner.invoke(app, ["--index", index, "search", "Doc 7"])
            assert found.exit_code == 0, found.output
            assert "d7" in found.output and said in found.output
        assert opensearch.count(index) == 20
    finally:
        opensearch.delete_index(index)
