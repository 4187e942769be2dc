"""Sketch validation's cost as the collection grows: the DF lookups of every part of every
sketch phrase, as ``query.validate`` does them (counts that stop at cap + 1 on each shard,
one ``_msearch``), against one ``filters`` aggregation of the same phrase queries (what it
did before 2026-12-02, which visits every match), on one index grown with real documents of
the collections given by path (cycled with new ids past their total), the decisions of the
two compared for every sketch (kept, dropped, searched terms).

    .venv/bin/python scripts/bench_validation.py \\
        --sketches ../shared/data/scifact/recorded/sketches.jsonl \\
        --collections ../shared/data/{scifact,nfcorpus,npl,cacm,cisi,cranfield,medline} \\
        --sizes 5000 25000 100000 --shards 1

Needs a local engine (`sira engine start`). Each sketch is validated once per method and
size, after a warm-up, with the shard request cache off (a user's first validation of it).
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from pipeline import dfstats, local, query
from pipeline.config import IndexSettings, Settings
from pipeline.engine import Engine
from pipeline.profile import DEFAULT_MAX_N


def documents(collections: list[Path]) -> Iterator[dict]:
    for lap in itertools.count():
        for folder in collections:
            with open(folder / "corpus.jsonl", encoding="utf-8") as fh:
                for line in fh:
                    doc = json.loads(line)
                    yield {"_id": f"{folder.name}-{lap}-{doc['_id']}",
                           "title": doc.get("title") or "", "text": doc.get("text") or ""}


def timed(engine: Engine, index: str, sketches: dict[str, list[str]], cap: int | None,
          aggregation: bool) -> tuple[list[float], dict]:
    """Milliseconds per sketch and the decisions, with the lookups done one way or the other
    (``aggregation``: the filters aggregation in place of the bounded counts)."""
    bounded = dfstats.bounded_frequencies
    if aggregation:
        dfstats.bounded_frequencies = (  # type: ignore[assignment]
            lambda e, i, terms, bound, fields, *_, **__: {
                n: min(d, bound) for n, d in dfstats.document_frequencies(
                    e, i, terms, "text", fields=fields).items()})
    try:
        ms, decisions = [], {}
        for qid, phrases in sketches.items():
            started = time.perf_counter()
            v = query.validate(engine, index, phrases, cap, DEFAULT_MAX_N)
            ms.append((time.perf_counter() - started) * 1000)
            decisions[qid] = (v.kept, [d.term for d in v.dropped], v.terms)
        return ms, decisions
    finally:
        dfstats.bounded_frequencies = bounded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sketches", type=Path, required=True)
    parser.add_argument("--collections", type=Path, nargs="+", required=True)
    parser.add_argument("--sizes", type=int, nargs="+", default=[5000, 25000, 100000])
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--caps", type=int, nargs="+", default=[50, 0],
                        help="DF caps to validate under (0: no cap)")
    parser.add_argument("--queries", type=int, default=200, help="sketches used")
    args = parser.parse_args()
    sketches = {}
    for line in args.sketches.read_text("utf-8").splitlines()[:args.queries]:
        row = json.loads(line)
        sketches[row["query_id"]] = row["terms"]
    engine = local.connect(Settings())
    index = IndexSettings(name=f"bench-validation-{uuid.uuid4().hex[:6]}", shards=args.shards)
    engine.create_index(index)
    engine.client.indices.put_settings(index=index.name,
                                       body={"index.requests.cache.enable": False})
    print(f"{len(sketches)} sketches of {args.sketches}, engine {engine.kind}, "
          f"{args.shards} shard(s), max_n {DEFAULT_MAX_N}; ms per sketch, median / p95")
    print("| documents | cap | filters aggregation | bounded counts | same decisions |")
    print("|---|---|---|---|---|")
    source, written = documents(args.collections), 0
    try:
        for size in sorted(args.sizes):
            engine.bulk_index(index.name, itertools.islice(source, size - written),
                              chunk_size=1000)
            written = size
            engine.refresh(index.name)
            warm = {f"w{i}": words.split()[:8] for i, words in
                    enumerate(p for ps in sketches.values() for p in ps[:1])}
            for cap in args.caps:
                cap_or_none = cap or None
                timed(engine, index.name, dict(list(warm.items())[:50]), cap_or_none, True)
                timed(engine, index.name, dict(list(warm.items())[50:100]), cap_or_none, False)
                # sketch by sketch, every other one the other way round: neither method
                # finds the postings warmed by the other more often
                agg_ms, new_ms, agg, new = [], [], {}, {}
                for i, (qid, phrases) in enumerate(sketches.items()):
                    for aggregation in ((True, False) if i % 2 else (False, True)):
                        ms, decided = timed(engine, index.name, {qid: phrases}, cap_or_none,
                                            aggregation)
                        (agg_ms if aggregation else new_ms).extend(ms)
                        (agg if aggregation else new).update(decided)
                print(f"| {engine.count(index.name):,} | {cap_or_none or 'none'} | "
                      f"{np.median(agg_ms):.1f} / {np.percentile(agg_ms, 95):.1f} | "
                      f"{np.median(new_ms):.1f} / {np.percentile(new_ms, 95):.1f} | "
                      f"{'yes' if agg == new else 'NO'} |", flush=True)
    finally:
        engine.delete_index(index.name)


if __name__ == "__main__":
    main()
