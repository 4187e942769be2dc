"""Throughput of the whole enrichment job against plain bulk indexing of the same documents
into the same engine, with the tests' model server answering instantly (model time excluded).

    .venv/bin/python scripts/bench_job.py --docs 5000 --workers 1 2

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

from pipeline import local  # noqa: E402
from pipeline.config import IndexSettings, LLMSettings, Settings, WorkerSettings  # noqa: E402
from pipeline.jobs import index_corpus, reindex  # noqa: E402
from pipeline.local.workers import LocalWorkers  # noqa: E402

WORDS = ("shard replica heap snapshot mapping analyzer token bulk refresh merge segment "
         "cluster node index alias query score field").split()


def corpus(path: Path, n: int) -> Path:
    with open(path, "w") as fh:
        for i in range(n):
            text = " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(60))
            fh.write(json.dumps({"_id": f"d{i}", "title": f"Note {i}", "text": text}) + "\n")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=5000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    base = Settings()
    engine = local.connect(base)
    tmp = Path(tempfile.mkdtemp(prefix="sira-bench-job-"))
    path = corpus(tmp / "corpus.jsonl", args.docs)
    redis = RedisServer()
    redis.start()
    rows = []
    try:
        with FakeModelServer() as model:
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
                settings = base.model_copy(update={
                    "index": IndexSettings(name=f"bench-job-{uuid.uuid4().hex[:6]}"),
                    "llm": LLMSettings(url=model.url, model="instant", read_timeout=60),
                    "worker": WorkerSettings(broker_url=redis.url, queue=uuid.uuid4().hex[:8]),
                })
                with LocalWorkers(settings, workers):
                    time.sleep(3)  # let the workers connect: worker start-up is not the job
                    started = time.monotonic()
                    summary = reindex(engine, settings, str(path), timeout=3600)
                    wall = time.monotonic() - started
                # the batches' waits for the model, spread over the workers that ran them
                without_model = wall - summary.model_s / workers
                rate, rate_excl = args.docs / wall, args.docs / without_model
                assert summary.enriched == args.docs, summary.line()
                engine.delete_index(settings.index.name)
                rows.append((workers, rate, rate_excl))
                print(summary.line())
                # each phase against plain bulk indexing; the model waits taken out of propose
                phases = dict(summary.phases)
                phases["propose"] = phases.get("propose", 0.0) - summary.model_s / workers
                print("  phases, x the time of plain bulk indexing: " + ", ".join(
                    f"{name} {seconds / plain_s:.2f}x" for name, seconds in phases.items()))
    finally:
        redis.stop()
    print(f"{args.docs} documents, engine {engine.kind} at {engine.url}")
    print(f"plain bulk indexing: {plain_rate:.0f} docs/s")
    for workers, rate, rate_excl in rows:
        print(f"enrichment job, {workers} worker(s): {rate:.0f} docs/s "
              f"= {plain_rate / rate:.2f}x the time of plain bulk indexing; model time "
              f"excluded: {rate_excl:.0f} docs/s = {plain_rate / rate_excl:.2f}x")


if __name__ == "__main__":
    main()
