"""Throughput of the whole enrichment job against plain bulk indexing of the same documents
into the same engine, with the tests' model server answering instantly (the time the workers
wait for it taken out); with --gpus, against the same server answering like 1, 2, 4 GPUs.

    .venv/bin/python scripts/bench_job.py --docs 5000 --workers 1 2
    .venv/bin/python scripts/bench_job.py --docs 3000 --workers 2 --gpus 1 2 4
    .venv/bin/python scripts/bench_job.py --docs 100000 --workers 2 \
        --dataset ../shared/data/scifact --proposals ../shared/data/scifact/recorded/proposals.jsonl

With --dataset and --proposals the documents are that collection's, grown to --docs with
``sira bench-scale``'s generator, and the stand-in answers each with the proposals recorded
(or generated) for it; without, small made-up notes answered with their title's words.

Needs a local engine (`sira engine start`) and redis-server. Prints docs/s and the ratio.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fake_model import FakeModelServer  # noqa: E402
from redis_server import RedisServer  # noqa: E402

from pipeline import enrich, local  # noqa: E402
from pipeline.bench import scale  # noqa: E402
from pipeline.bench.synthetic import Generator  # noqa: E402
from pipeline.config import IndexSettings, LLMSettings, Settings, WorkerSettings  # noqa: E402
from pipeline.jobs import index_corpus, reindex  # noqa: E402
from pipeline.llm import ModelClient  # noqa: E402
from pipeline.local.workers import LocalWorkers  # noqa: E402
from pipeline.prompts import document_body  # noqa: E402

WORDS = ("shard replica heap snapshot mapping analyzer token bulk refresh merge segment "
         "cluster node index alias query score field").split()


def corpus(path: Path, n: int) -> Path:
    with open(path, "w") as fh:
        for i in range(n):
            text = " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(60))
            fh.write(json.dumps({"_id": f"d{i}", "title": f"Note {i}", "text": text}) + "\n")
    return path


def grown(dataset: Path, proposals: Path, n: int, folder: Path
           ) -> tuple[Path, dict[str, list[str]]]:
    """``dataset`` grown to ``n`` documents as bench-scale grows it, and the stand-in's answer
    for each title: the proposals recorded or generated for that document."""
    generator = Generator.fit(dataset, proposals)
    inputs = scale.Inputs(dataset, proposals, {}, {})
    path, proposed = scale.write_collection(inputs, generator, n, folder)
    terms = {p["doc_id"]: p["terms"] for p in map(json.loads, proposed.open()) if p.get("terms")}
    answers = {}  # keyed as the stand-in finds them: the prompt's title line
    for doc in map(json.loads, path.open()):
        title = (doc.get("title") or "").strip().split("\n")[0]
        if title and str(doc["_id"]) in terms:
            answers[title] = terms[str(doc["_id"])]
    return path, answers


GPU_DOCS_S = 30.0  # documents/s one GPU serves (the published vLLM figure for the default)
GPU_IN_FLIGHT = 32  # at this many requests in flight


def model_only(url: str, docs: Path, in_flight: int) -> float:
    """Seconds the stand-in needs to answer every document's request, driven by the client
    alone at ``in_flight`` concurrent requests: the floor a job can reach."""
    settings = LLMSettings(url=url, model="gpu", read_timeout=600, concurrency=in_flight)
    prompt = enrich.prompt_for(Settings())
    items = [(d["_id"], document_body(d["title"], d["text"]))
             for d in map(json.loads, docs.read_text().splitlines())]
    client = ModelClient(settings)
    try:
        started = time.monotonic()
        answers = client.keywords(prompt, items)
        assert all(a.ok for a in answers)
        return time.monotonic() - started
    finally:
        client.close()


def run_job(engine, base: Settings, path: Path, redis: RedisServer, model: FakeModelServer,
            workers: int, in_flight: int, cache_index: str | None = None):
    """One job into a new index; returns its summary, wall time and index operations per
    document (the engine's count). ``cache_index``: a proposal cache to use and keep (else
    one of its own, so that no run finds the proposals of the one before, dropped after)."""
    suffix = uuid.uuid4().hex[:6]
    cache = cache_index or f"bench-job-cache-{suffix}"
    settings = base.model_copy(update={
        "index": IndexSettings(name=f"bench-job-{suffix}"),
        "llm": LLMSettings(url=model.url, model="bench", read_timeout=600,
                           concurrency=max(1, in_flight // workers)),
        "worker": WorkerSettings(broker_url=redis.url, queue=suffix),
        "enrich": base.enrich.model_copy(update={"cache_index": cache}),
    })
    with LocalWorkers(settings, workers):
        time.sleep(3)  # let the workers connect: worker start-up is not the job
        started = time.monotonic()
        summary = reindex(engine, settings, str(path), timeout=3600)
        wall = time.monotonic() - started
    assert summary.enriched == summary.documents, summary.line()
    writes = engine.writes(settings.index.name) / summary.documents
    engine.delete_index(settings.index.name)
    if cache_index is None:
        engine.delete_index(cache)
    return summary, wall, writes


def phase_line(summary, plain_s: float, workers: int) -> str:
    phases = dict(summary.phases)
    if "propose" in phases:
        phases["propose"] -= summary.model_s / workers
    return "  phases, x the time of plain bulk indexing: " + ", ".join(
        f"{name} {seconds / plain_s:.2f}x" for name, seconds in phases.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=5000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--gpus", type=int, nargs="*", default=[],
                        help="also run the job against the stand-in answering like this many "
                             f"GPUs ({GPU_DOCS_S:.0f} docs/s each at {GPU_IN_FLIGHT} in "
                             "flight), with the first --workers count, against the model alone")
    parser.add_argument("--dataset", type=Path, help="a BEIR folder to grow to --docs")
    parser.add_argument("--proposals", type=Path, help="the proposals recorded for it")
    args = parser.parse_args()
    base = Settings()
    engine = local.connect(base)
    tmp = Path(tempfile.mkdtemp(prefix="sira-bench-job-"))
    answers: dict[str, list[str]] = {}
    if args.dataset:
        path, answers = grown(args.dataset, args.proposals, args.docs, tmp)
    else:
        path = corpus(tmp / "corpus.jsonl", args.docs)
    redis = RedisServer()
    redis.start()
    rows, gpu_rows = [], []
    try:
        with FakeModelServer(answers) as model:
            plain_times = []
            for _ in range(2):  # the first run warms the engine up; the second is measured
                plain_index = IndexSettings(name=f"bench-plain-{uuid.uuid4().hex[:6]}")
                plain = base.model_copy(update={"index": plain_index})
                started = time.monotonic()
                index_corpus(engine, plain, path)
                plain_times.append(time.monotonic() - started)
                engine.delete_index(plain.index.name)
            plain_s = plain_times[-1]
            plain_rate = args.docs / plain_s
            for workers in args.workers:
                summary, wall, writes = run_job(engine, base, path, redis, model, workers,
                                                workers * base.llm.concurrency)
                # less the time the workers sat waiting for the model, spread over them
                without_model = wall - summary.model_s / workers
                rows.append((f"{workers} worker(s), cache empty", wall, without_model, writes))
                print(summary.line())
                print(phase_line(summary, plain_s, workers))
            # the same documents again into a new index, the proposal cache filled by the
            # first job: a rebuild or a reindex elsewhere (no model call)
            workers = args.workers[0]
            cache = f"bench-job-cache-{uuid.uuid4().hex[:6]}"
            try:
                run_job(engine, base, path, redis, model, workers,
                        workers * base.llm.concurrency, cache)
                calls = model.requests
                summary, wall, writes = run_job(engine, base, path, redis, model, workers,
                                                workers * base.llm.concurrency, cache)
            finally:
                engine.delete_index(cache)
            assert model.requests == calls, "the cached job called the model"
            rows.append((f"{workers} worker(s), cache filled", wall, wall, writes))
            print(summary.line())
            print(phase_line(summary, plain_s, workers))
        for gpus in args.gpus:
            in_flight = GPU_IN_FLIGHT * gpus
            with FakeModelServer(delay=GPU_IN_FLIGHT / GPU_DOCS_S, slots=in_flight) as model:
                alone = model_only(model.url, path, in_flight)
                summary, wall, _ = run_job(engine, base, path, redis, model,
                                           args.workers[0], in_flight)
            print(summary.line())
            gpu_rows.append((gpus, in_flight, alone, wall))
    finally:
        redis.stop()
    print(f"{args.docs} documents, engine {engine.kind} at {engine.url}")
    print(f"plain bulk indexing: {plain_rate:.0f} docs/s")
    for label, wall, own, writes in rows:
        print(f"enrichment job, {label}: {args.docs / wall:.0f} docs/s "
              f"= {wall / plain_s:.2f}x the time of plain bulk indexing; model waits "
              f"excluded: {args.docs / own:.0f} docs/s = {own / plain_s:.2f}x; "
              f"{writes:.2f} writes per document")
    for gpus, in_flight, alone, wall in gpu_rows:
        print(f"stand-in at {gpus} GPU(s)' speed ({in_flight} in flight): the model alone "
              f"{alone:.1f}s ({args.docs / alone:.0f} docs/s), the job with "
              f"{args.workers[0]} worker(s) {wall:.1f}s: job / model alone = {wall / alone:.2f}")


if __name__ == "__main__":
    main()
