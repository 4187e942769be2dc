"""The measures (``ir_measures``, trec_eval underneath) and the comparisons against BM25:
queries whose first relevant hit moved, a paired bootstrap interval."""

from __future__ import annotations

import ir_measures
import numpy as np
from ir_measures import RR, P, R, nDCG

MEASURES = {"R@10": R @ 10, "R@100": R @ 100, "nDCG@10": nDCG @ 10, "MRR@10": RR @ 10,
            "P@10": P @ 10}
DEPTH = 100
BOOTSTRAP = 10_000

Run = dict[str, list[tuple[str, float]]]  # query id -> ranked (doc id, score)


def per_query(run: Run, qrels: dict[str, dict[str, int]]) -> dict[str, dict[str, float]]:
    """Every measure for every judged query (a query with no hits scores 0)."""
    qrel_list = [ir_measures.Qrel(q, d, s) for q, docs in qrels.items() for d, s in docs.items()]
    scored = [ir_measures.ScoredDoc(q, d, s) for q, hits in run.items() for d, s in hits]
    names = {str(m): name for name, m in MEASURES.items()}
    out = {q: dict.fromkeys(MEASURES, 0.0) for q in qrels}
    for metric in ir_measures.iter_calc(list(MEASURES.values()), qrel_list, scored):
        if metric.query_id in out:
            out[metric.query_id][names[str(metric.measure)]] = float(metric.value)
    for values in out.values():
        values["noise@10"] = 1.0 - values.pop("P@10")
    return out


def mean(values: dict[str, dict[str, float]], measure: str) -> float:
    return float(np.mean([v[measure] for v in values.values()])) if values else 0.0


def paired_bootstrap(a: list[float], b: list[float], seed: int = 0) -> tuple[float, float]:
    """95 % interval of mean(a - b) over resampled queries."""
    diffs = np.asarray(a) - np.asarray(b)
    if len(diffs) == 0:
        return 0.0, 0.0
    rng = np.random.default_rng(seed)
    samples = rng.choice(diffs, size=(BOOTSTRAP, len(diffs)), replace=True).mean(axis=1)
    low, high = np.percentile(samples, [2.5, 97.5])
    return float(low), float(high)


def first_relevant(run: Run, qrels: dict[str, dict[str, int]]) -> dict[str, int | None]:
    out: dict[str, int | None] = {}
    for qid, rels in qrels.items():
        out[qid] = next((rank for rank, (doc, _) in enumerate(run.get(qid, []), start=1)
                         if rels.get(doc, 0) > 0), None)
    return out


def moved(config_run: Run, base_run: Run, qrels: dict[str, dict[str, int]]) -> tuple[int, int]:
    """Queries whose first relevant hit moved up / down against the baseline."""
    far = DEPTH + 1
    mine, base = first_relevant(config_run, qrels), first_relevant(base_run, qrels)
    up = sum(1 for q in qrels if (mine[q] or far) < (base[q] or far))
    down = sum(1 for q in qrels if (mine[q] or far) > (base[q] or far))
    return up, down


