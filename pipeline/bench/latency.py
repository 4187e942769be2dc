"""``sira bench-latency``: engine time of the two-clause query against plain BM25."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from pipeline import query
from pipeline.bench.run import Applier, Runner
from pipeline.config import Settings
from pipeline.engine import Engine
from pipeline.profile import DEFAULT_MAX_N, DEFAULT_W, Profile
from pipeline.schema import Layout

LATENCY_QUERIES = ("bm25", "literal", "two-clause")
PHRASES = "two-clause, phrases"  # the template given sketch phrases, where it can be rendered


def latency(engine: Engine, settings: Settings, queries: dict[str, str],
            sketches: dict[str, list[str]], *, w: float = DEFAULT_W, max_n: int = DEFAULT_MAX_N,
            repeat: int = 5, tick: Callable[[], None] | None = None,
            max_sketch_terms: int | None = None) -> dict:
    """Engine-side latency (``took``, ms) of plain BM25 (title + text) and of the literal
    clause alone (title + text + enrichment: the template with no sketch) against the
    two-clause query with the validated sketch (as ``sira search`` sends it: analysed terms),
    over the same queries, one search per request, on one index written once under the
    default filter policy: first as written, then force-merged into one segment. Where the
    engine renders templates, also the template given the sketch phrases (as a person calls
    it from Dev Tools). Validation (per query an ``_analyze`` and one ``_msearch`` of bounded
    counts) is timed apart, after a warm-up, once per sketch; the model call is not part of
    this."""
    runner = Runner(engine, settings, sketches)
    applier = Applier(engine, settings, runner)
    cap = applier(Profile.from_settings(settings.enrich).filter_policy())
    out: dict = {"queries": len(queries), "repeat": repeat}
    try:
        # warm the engine up on other phrases (the queries' own words) first: a cold first
        # pass reads three times a warm one; each sketch is then timed once, never a cached
        # repeat of itself
        pairs = Layout.of(engine.get_meta(runner.index)).pair_fields
        for text in list(queries.values())[:50]:
            query.validate(engine, runner.index, text.split()[:10], cap, max_n,
                           pair_fields=pairs)
        validate_ms, validated = [], {}
        for qid in queries:  # as a search validates its sketch: one query at a time
            started = time.perf_counter()
            validated[qid] = query.validate(engine, runner.index, sketches.get(qid, []), cap,
                                            max_n, max_sketch_terms=max_sketch_terms,
                                            pair_fields=pairs)
            validate_ms.append((time.perf_counter() - started) * 1000)
        out["validation_ms"] = _stats(validate_ms)
        out["expansion_phrases"] = float(np.mean([len(v.kept) for v in validated.values()]))
        out["expansion_terms"] = float(np.mean([len(v.terms) for v in validated.values()]))
        bodies = {qid: {"bm25": query.build_query(text, classes="none"),
                        "literal": query.build_query(text),
                        "two-clause": query.build_query(text, validated[qid].terms, w=w)}
                  for qid, text in queries.items()}
        if engine.capabilities.search_templates:
            query.install_template(engine)
            for qid, text in queries.items():
                bodies[qid][PHRASES] = engine.render_search_template(query.TEMPLATE_ID, (
                    query.template_params(text, w=w, phrases=validated[qid].kept)))
        out["as written"] = _timings(engine, runner.index, bodies, repeat, tick)
        engine.force_merge(runner.index)
        out["force-merged"] = _timings(engine, runner.index, bodies, repeat, tick)
    finally:
        applier.cleanup(None)
    return out


def _stats(values: list[float]) -> dict:
    return {"mean": float(np.mean(values)), "median": float(np.median(values)),
            "p95": float(np.percentile(values, 95))}


EMPTY = {"query": {"match_none": {}}}  # a search that finds nothing: transport and overhead


def _timings(engine: Engine, index: str, bodies: dict[str, dict[str, dict]], repeat: int,
             tick: Callable[[], None] | None) -> dict:
    """took per query kind, and the round trip of each; the round trip less that of an empty
    search, interleaved with the others, estimates the engine's work without ``took``'s
    whole-millisecond truncation (which at sub-millisecond times distorts ratios)."""
    names = list(next(iter(bodies.values()), {}))
    took: dict[str, list[int]] = {name: [] for name in names}
    wall: dict[str, list[float]] = {name: [] for name in [*names, "empty"]}
    for _ in range(repeat):
        for by_name in bodies.values():
            for name, body in [*by_name.items(), ("empty", EMPTY)]:
                started = time.perf_counter()
                response = engine.search(index, {**body, "_source": False})
                wall[name].append((time.perf_counter() - started) * 1000)
                if name != "empty":
                    took[name].append(int(response["took"]))
            if tick:
                tick()
    out: dict = {name: _stats(values) for name, values in took.items()}
    empty = float(np.mean(wall["empty"]))
    out["excess_ms"] = {name: float(np.mean(wall[name])) - empty for name in names}
    for two, suffix in (("two-clause", ""), (PHRASES, "_phrases")):
        for base in ("bm25", "literal"):
            if two in out:
                out[f"ratio_{base}{suffix}"] = {m: out[two][m] / max(out[base][m], 1e-9)
                                                for m in ("mean", "median", "p95")}
                out[f"ratio_{base}{suffix}"]["excess"] = \
                    out["excess_ms"][two] / max(out["excess_ms"][base], 1e-9)
    out["client_ms"] = {name: _stats(values) for name, values in wall.items()}
    out["segments"] = engine.segments(index)
    return out
