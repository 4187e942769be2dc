"""``sira bench``: the evaluation instrument.

Indexes a BEIR collection (or reuses the index it built before for the same inputs and
settings), imports recorded proposals through the same code path as ``import-proposals``, and
runs named configurations over the same queries:

- ``bm25``: plain BM25 on title + text (``contents``);
- ``doc``: the enriched index, literal query only (no model at search time);
- ``doc:echo`` / ``doc:bridge``: one class of enrichment terms;
- ``doc+query``: the enriched index plus the validated query sketch, weight ``w``;
- ``query``: the sketch over the un-enriched text;
- ``doc[none]``, ``doc[ratio]``, ``doc[absolute]``, ``doc[rank]``: the filter policies.

Parameters chosen by search (K, ratio, cap, w, max_n) are chosen on a dev split — the
collection's ``train``/``dev`` qrels, or else a fixed, documented part of the test queries held
aside (then the report covers only the rest) — and reported on the test split.

Measures come from ``ir_measures`` (trec_eval underneath): Recall@10, Recall@100, nDCG@10,
MRR@10; noise@10 = 1 - P@10. Against ``bm25``: queries whose first relevant hit moved up or
down, and a paired bootstrap 95 % interval of the difference in Recall@10 and nDCG@10.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from pipeline.bench.inputs import Split, bench_key, load_sketches, prepare_index, splits
from pipeline.bench.latency import LATENCY_QUERIES, PHRASES, latency
from pipeline.bench.measures import Run, first_relevant, mean, moved, paired_bootstrap, per_query
from pipeline.bench.report import Report, markdown, plot, write
from pipeline.bench.run import CONFIGS, Applier, Config, Runner
from pipeline.bench.tune import chosen_profile, tune, tuning_steps
from pipeline.config import Settings
from pipeline.engine import Engine
from pipeline.loaders import beir_split, load_phrasings, load_queries
from pipeline.profile import DEFAULT_MAX_N, DEFAULT_W

__all__ = ["CONFIGS", "LATENCY_QUERIES", "PHRASES", "Config", "Report", "Run", "beir_split",
           "bench", "bench_key", "first_relevant", "latency", "load_sketches", "markdown",
           "mean", "moved", "paired_bootstrap", "per_query", "plot", "prepare_index", "splits",
           "write"]


def bench(engine: Engine, settings: Settings, dataset: Path, *, proposals: Path | None,
          sketches_path: Path | None, split: str = "test", dev_split: str | None = None,
          recreate: bool = False, progress: Callable[[str, int | None], Callable[[], None]]
          | None = None, max_sketch_terms: int | None = None) -> tuple[Report, dict[str, Run]]:
    """Run every configuration the inputs allow; tuned on dev, reported on ``split``.
    ``max_sketch_terms``: the search's budget of sketch terms (``query.validate``)."""
    def noop() -> None:
        return None

    progress = progress or (lambda label, total: noop)
    if proposals is None and sketches_path is None:  # nothing to tune: report every query
        test = Split(*beir_split(dataset, split))
        dev, dev_note = Split({}, {}), "none needed (nothing to tune)"
    else:
        test, dev, dev_note = splits(dataset, split, dev_split)
    all_queries = load_queries(dataset / "queries.jsonl")
    sketches = load_sketches(sketches_path, set(all_queries)) if sketches_path else {}
    notes = prepare_index(engine, settings, dataset, proposals, recreate,
                          progress("indexing", None))
    has_proposals, has_sketches = proposals is not None, bool(sketches)
    report = Report(dataset.name, engine.kind, split, dev_note, settings={
        "bm25_k1": settings.index.bm25_k1, "bm25_b": settings.index.bm25_b,
        "df_basis": settings.enrich.df_basis, "index": settings.index.name,
        "stemming": engine.capabilities.stemming, "proposals": str(proposals or ""),
        "sketches": str(sketches_path or ""), "queries": len(test.queries),
        "max_sketch_terms": max_sketch_terms}, notes=notes)
    phrasings = load_phrasings(dataset / "queries.jsonl")
    runner = Runner(engine, settings, sketches, phrasings, max_sketch_terms)
    apply = Applier(engine, settings, runner)
    best = tune(runner, apply, dev, report, has_proposals, has_sketches,
                 progress("tuning on dev", tuning_steps(has_proposals, has_sketches)))

    report.profile = chosen_profile(report, best, settings, max_sketch_terms).stored()

    runs: dict[str, Run] = {}
    tick = progress("running configurations", None)
    for config in CONFIGS:
        if config.needs_proposals and not has_proposals:
            report.skipped[config.name] = "no proposals given"
            continue
        if config.sketch and not has_sketches:
            report.skipped[config.name] = "no sketches given"
            continue
        if config.also and not phrasings:
            report.skipped[config.name] = "the collection supplies no alternative phrasings"
            continue
        policy = best.get(config.policy or "rank") if has_proposals else None
        cap = apply(policy) if policy else None
        w, max_n = best.get(config.name, (DEFAULT_W, DEFAULT_MAX_N))
        runs[config.name] = runner.run(config, test.queries, w=w, max_n=max_n, cap=cap,
                                       on_query=tick)
        values = per_query(runs[config.name], test.qrels)
        report.per_query[config.name] = values
        row = {m: round(mean(values, m), 4) for m in
               ("R@10", "R@100", "nDCG@10", "MRR@10", "noise@10")}
        if policy and (config.classes != "none" or config.sketch):
            row["policy"] = policy.describe()
            row["cap"] = cap
        if config.sketch:
            row["w"], row["max_n"] = w, max_n
        report.rows[config.name] = row
    if has_proposals:  # keep the index of the default policy for a look at it
        report.settings["index"] = apply.cleanup(keep=best["rank"])

    base = report.per_query.get("bm25", {})
    qids = sorted(test.qrels)
    for name, row in report.rows.items():
        if name == "bm25" or not base:
            continue
        mine = report.per_query[name]
        row["up"], row["down"] = moved(runs[name], runs["bm25"], test.qrels)
        for measure in ("R@10", "nDCG@10"):
            a = [mine[q][measure] for q in qids]
            b = [base[q][measure] for q in qids]
            low, high = paired_bootstrap(a, b)
            row[f"d{measure}"] = round(float(np.mean(a) - np.mean(b)), 4)
            row[f"d{measure} CI"] = [round(low, 4), round(high, 4)]
    return report, runs

