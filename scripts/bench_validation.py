"""Sketch validation's cost as the collection grows: the DF lookups of every part of every
sketch phrase, three ways, on one index grown with real documents of the collections given
by path (cycled with new ids past their total), the decisions of each compared with the
counts' for every sketch (kept, dropped, searched terms):

- ``dictionary``: what ``query.validate`` does where the term dictionary counts exactly (one
  shard, no deleted copies: this index, written once): the words' analysis and DFs read in
  one ``_termvectors`` request, the phrases no word decides counted as below;
- ``counts``: what it does elsewhere: ``_analyze`` beside one ``_msearch`` of counts that
  stop at cap + 1 on each shard (one word counted whole), then the phrases no word decides;
- ``aggregation``: one ``filters`` aggregation of the same phrase queries (what it did before
  2026-12-02, which visits every match).

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


METHODS = ("aggregation", "counts", "dictionary")


def timed(engine: Engine, index: str, sketches: dict[str, list[str]], cap: int | None,
          method: str) -> tuple[list[float], dict]:
    """Milliseconds per sketch and the decisions, with the lookups done the ``method`` way."""
    bounded, reading = dfstats.bounded_frequencies, dfstats.dictionary_tokens
    if method != "dictionary":
        dfstats.dictionary_tokens = lambda *_: None  # type: ignore[assignment]
    if method == "aggregation":
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
        dfstats.bounded_frequencies, dfstats.dictionary_tokens = bounded, reading


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sketches", type=Path, required=True)
    parser.add_argument("--collections", type=Path, nargs="+", required=True)
    parser.add_argument("--sizes", type=int, nargs="+", default=[5000, 25000, 100000])
    parser.add_argument("--shards", type=int, default=1)
    parser.add_argument("--caps", type=int, nargs="+", default=[50, 0],
                        help="DF caps to validate under (0: no cap)")
    parser.add_argument("--queries", type=int, default=200, help="sketches used")
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS),
                        help="ways of looking the DFs up (aggregation: slow past 100,000)")
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
    methods = [m for m in METHODS if m in args.methods]
    print(f"| documents | cap | {' | '.join(methods)} | same decisions |")
    print(f"|---|---|{'---|' * len(methods)}---|")
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
                for i, method in enumerate(methods):  # each warmed on other phrases
                    timed(engine, index.name, dict(list(warm.items())[50 * i:50 * i + 50]),
                          cap_or_none, method)
                # sketch by sketch, the methods in turn from a different one each time: no
                # method finds the postings warmed by another more often
                ms: dict[str, list[float]] = {m: [] for m in methods}
                decided: dict[str, dict] = {m: {} for m in methods}
                for i, (qid, phrases) in enumerate(sketches.items()):
                    for method in methods[i % len(methods):] + methods[:i % len(methods)]:
                        took, decisions = timed(engine, index.name, {qid: phrases},
                                                cap_or_none, method)
                        ms[method].extend(took)
                        decided[method].update(decisions)
                same = all(decided[m] == decided[methods[0]] for m in methods)
                cells = " | ".join(f"{np.median(ms[m]):.2f} / {np.percentile(ms[m], 95):.1f}"
                                   for m in methods)
                print(f"| {engine.count(index.name):,} | {cap_or_none or 'none'} | {cells} | "
                      f"{'yes' if same else 'NO'} |", flush=True)
    finally:
        engine.delete_index(index.name)


if __name__ == "__main__":
    main()
