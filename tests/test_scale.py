"""``sira bench-scale``: the generator's laws and fit (pure), and a whole run on the sample
collection grown by generated documents, through the CLI, on a real engine."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from test_cli import engine_env, runner

from pipeline.bench.synthetic import Generator, Zipf, made_up_word, words_of
from pipeline.cli import app
from pipeline.engine import Engine

SAMPLE = Path(__file__).resolve().parent.parent / "pipeline" / "sample"
RECORDED = SAMPLE / "recorded" / "proposals.jsonl"


def bench_scale(index: str, out: Path, *options: str) -> list[str]:
    """The arguments of ``sira bench-scale`` on the sample and its recordings into
    ``index``-scale-*, one pass, no warm-up, with the ``options`` a test is about."""
    return ["--index", index, "bench-scale", "--dataset", str(SAMPLE), "--proposals",
            str(RECORDED), "--sketches", str(SAMPLE / "recorded" / "sketches.jsonl"),
            "--split", "test", "--repeat", "1", "--warm-up", "0", "--out", str(out), *options]


def test_zipf_fit_finds_the_law_that_drew_the_stream() -> None:
    law = Zipf(a=1.8, q=20.0)
    stream = law.draw(np.random.default_rng(5), 200_000).tolist()
    fitted = Zipf.fit(stream)
    assert fitted.a == pytest.approx(1.8, rel=0.1)
    # the fitted law expects the vocabulary the stream had, at its length and at a quarter
    assert fitted.expected_distinct(len(stream)) == pytest.approx(len(set(stream)), rel=0.01)
    assert fitted.expected_distinct(50_000) == pytest.approx(len(set(stream[:50_000])), rel=0.1)
    assert len({made_up_word(r) for r in range(1, 20_000)}) == 19_999
    assert all(re.fullmatch(r"[a-z]+", made_up_word(r)) for r in (1, 55, 10**9))


def test_generated_documents_follow_the_recorded_sample() -> None:
    generator = Generator.fit(SAMPLE, RECORDED)
    recorded = [json.loads(line) for line in RECORDED.open()]
    counts = {len(r["terms"]) for r in recorded}
    made = list(generator.documents(200, seed=3))
    assert made == list(generator.documents(200, seed=3))  # the same seed, the same documents
    assert len({d["_id"] for d, _ in made}) == 200
    vocabulary = set(generator.vocabulary)
    for doc, proposed in made:
        assert proposed["doc_id"] == doc["_id"]
        assert len(proposed["key"]) + len(proposed["new"]) in counts
        text = " ".join(words_of(doc["text"]))
        for term in proposed["key"]:  # found in the document, as a key term is
            assert " ".join(words_of(term)) in text, (term, doc["_id"])
    words = [w for d, _ in made for w in words_of(d["text"])]
    assert sum(w in vocabulary for w in words) / len(words) > 0.5  # mostly the sample's words
    lengths = [len(words_of(d["text"])) for d, _ in made]
    real = [len(words_of(json.loads(line)["text"])) for line in (SAMPLE / "corpus.jsonl").open()]
    assert min(real) <= min(lengths) and max(lengths) <= max(real)


def test_generated_words_cluster_in_documents_as_real_ones_do(tmp_path: Path) -> None:
    """Real words cluster in the documents about them: a word used 60 times is in 20
    documents, not 57. The generator draws words at their document frequencies and repeats
    words within a document as often as the real ones do, so common words are in as many
    documents as in the real collection (drawn independently, a mid-frequency word was in two
    to four times as many)."""
    rng = np.random.default_rng(1)
    general = [made_up_word(r) for r in range(1000, 1300)]
    topics = [[made_up_word(r) for r in range(10 * t + 1, 10 * t + 11)] for t in range(20)]
    docs, recorded = [], []
    for i in range(400):
        about = topics[i % 20]  # each document repeats the words of its topic
        words = list(rng.choice(about, 30)) + list(rng.choice(general, 30))
        rng.shuffle(words)
        docs.append({"_id": f"r{i}", "title": "", "text": " ".join(words)})
        key = general[i % 300]  # a term proposed for one or two documents each
        recorded.append({"doc_id": f"r{i}", "terms": [key, "zuvax"], "key": [key],
                         "new": ["zuvax"]})
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    proposals = tmp_path / "proposals.jsonl"
    proposals.write_text("".join(json.dumps(r) + "\n" for r in recorded))

    def by_documents(texts: list[str]) -> list[int]:
        seen = Counter(w for t in texts for w in set(words_of(t)))
        return sorted(seen.values(), reverse=True)

    generator = Generator.fit(tmp_path, proposals)
    made = [d["text"] for d, _ in generator.documents(400, seed=2)]
    real, generated = by_documents([d["text"] for d in docs]), by_documents(made)
    for rank in (1, 50, 250, 400):
        assert generated[rank - 1] == pytest.approx(real[rank - 1], rel=0.25), rank
    real_words = [words_of(d["text"]) for d in docs]
    assert generator.repeat == pytest.approx(
        1 - sum(len(set(w)) for w in real_words) / sum(len(w) for w in real_words))
    made_words = [words_of(t) for t in made]
    repeated = 1 - sum(len(set(w)) for w in made_words) / sum(len(w) for w in made_words)
    assert repeated == pytest.approx(generator.repeat, abs=0.05)


def test_bench_scale_on_the_sample(opensearch: Engine, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    engine_env(opensearch, monkeypatch)
    out = tmp_path / "out"
    name = f"test-scale-{uuid.uuid4().hex[:6]}"
    result = runner.invoke(app, bench_scale(
        name, out, "--sizes", "60,150,10000", "--measure-up-to", "150", "--shards", "1,2",
        "--job-workers", "0"))
    assert result.exit_code == 0, result.output
    report = json.loads((out / "scale.json").read_text())
    for shards in ("1", "2"):
        rows = report["results"][shards]
        assert [r["documents"] for r in rows] == [60, 150]
        assert [r["proposals_stored"] for r in rows] == [60, 150]
        for row in rows:
            assert row["same_cap"] and row["enriched"] == row["documents"]
            assert 0 < row["df_requests"] <= 3 and row["candidate_terms"] > 100
            assert row["index_mb"] > 0 and row["validate_ms"] > 0 and row["two_ms"] > 0
            # searched once the merges were over: what is left of the updates' copies is said
            assert row["searched_segments"] >= int(shards) and row["searched_deleted_docs"] >= 0
            assert row["resent"] == {}  # a small index on a quiet engine: nothing sent again
    assert "| requests sent again (busy answers, timeouts) | none | none |" in result.output
    assert "| 10,000 (extrapolated) |" in result.output
    assert "| distinct proposed terms |" in result.output
    assert re.search(r"\| searched: segments / deleted copies \| \d+ / [\d,]+ \|", result.output)
    assert (out / "scale.png").read_bytes()[:4] == b"\x89PNG"
    assert not opensearch.client.indices.get(index=f"{name}-scale-*")  # dropped


def test_bench_scale_times_the_job_with_the_cache_empty_then_filled(
        opensearch: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """At each size the job runs as a user runs it (local Celery workers, a real Redis, the
    model client over HTTP to the stand-in answering with the recorded proposals): every
    document sent to the model with the cache empty, none with it filled; its indices and
    cache dropped afterwards."""
    engine_env(opensearch, monkeypatch)
    out = tmp_path / "out"
    name = f"test-scale-{uuid.uuid4().hex[:6]}"
    result = runner.invoke(app, bench_scale(
        name, out, "--sizes", "80", "--shards", "1", "--no-aggregations", "--job-workers", "1"))
    assert result.exit_code == 0, result.output
    row, = json.loads((out / "scale.json").read_text())["results"]["1"]
    assert row["documents"] == 80 and row["job_workers"] == 1
    assert row["job_enriched"] == row["job_cached_enriched"] == 80
    assert row["job_cached_from_cache"] == 80 and row["job_cached_model_calls"] == 0
    assert 0 < row["job_own_s"] <= row["job_s"] and row["job_cached_s"] > 0
    assert row["job_writes"] > 0
    assert re.search(r"\| the job ÷ plain bulk: cache empty, model waits excluded / filled "
                     r"\| [\d.]+x / [\d.]+x \|", result.output)
    assert "| the job: enriched, cache empty / filled; model calls when filled | 80 / 80; 0 |" \
        in result.output
    assert set(row["job_phases"]) == {"copy", "queue", "propose", "apply"}
    assert set(row["job_cached_phases"]) == {"copy", "apply"}  # nothing sent to the model
    assert not opensearch.client.indices.get(index=f"{name}-scale-*")  # job and cache too


def test_bench_scale_a_failed_job_is_one_line(opensearch: Engine, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A job that stops (here made to, after the build was measured) ends the run with one
    line naming why, and the figures measured before it stay."""
    from pipeline.bench import job
    from pipeline.jobs import JobFailed

    def stopped(*args: object) -> dict:
        raise JobFailed("the engine refuses writes to it (before sending any document)")

    engine_env(opensearch, monkeypatch)
    monkeypatch.setattr(job, "measure", stopped)
    out = tmp_path / "out"
    result = runner.invoke(app, bench_scale(
        f"test-scale-{uuid.uuid4().hex[:6]}", out, "--sizes", "60,90", "--shards", "1",
        "--no-aggregations"))
    assert result.exit_code == 2, result.output
    assert "error: the enrichment job stopped: the engine refuses writes" in result.output
    assert "Traceback" not in result.output
    row, = json.loads((out / "scale.json").read_text())["results"]["1"]
    assert row["documents"] == 60 and row["enriched"] == 60 and "job_s" not in row


def test_bench_scale_without_redis_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline import cli

    monkeypatch.setattr(cli.shutil, "which", lambda name: None)
    result = runner.invoke(app, ["bench-scale", "--dataset", str(SAMPLE), "--proposals",
                                 str(RECORDED), "--sketches", str(RECORDED)])
    assert result.exit_code == 2
    assert "the job needs redis-server" in result.output and "--job-workers 0" in result.output
    assert "Traceback" not in result.output


def test_bench_scale_plain_only_with_phrase_terms(opensearch: Engine, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """``--plain-only`` indexes and times validation and search, nothing else; the index is
    built as the settings say (here with two-word phrase terms) and dropped."""
    engine_env(opensearch, monkeypatch)
    monkeypatch.setenv("SIRA_INDEX__PHRASE_TERMS", "true")
    out = tmp_path / "out"
    name = f"test-scale-{uuid.uuid4().hex[:6]}"
    result = runner.invoke(app, bench_scale(
        name, out, "--sizes", "90,150,1000", "--measure-up-to", "150", "--shards", "1",
        "--plain-only", "--cap", "7"))
    assert result.exit_code == 0, result.output
    report = json.loads((out / "scale.json").read_text())
    assert report["phrase_terms"] and report["plain_only"]
    rows = report["results"]["1"]
    assert [r["documents"] for r in rows] == [90, 150]
    for row in rows:
        assert row["cap"] == 7 and row["validate_ms"] > 0 and row["two_ms"] > 0
        assert not {"import_s", "df_s", "apply_s", "enriched"} & row.keys()  # not built
    assert "| sketch validation, median |" in result.output
    assert "| proposals stored |" not in result.output
    assert re.search(r"\| validation cap \(plain only\) \| 7 \| 7 \|", result.output)
    assert (out / "scale.png").read_bytes()[:4] == b"\x89PNG"
    assert not opensearch.client.indices.get(index=f"{name}-scale-*")


def test_bench_scale_cap_without_plain_only_is_one_line() -> None:
    result = runner.invoke(app, ["bench-scale", "--dataset", str(SAMPLE), "--proposals",
                                 str(RECORDED), "--sketches", str(RECORDED), "--cap", "5"])
    assert result.exit_code == 2
    assert "--cap goes with --plain-only" in result.output and "Traceback" not in result.output


def test_bench_scale_bad_sizes_is_one_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["bench-scale", "--dataset", str(SAMPLE), "--proposals",
                                 str(RECORDED), "--sketches", str(RECORDED), "--sizes", "10k"])
    assert result.exit_code == 2
    assert "--sizes and --shards take comma-separated whole numbers" in result.output
    assert "Traceback" not in result.output


def test_bench_scale_keeps_the_rows_of_a_stopped_run(opensearch: Engine, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Each row is written as it lands: a run stopped in its second size (here by a fault
    in the measurement) leaves the first size's figures in scale.json and scale.md."""
    from pipeline.bench import scale

    engine_env(opensearch, monkeypatch)
    measure = scale.measure

    def stopped_at_150(engine, settings, inputs, corpus, proposals, plan, tick):  # noqa: ANN001
        if settings.index.name.endswith("-150-1"):
            raise KeyboardInterrupt
        return measure(engine, settings, inputs, corpus, proposals, plan, tick)

    monkeypatch.setattr(scale, "measure", stopped_at_150)
    out = tmp_path / "out"
    result = runner.invoke(app, bench_scale(
        f"test-scale-{uuid.uuid4().hex[:6]}", out, "--sizes", "90,150", "--shards", "1",
        "--plain-only", "--cap", "7"))
    assert result.exit_code == 130
    assert "stopped: the index and files of the size in hand were dropped; the sizes " \
        "measured before it are in" in result.output
    rows = json.loads((out / "scale.json").read_text())["results"]["1"]
    assert [r["documents"] for r in rows] == [90]
    assert "| sketch validation, median |" in (out / "scale.md").read_text()


def test_peak_growth_sees_memory_held_inside_the_step() -> None:
    from pipeline.bench.scale import peak_growth

    with peak_growth() as grown:
        held = bytearray(80 * 2**20)
        held[::4096] = b"x" * len(held[::4096])  # touch every page: resident, not reserved
        time.sleep(0.1)
        del held
    assert grown[0] >= 60
    with peak_growth() as idle:
        time.sleep(0.05)
    assert idle[0] < 20


def test_bench_scale_stopped_by_sigterm_drops_what_it_made(opensearch: Engine, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """A run stopped as a pod is (SIGTERM, here mid-build) drops its index and generated
    files as Ctrl-C does — at a million documents they are gigabytes — and says so in a
    line, not a traceback."""
    import os
    import signal
    import subprocess
    import sys

    env = engine_env(opensearch, monkeypatch)
    name = f"test-scale-{uuid.uuid4().hex[:6]}"
    out = tmp_path / "out"
    run = subprocess.Popen(
        [sys.executable, "-c", "from pipeline.cli import app; app()",
         *bench_scale(name, out, "--sizes", "4000", "--shards", "1", "--job-workers", "0",
                      "--no-aggregations")],
        env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not opensearch.index_exists(f"{name}-scale-4000-1"):
        assert time.monotonic() < deadline and run.poll() is None, run.communicate()[0]
        time.sleep(0.1)
    run.send_signal(signal.SIGTERM)
    output, _ = run.communicate(timeout=60)
    assert run.returncode == 130, output
    assert "Traceback" not in output, output
    assert output.splitlines()[-1] == "error: stopped: the index and files of the size in " \
        "hand were dropped; no size was measured before it", output
    time.sleep(1)  # a write still in flight would have made the index again by now
    assert not opensearch.client.indices.get(index=f"{name}-scale-*")
    assert not list((out / "work").rglob("*.jsonl"))
