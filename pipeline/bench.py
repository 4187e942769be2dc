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

import hashlib
import json
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import ir_measures
import numpy as np
from ir_measures import RR, P, R, nDCG

from pipeline import batchfiles, dfstats, enrich, query
from pipeline.config import Settings
from pipeline.engine import Engine, SearchRefused, mappings_dir
from pipeline.jobs import index_corpus
from pipeline.loaders import CorpusError, beir_split, load_phrasings, load_queries
from pipeline.profile import DEFAULT_MAX_N, DEFAULT_W, Classes, Profile

MEASURES = {"R@10": R @ 10, "R@100": R @ 100, "nDCG@10": nDCG @ 10, "MRR@10": RR @ 10,
            "P@10": P @ 10}
DEPTH = 100
BOOTSTRAP = 10_000
HELD_ASIDE = 0.3  # share of the test queries used as dev when a collection has no dev qrels
W_GRID = [0.1, 0.2, 0.3, 0.5, 0.7, 1.0]
W_GROWTH, W_GROWTH_STEPS = 1.5, 4  # w beyond the grid: 1.5, 2.25, ... while it is best
MAX_N_GRID = [1, 2]
K_GRID = [0, 10, 25, 50, 100, 200, 400]
RATIO_GRID = [0.001, 0.0025, 0.005, 0.01, 0.05]
CAP_GRID = [5, 10, 20, 50, 100]

Run = dict[str, list[tuple[str, float]]]  # query id -> ranked (doc id, score)


@dataclass(frozen=True)
class Config:
    name: str
    classes: Classes = "both"
    sketch: bool = False
    policy: str | None = None  # a policy kind to apply first; None = the tuned default
    needs_proposals: bool = True
    also: bool = False  # fuse the collection's alternative phrasings (RRF, equal weights)


CONFIGS = [
    Config("bm25", classes="none", needs_proposals=False),
    Config("doc"),
    Config("doc:echo", classes="echo"),
    Config("doc:bridge", classes="bridge"),
    Config("doc+query", sketch=True),
    Config("query", classes="none", sketch=True, needs_proposals=False),
    Config("doc[none]", policy="none"),
    Config("doc[ratio]", policy="ratio"),
    Config("doc[absolute]", policy="absolute"),
    Config("doc[rank]", policy="rank"),
    Config("doc+also", also=True),
]


# -- inputs --------------------------------------------------------------------------------


def _file_key(path: Path | None) -> str:
    if path is None:
        return "-"
    stat = path.stat()
    return f"{path.resolve()}:{stat.st_size}:{int(stat.st_mtime)}"


def bench_key(dataset: Path, proposals: Path | None, settings: Settings) -> str:
    mapping_text = "".join(mappings_dir().joinpath(n).read_text("utf-8") for n in
                           ("index.json", "analysis-english.json",
                            "analysis-english-nostem.json"))
    parts = [_file_key(dataset / "corpus.jsonl"), _file_key(proposals), mapping_text,
             settings.index.bm25_k1, settings.index.bm25_b, settings.index.max_ngram,
             settings.enrich.df_basis]
    return hashlib.sha1(json.dumps(parts, default=str).encode()).hexdigest()[:10]


def load_sketches(path: Path, known: set[str]) -> dict[str, list[str]]:
    """``{"query_id", "terms"}`` lines; a malformed line or an unknown query id is an error
    that names the line."""
    sketches: dict[str, list[str]] = {}
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise CorpusError(f"{path}:{lineno}: not a JSON line ({exc})") from exc
            if not isinstance(obj, dict) or "query_id" not in obj or not isinstance(
                    obj.get("terms"), list):
                raise CorpusError(f'{path}:{lineno}: expected {{"query_id", "terms": [...]}}')
            qid = str(obj["query_id"])
            if qid not in known:
                raise CorpusError(f"{path}:{lineno}: unknown query id {qid!r}")
            sketches[qid] = [t for t in obj["terms"] if isinstance(t, str) and t.strip()]
    return sketches


@dataclass
class Split:
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]


def splits(dataset: Path, split: str, dev_split: str | None) -> tuple[Split, Split, str]:
    """(test, dev, how the dev split was chosen)."""
    if dev_split == split:
        raise CorpusError(f"--dev-split {dev_split} is the reported split: parameters tuned on "
                          "it would be measured on the queries they were chosen on")
    if dev_split and not (dataset / "qrels" / f"{dev_split}.tsv").is_file():
        raise CorpusError(f"{dataset}: no qrels/{dev_split}.tsv for --dev-split {dev_split}")
    test_q, test_qrels = beir_split(dataset, split)
    for name in ([dev_split] if dev_split else ["dev", "train"]):
        if (dataset / "qrels" / f"{name}.tsv").is_file():
            dev_q, dev_qrels = beir_split(dataset, name)
            return Split(test_q, test_qrels), Split(dev_q, dev_qrels), f"qrels/{name}.tsv"
    ids = sorted(test_q)
    random.Random(13).shuffle(ids)
    dev_ids = set(ids[: int(len(ids) * HELD_ASIDE)])
    dev = Split({q: test_q[q] for q in dev_ids}, {q: test_qrels[q] for q in dev_ids})
    rest = Split({q: t for q, t in test_q.items() if q not in dev_ids},
                 {q: r for q, r in test_qrels.items() if q not in dev_ids})
    note = (f"no dev qrels: {len(dev_ids)} of {len(ids)} {split} queries held aside "
            f"(seed 13, {HELD_ASIDE:.0%}); the report covers the other {len(rest.queries)}")
    return rest, dev, note


# -- running -------------------------------------------------------------------------------


class Runner:
    """Runs configurations over query sets against one bench index."""

    def __init__(self, engine: Engine, settings: Settings, sketches: dict[str, list[str]],
                 phrasings: dict[str, list[str]] | None = None,
                 max_sketch_terms: int | None = None):
        self.engine = engine
        self.settings = settings
        self.index = settings.index.name
        self.sketches = sketches
        self.phrasings = phrasings or {}
        self.max_sketch_terms = max_sketch_terms
        self._validated: dict[tuple, dict[str, query.Validation]] = {}

    def expansion(self, qid: str, cap: int | None, max_n: int, enriched: bool
                  ) -> query.Validation:
        """The validated sketch of one query; the first call for a setting validates the
        sketches of every query at once (a few requests instead of two per query)."""
        setting = (cap, max_n, enriched, self.index)
        if setting not in self._validated:
            fields = dfstats.ENRICHED_FIELDS if enriched else dfstats.TEXT_FIELDS
            self._validated[setting] = query.validate_many(
                self.engine, self.index, self.sketches, cap, max_n, fields,
                self.max_sketch_terms)
        return self._validated[setting].get(qid, query.Validation([], [], {}))

    def run(self, config: Config, queries: dict[str, str], *, w: float = DEFAULT_W,
            max_n: int = DEFAULT_MAX_N,
            cap: int | None = None, on_query: Callable[[], None] | None = None) -> Run:
        qids = list(queries)
        bodies, owners = [], []
        for qid in qids:
            expansion = self.expansion(qid, cap, max_n, config.classes != "none").terms \
                if config.sketch else {}
            also = self.phrasings.get(qid, []) if config.also else []
            searches = query.search_bodies(queries[qid], expansion, also, w=w,
                                           classes=config.classes, size=DEPTH, source=False)
            bodies += searches
            owners += [qid] * len(searches)
        rankings: dict[str, list[list[query.Hit]]] = {qid: [] for qid in qids}
        for start in range(0, len(bodies), 64):
            try:
                responses = self.engine.msearch(self.index, bodies[start:start + 64])
            except SearchRefused as exc:
                raise RuntimeError(f"query {owners[start + exc.position]}: {exc}") from exc
            for qid, response in zip(owners[start:start + 64], responses, strict=True):
                rankings[qid].append([query.Hit(h["_id"], float(h["_score"]), "", "")
                                      for h in response["hits"]["hits"]])
        run: Run = {}
        for qid in qids:
            hits = rankings[qid][0] if len(rankings[qid]) == 1 else \
                query.rrf(rankings[qid], DEPTH)
            run[qid] = [(h.id, h.score) for h in hits]
            if on_query:
                on_query()
        return run


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


# -- the bench -----------------------------------------------------------------------------


@dataclass
class Report:
    dataset: str
    engine: str
    split: str
    dev: str
    settings: dict
    chosen: dict = field(default_factory=dict)  # parameter -> {value, chosen_on, dev nDCG@10}
    rows: dict = field(default_factory=dict)  # config -> summary figures
    per_query: dict = field(default_factory=dict)  # config -> query id -> measures
    skipped: dict = field(default_factory=dict)  # config -> why it did not run
    notes: list[str] = field(default_factory=list)  # inputs left out, and why
    profile: dict = field(default_factory=dict)  # what search should run (--save-profile)


class Applier:
    """Puts a filter policy in force for the runner. Each policy gets an index of its own,
    every document written once with its final enrichment: updating documents in place
    leaves deleted copies that BM25 statistics still count (the engine retains them for its
    soft-deletes leases), which would skew one policy against another. The proposals and
    their DF statistics come from the bench index and are read once."""

    def __init__(self, engine: Engine, settings: Settings, runner: Runner):
        self.engine, self.settings, self.runner = engine, settings, runner
        self.base = settings.index.name
        self.table: enrich.TermTable | None = None
        self.built: dict[dfstats.Policy, tuple[str, int | None]] = {}

    def __call__(self, policy: dfstats.Policy) -> int | None:
        if policy not in self.built:
            self.built[policy] = self._build(policy, f"{self.base}-p{len(self.built)}")
        self.runner.index, cap = self.built[policy]
        return cap

    def _build(self, policy: dfstats.Policy, name: str) -> tuple[str, int | None]:
        if self.table is None:
            self.table = enrich.term_table(self.engine, self.base, self.settings.enrich.df_basis)
        cap = policy.cap(self.table.n_docs, self.table.df.values())
        self.engine.create_index(self.settings.index.model_copy(update={"name": name}),
                                 recreate=True)

        def documents() -> Iterator[dict]:
            for hit in self.engine.scan(self.base):
                doc = {"_id": hit["_id"], **hit["_source"]}
                if doc.get("sira", {}).get("proposed_hash") is not None:
                    doc["enrich_echo"], doc["enrich_bridge"] = enrich.enrichment_fields(
                        enrich.kept_terms(enrich.stored_terms(doc), self.table.df, cap))
                yield doc

        result = self.engine.bulk_index(name, documents())
        if result.failed:
            raise RuntimeError(f"{name}: {result.failed} documents rejected: "
                               f"{result.failures[0].reason}")
        self.engine.refresh(name)
        return name, cap

    def cleanup(self, keep: dfstats.Policy | None) -> str | None:
        """Delete the policy indices but ``keep``'s; return the kept index name."""
        kept = None
        for policy, (name, _) in self.built.items():
            if policy == keep:
                kept = name
            else:
                self.engine.delete_index(name)
        return kept


def _tune(runner: Runner, apply: Applier, dev: Split, report: Report,
          has_proposals: bool, has_sketches: bool, tick: Callable[[], None]) -> dict:
    """Choose K / ratio / cap per policy, then w and max_n, by dev nDCG@10."""
    best: dict = {}

    def score(run: Run) -> float:
        return mean(per_query(run, dev.qrels), "nDCG@10")

    if has_proposals:
        grids = {"rank": ("rank_k", K_GRID), "ratio": ("ratio", RATIO_GRID),
                 "absolute": ("absolute_cap", CAP_GRID)}
        for kind, (param, grid) in grids.items():
            results = []
            for value in grid:
                policy = dfstats.Policy(kind, **{param: value})
                apply(policy)
                results.append((score(runner.run(Config("doc"), dev.queries)), value))
                tick()
            dev_score, value = max(results, key=lambda r: (r[0], -grid.index(r[1])))
            best[kind] = dfstats.Policy(kind, **{param: value})
            report.chosen[f"{kind}.{param}"] = {"value": value, "dev_nDCG@10": round(dev_score, 4)}
        best["none"] = dfstats.Policy("none")
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
    steps = (len(K_GRID) + len(RATIO_GRID) + len(CAP_GRID)) if has_proposals else 0
    if has_sketches:
        steps += len(W_GRID) * len(MAX_N_GRID) * (2 if has_proposals else 1)
    return steps


def prepare_index(engine: Engine, settings: Settings, dataset: Path, proposals: Path | None,
                  recreate: bool, on_doc: Callable[[], None] | None = None) -> list[str]:
    """Build (or reuse) the bench index; returns notes on what was left out. Documents the
    loader rejects (e.g. empty ones) are left out and named; their proposals are ignored.
    Anything else wrong with the inputs is an error."""
    key = bench_key(dataset, proposals, settings)
    index = settings.index.name
    if not recreate and engine.index_exists(index) and \
            engine.get_meta(index).get("bench_key") == key:
        return list(engine.get_meta(index).get("bench_notes", []))
    summary = index_corpus(engine, settings, dataset, recreate=True, on_doc=on_doc)
    if summary.bulk.failed:
        raise CorpusError(f"{dataset}: {summary.line()}")
    left_out = {p.doc_id for p in summary.load.problems}
    notes = [f"document {p.doc_id} left out: {p.reason}" for p in summary.load.problems]
    if proposals:
        imported = batchfiles.import_proposals(engine, settings, proposals)
        problems = [p for p in imported.report.problems
                    if not (p.doc_id in left_out and p.reason == "unknown document id")]
        if problems or imported.rejected:
            first = (problems or imported.rejected)[0]
            raise CorpusError(f"{proposals}: {imported.line()}; first problem: {first}")
        ignored = len(imported.report.problems)
        if ignored:
            notes.append(f"{ignored} proposal line(s) for left-out documents ignored")
    engine.put_meta(index, {"bench_key": key, "bench_notes": notes})
    return notes


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
    best = _tune(runner, apply, dev, report, has_proposals, has_sketches,
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


# -- output --------------------------------------------------------------------------------


def markdown(report: Report) -> str:
    head = ["config", "R@10", "R@100", "nDCG@10", "MRR@10", "noise@10", "ΔR@10 [95% CI]",
            "ΔnDCG@10 [95% CI]", "up/down", "settings"]
    budget = report.settings.get("max_sketch_terms")
    lines = [f"**{report.dataset}** ({report.engine}, {report.split}: "
             f"{report.settings['queries']} queries; dev: {report.dev}"
             + (f"; at most {budget} sketch terms per search" if budget else "") + ")", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    def delta(row: dict, m: str) -> str:
        if f"d{m}" not in row:
            return "—"
        low, high = row[f"d{m} CI"]
        return f"{row[f'd{m}']:+.3f} [{low:+.3f}, {high:+.3f}]"

    for name, row in report.rows.items():

        extra = ", ".join(f"{k} {row[k]}" for k in ("policy", "cap", "w", "max_n") if k in row)
        updown = f"{row['up']}/{row['down']}" if "up" in row else "—"
        lines.append(f"| {name} | {row['R@10']:.3f} | {row['R@100']:.3f} | "
                     f"{row['nDCG@10']:.3f} | {row['MRR@10']:.3f} | {row['noise@10']:.3f} | "
                     f"{delta(row, 'R@10')} | {delta(row, 'nDCG@10')} | {updown} | {extra} |")
    if report.chosen:
        chosen = "; ".join(f"{k} = {v['value']}" for k, v in report.chosen.items())
        lines += ["", f"Chosen on dev ({report.dev}): {chosen}."]
    if report.notes:
        lines += ["", "Inputs: " + "; ".join(report.notes) + "."]
    if report.skipped:
        lines += ["", "Not run: " + "; ".join(f"{k} ({v})" for k, v in report.skipped.items())
                  + "."]
    return "\n".join(lines)


def plot(report: Report, path: Path) -> None:
    """Recall@10 per configuration with a bootstrap 95 % interval of its mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report.rows)
    means, lows, highs = [], [], []
    for i, name in enumerate(names):
        values = [v["R@10"] for v in report.per_query[name].values()]
        rng = np.random.default_rng(i)
        samples = rng.choice(values, size=(2000, len(values))).mean(axis=1)
        low, high = np.percentile(samples, [2.5, 97.5])
        m = float(np.mean(values))
        means.append(m)
        lows.append(m - low)
        highs.append(high - m)
    fig, ax = plt.subplots(figsize=(max(6, len(names) * 0.9), 4))
    ax.bar(names, means, yerr=[lows, highs], capsize=4, color="#4878a8")
    ax.set_ylabel("Recall@10")
    ax.set_title(f"{report.dataset} ({report.engine}, {report.split})")
    ax.set_ylim(0, 1)
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write(report: Report, runs: dict[str, Run], out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / f"{report.dataset}.json", "md": out_dir / f"{report.dataset}.md",
             "png": out_dir / f"{report.dataset}.png"}
    payload = {**report.__dict__, "runs": {n: {q: hits[:10] for q, hits in r.items()}
                                           for n, r in runs.items()}}
    paths["json"].write_text(json.dumps(payload, indent=1))
    paths["md"].write_text(markdown(report) + "\n")
    plot(report, paths["png"])
    return paths


# -- latency -------------------------------------------------------------------------------

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
    it from Dev Tools). Validation (per query an ``_analyze`` and one aggregation request)
    is timed apart; the model call is not part of this."""
    runner = Runner(engine, settings, sketches)
    applier = Applier(engine, settings, runner)
    cap = applier(Profile.from_settings(settings.enrich).filter_policy())
    out: dict = {"queries": len(queries), "repeat": repeat}
    try:
        validate_ms, validated = [], {}
        for qid in queries:  # as a search validates its sketch: one query at a time
            started = time.perf_counter()
            validated[qid] = query.validate(engine, runner.index, sketches.get(qid, []), cap,
                                            max_n, max_sketch_terms=max_sketch_terms)
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
