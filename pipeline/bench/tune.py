"""Choosing parameters on dev: each filter policy's parameter over its grid, then w and
max_n of the sketch (the w grid grows while its edge is best); the profile of the choice."""

from __future__ import annotations

import time
from collections.abc import Callable

from pipeline import policies
from pipeline.bench.inputs import Split
from pipeline.bench.measures import Run, mean, per_query
from pipeline.bench.report import Report
from pipeline.bench.run import Applier, Config, Runner
from pipeline.config import Settings
from pipeline.profile import Profile

W_GRID = [0.1, 0.2, 0.3, 0.5, 0.7, 1.0]
W_GROWTH, W_GROWTH_STEPS = 1.5, 4  # w beyond the grid: 1.5, 2.25, ... while it is best
MAX_N_GRID = [1, 2]


def tune(runner: Runner, apply: Applier, dev: Split, report: Report,
         has_proposals: bool, has_sketches: bool, tick: Callable[[], None]) -> dict:
    """Choose K / ratio / cap per policy, then w and max_n, by dev nDCG@10."""
    best: dict = {}

    def score(run: Run) -> float:
        return mean(per_query(run, dev.qrels), "nDCG@10")

    if has_proposals:
        for kind, cls in policies.KINDS.items():
            if not cls.param:
                best[kind] = cls()
                continue
            param, grid = cls.param, list(cls.grid)
            results = []
            for value in grid:
                policy = cls(value)
                apply(policy)
                results.append((score(runner.run(Config("doc"), dev.queries)), value))
                tick()
            dev_score, value = max(results, key=lambda r: (r[0], -grid.index(r[1])))
            best[kind] = cls(value)
            report.chosen[f"{kind}.{param}"] = {"value": value, "dev_nDCG@10": round(dev_score, 4)}
    if has_sketches:
        for name, classes in (("doc+query", "both"), ("query", "none")):
            if classes == "both" and not has_proposals:
                continue
            cap = apply(best["rank"]) if has_proposals else None
            results = []
            grid, new = list(W_GRID), list(W_GRID)
            while new:
                for max_n in MAX_N_GRID:
                    for w in new:
                        run = runner.run(Config(name, classes=classes, sketch=True),
                                         dev.queries, w=w, max_n=max_n, cap=cap)
                        results.append((score(run), w, max_n))
                        tick()
                dev_score, w, max_n = max(results, key=lambda r: (r[0], -r[1], -r[2]))
                # a best w on the edge of the grid: the grid grows, a few steps at most
                new = [round(w * W_GROWTH, 3)] if w == grid[-1] and \
                    len(grid) < len(W_GRID) + W_GROWTH_STEPS else []
                grid += new
            best[name] = (w, max_n)
            report.chosen[f"{name}.w"] = {"value": w, "dev_nDCG@10": round(dev_score, 4)}
            report.chosen[f"{name}.max_n"] = {"value": max_n}
    for entry in report.chosen.values():
        entry["chosen_on"] = report.dev
    return best


def chosen_profile(report: Report, best: dict, settings: Settings,
                   max_sketch_terms: int | None) -> Profile:
    """The search profile of what was chosen on dev (``sira bench --save-profile``): the
    rank filter's K, the sketch's w and max_n (of ``doc+query``, else of ``query``)."""
    values: dict = {"bm25_k1": settings.index.bm25_k1, "bm25_b": settings.index.bm25_b,
                    "max_sketch_terms": max_sketch_terms}
    if "rank" in best:
        values |= {"policy": "rank", "rank_k": best["rank"].rank_k}
    for name, classes in (("doc+query", "both"), ("query", "none")):
        if name in best:
            values |= {"w": best[name][0], "max_n": best[name][1], "classes": classes}
            break
    origin = (f"sira bench {report.dataset} ({report.engine}; chosen on {report.dev}; "
              f"{time.strftime('%Y-%m-%d')})")
    return Profile().merged(values, origin)


def tuning_steps(has_proposals: bool, has_sketches: bool) -> int:
    steps = sum(len(cls.grid) for cls in policies.KINDS.values()) if has_proposals else 0
    if has_sketches:
        steps += len(W_GRID) * len(MAX_N_GRID) * (2 if has_proposals else 1)
    return steps

