"""Sketch validation on a large phrase-terms index after some of its documents were written
again (deleted copies, as an application's updates leave them), then force-merged: the
committed counts (A) against the same with ``terminate_after`` on the whole term counts too
(B: the engine's count shortcut where a segment has no deletions, a stop at the bound where it
has). Against the local engine (``sira engine start``):

    python scripts/bench_updated_index.py --dataset ../shared/data/scifact --size 1000000
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

from pipeline import dfstats, local
from pipeline.bench import load_sketches, scale
from pipeline.bench.synthetic import Generator
from pipeline.config import Settings
from pipeline.jobs import index_corpus
from pipeline.loaders import beir_split, load_queries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, required=True, help="a BEIR folder with "
                        "recorded/proposals.jsonl and recorded/sketches.jsonl")
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--rewrite", type=float, default=0.01,
                        help="share of the documents written again")
    args = parser.parse_args()
    proposals = args.dataset / "recorded/proposals.jsonl"
    base = Settings()
    settings = base.model_copy(update={"index": base.index.model_copy(
        update={"name": "sira-updated-index", "shards": 1, "phrase_terms": True})})
    engine = local.connect(base, local_name="local")
    queries, _ = beir_split(args.dataset, "test")
    inputs = scale.Inputs(args.dataset, proposals, queries, load_sketches(
        args.dataset / "recorded/sketches.jsonl", set(load_queries(args.dataset /
                                                                   "queries.jsonl"))))
    index = settings.index.name
    original = dfstats._counts

    def stopping(text, norm, bound, basis, fields, pairs=False, whole=True):  # noqa: ANN001, ANN202
        return [body | {"terminate_after": bound}
                for body in original(text, norm, bound, basis, fields, pairs, whole)]

    def measure(state: str) -> None:
        segments = engine.segments(index)
        for cap in (50, args.size // 3):
            for name, counts in (("A", original), ("B", stopping)) * 2:
                dfstats._counts = counts
                got = scale._searches(engine, index, inputs, cap, 1)
                print(json.dumps({"state": state, **segments, "cap": cap, "variant": name} | {
                    k: round(got[k], 2) for k in ("validate_ms", "validate_p95_ms", "plain_ms",
                                                  "two_ms", "expanded_vs_plain")}), flush=True)
        dfstats._counts = original

    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        corpus, _ = scale.write_collection(inputs, Generator.fit(args.dataset, proposals),
                                           args.size, work)
        started = time.perf_counter()
        index_corpus(engine, settings, corpus, recreate=True)
        print(f"indexed {args.size:,} documents in {time.perf_counter() - started:.0f} s")
        rng = random.Random(1)
        again = work / "again.jsonl"
        with open(corpus, encoding="utf-8") as fh, open(again, "w", encoding="utf-8") as out:
            out.writelines(line for line in fh if rng.random() < args.rewrite)
        index_corpus(engine, settings, again)
        engine.refresh(index)
        engine.wait_for_merges(index)
        try:
            measure(f"{args.rewrite:.0%} written again, merges over")
            engine.force_merge(index, wait_s=600)
            engine.wait_for_merges(index)
            measure("force-merged")
        finally:
            engine.delete_index(index)


if __name__ == "__main__":
    main()
