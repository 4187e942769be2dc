"""Throughput of the whole enrichment job against plain bulk indexing of the same documents
into the same engine, with the stand-in model server (``pipeline.bench.stand_in``) answering
instantly (the time the workers wait for it taken out); with --gpus, against the same server
answering like 1, 2, 4 GPUs. ``sira bench-scale`` times the job at each size the same way
(``pipeline.bench.job``).

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
import tempfile
import time
import uuid
from itertools import islice
from pathlib import Path

from pipeline import enrich, local
from pipeline.bench import scale
from pipeline.bench.job import JobRun, answers_by_title, phase_ratios, run_job
from pipeline.bench.stand_in import StandInModel
from pipeline.bench.synthetic import Generator
from pipeline.config import IndexSettings, LLMSettings, Settings
from pipeline.jobs import index_corpus
from pipeline.llm import ModelClient
from pipeline.local.redis import RedisServer
from pipeline.prompts import document_body

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
    return path, answers_by_title(path, proposed)


WARM_UP_DOCS = 100_000  # documents the engine is warmed up with before plain bulk is timed
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


def phase_line(run: JobRun, plain_s: float, workers: int) -> str:
    return "  phases, x the time of plain bulk indexing: " + phase_ratios(run.phases(workers),
                                                                          plain_s)


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
    rows, gpu_rows = [], []
    with RedisServer() as redis:
        def job(model: StandInModel, workers: int, in_flight: int | None = None,
                cache: str | None = None):  # noqa: ANN202
            return run_job(engine, base, path, redis.url, model.url, workers,
                           in_flight or workers * base.llm.concurrency, cache_index=cache)

        with StandInModel(answers) as model:
            # the engine warmed up on the first documents (a first bulk load on a fresh
            # engine reads slower than the next), then plain bulk indexing of all of them
            head = tmp / "head.jsonl"
            with open(path) as src, open(head, "w") as dst:
                dst.writelines(islice(src, WARM_UP_DOCS))
            for source in (head, path):
                plain_index = IndexSettings(name=f"bench-plain-{uuid.uuid4().hex[:6]}")
                plain = base.model_copy(update={"index": plain_index})
                started = time.monotonic()
                index_corpus(engine, plain, source)
                plain_s = time.monotonic() - started
                engine.delete_index(plain.index.name)
            plain_rate = args.docs / plain_s
            # the first run fills a proposal cache (as bench-scale's job does) that the
            # same documents read again into a new index: a rebuild, no model call
            cache = f"bench-job-cache-{uuid.uuid4().hex[:6]}"
            try:
                for i, workers in enumerate(args.workers):
                    run = job(model, workers, cache=None if i else cache)
                    rows.append((f"{workers} worker(s), cache empty", run.wall_s,
                                 run.without_model(workers), run.writes))
                    print(run.summary.line())
                    print(phase_line(run, plain_s, workers))
                workers = args.workers[0]
                calls = model.requests
                run = job(model, workers, cache=cache)
            finally:
                engine.delete_index(cache)
            assert model.requests == calls, "the cached job called the model"
            rows.append((f"{workers} worker(s), cache filled", run.wall_s, run.wall_s,
                         run.writes))
            print(run.summary.line())
            print(phase_line(run, plain_s, workers))
        for gpus in args.gpus:
            in_flight = GPU_IN_FLIGHT * gpus
            with StandInModel(delay=GPU_IN_FLIGHT / GPU_DOCS_S, slots=in_flight) as model:
                alone = model_only(model.url, path, in_flight)
                run = job(model, args.workers[0], in_flight)
            print(run.summary.line())
            gpu_rows.append((gpus, in_flight, alone, run.wall_s))
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
