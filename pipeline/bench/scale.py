"""``sira bench-scale``: what every step costs as the collection grows.

A real BEIR collection with its recorded proposals and sketches, grown to each size with
documents and proposals from ``pipeline.bench.synthetic`` (fitted on the same collection), one
index per size and shard count, each step timed from the client as a user's job or
application sees it:

- indexing (plain bulk, the baseline), storing the proposals (``import-proposals``);
- the DF statistics ``apply`` gathers for the default filter policy (requests, time, the term
  table's memory: how far the client's resident memory rose), then the enrichment written;
- the index's size on disk;
- sketch validation of the collection's test queries (after a warm-up, each sketch once);
- plain BM25, the literal clause and the two-clause query (client round trips: mean, p95);
- the enrichment job (``sira reindex`` with local Celery workers) against the stand-in model,
  with the proposal cache empty (model waits taken out) and filled (``pipeline.bench.job``).

Growth exponents are fitted between the two largest sizes measured; sizes asked for past what
was measured are extrapolated and said to be.
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline import batchfiles, dfstats, enrich, query
from pipeline.bench import job
from pipeline.bench.synthetic import Generator
from pipeline.config import Settings
from pipeline.engine import Engine, resent_line
from pipeline.jobs import index_corpus
from pipeline.profile import DEFAULT_MAX_N, DEFAULT_W, Profile
from pipeline.schema import Layout

# (key, label, unit) of the figures per size, in the order they are shown
FIGURES = [
    ("index_s", "indexing (plain bulk)", "s"),
    ("import_s", "proposals stored", "s"),
    ("df_s", "DF statistics, bounded counts", "s"),
    ("df_exact_s", "DF statistics, aggregations", "s"),
    ("apply_s", "enrichment written", "s"),
    ("job_own_s", "the job, cache empty, model waits excluded", "s"),
    ("job_cached_s", "the job, cache filled", "s"),
    ("validate_ms", "sketch validation, median", "ms"),
    ("plain_ms", "plain BM25, mean", "ms"),
    ("literal_ms", "literal clause, mean", "ms"),
    ("two_ms", "two-clause, mean", "ms"),
]


WARM_UP = 50  # validations and searches before the timed ones, at least


def _resident_bytes() -> int:
    """The process's resident memory now (Linux), else its peak so far (macOS: bytes)."""
    try:
        with open("/proc/self/statm") as statm:  # size, resident, ... in pages
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except FileNotFoundError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


@contextmanager
def peak_growth() -> Iterator[list[float]]:
    """How far the process's resident memory rose above where it started (MB), sampled
    every 20 ms by a thread: the client's memory for a step, without tracing every
    allocation (tracemalloc made the DF statistics' Python work several times slower).
    Freed memory an earlier step left to the allocator is reused first, so it reads low
    rather than high."""
    start = _resident_bytes()
    peak = [start]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.02):
            peak[0] = max(peak[0], _resident_bytes())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    growth = [0.0]
    try:
        yield growth
    finally:
        done.set()
        sampler.join()
        growth[0] = (max(peak[0], _resident_bytes()) - start) / 2**20


@contextmanager
def counted(engine: Engine) -> Iterator[list[int]]:
    """Counts the search requests (``_msearch`` and aggregations) ``engine`` sends."""
    calls = [0]
    originals = {name: getattr(engine, name) for name in ("msearch", "aggregate")}

    def wrap(fn: Callable) -> Callable:
        def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
            calls[0] += 1
            return fn(*args, **kwargs)
        return counting

    for name, fn in originals.items():
        setattr(engine, name, wrap(fn))
    try:
        yield calls
    finally:
        for name in originals:
            delattr(engine, name)


@dataclass
class Inputs:
    dataset: Path
    proposals: Path
    queries: dict[str, str]
    sketches: dict[str, list[str]]


def write_collection(inputs: Inputs, generator: Generator, size: int, folder: Path
                     ) -> tuple[Path, Path]:
    """The real collection and its recorded proposals, then generated documents (and their
    proposals) up to ``size`` documents in all: (corpus.jsonl, proposals.jsonl)."""
    folder.mkdir(parents=True, exist_ok=True)
    corpus, proposals = folder / "corpus.jsonl", folder / "proposals.jsonl"
    with open(corpus, "w", encoding="utf-8") as docs, \
            open(proposals, "w", encoding="utf-8") as props:
        real = 0
        with open(inputs.dataset / "corpus.jsonl", encoding="utf-8") as fh:
            for line in fh:
                if real == size:
                    break
                docs.write(line if line.endswith("\n") else line + "\n")
                real += 1
        with open(inputs.proposals, encoding="utf-8") as fh:
            for line in fh:
                props.write(line if line.endswith("\n") else line + "\n")
        for doc, proposed in generator.documents(size - real, seed=size):
            docs.write(json.dumps(doc) + "\n")
            props.write(json.dumps({k: proposed[k] for k in ("doc_id", "terms")}) + "\n")
    return corpus, proposals


@dataclass(frozen=True)
class Plan:
    """What a run builds and times. ``plain_only``: index the documents and time validation
    and search on them, without proposals, DF statistics or enrichment (``enriched`` then holds
    the text alone; validation counts against ``cap``, default a third of the collection, near
    the rank policy's cap) -- the sizes the whole build does not fit. ``aggregations``: also
    time the DF statistics gathered with aggregations, as before the bounded counts (hours
    past a few hundred thousand documents). ``warm_up_s``: how long validations and searches
    of other queries run before the timed ones. ``job_workers``: local workers of the job
    timed at each size (0: no job)."""

    repeat: int = 3
    force_merge: bool = False
    plain_only: bool = False
    cap: int | None = None
    aggregations: bool = True
    warm_up_s: float = 60.0
    job_workers: int = 0


def measure(engine: Engine, settings: Settings, inputs: Inputs, corpus: Path,
            proposals: Path, plan: Plan, tick: Callable[[str], None] | None = None) -> dict:
    """Every step on one new index (``settings.index``), dropped afterwards."""
    before = engine.resent.copy()
    try:
        out = _measure(engine, settings, inputs, corpus, proposals, plan, tick)
        out["resent"] = dict(engine.resent - before)  # the engine answered busy, or timed out
    except BaseException:
        with suppress(Exception):  # the error to show is the first one
            engine.delete_index(settings.index.name)
        raise
    engine.delete_index(settings.index.name)
    return out


def _measure(engine: Engine, settings: Settings, inputs: Inputs, corpus: Path,
             proposals: Path, plan: Plan, tick: Callable[[str], None] | None) -> dict:
    index = settings.index.name
    say = tick or (lambda _: None)
    out: dict = {}
    say("indexing")
    started = time.perf_counter()
    indexed = index_corpus(engine, settings, corpus, recreate=True)
    out["index_s"] = time.perf_counter() - started
    out["documents"] = indexed.indexed
    if plan.plain_only:
        cap = plan.cap if plan.cap is not None else out["documents"] // 3
        out |= {"cap": cap, "index_mb": engine.size(index) / 2**20}
        out |= _settled(engine, index, plan, say)
        say("validation and search")
        return out | _searches(engine, index, inputs, cap, plan.repeat, plan.warm_up_s)
    say("storing proposals")
    started = time.perf_counter()
    imported = batchfiles.import_proposals(engine, settings, proposals)
    out["import_s"] = time.perf_counter() - started
    out["proposals_stored"] = imported.stored
    policy = Profile.from_settings(settings.enrich).filter_policy()
    engine.refresh(index)
    # both ways of gathering the DF statistics; apply uses the one enrich.term_table picks
    # for this many documents per shard
    say("DF statistics, bounded counts")
    with counted(engine) as calls, peak_growth() as grown:
        started = time.perf_counter()
        table = enrich.term_table(engine, index, settings.enrich.df_basis, policy,
                                  bounded_from=0)
        out["df_s"] = time.perf_counter() - started
    out["df_peak_mb"] = grown[0]
    out["df_requests"] = calls[0]
    out["candidate_terms"] = len(table.df)
    if plan.aggregations:
        say("DF statistics, aggregations")
        started = time.perf_counter()
        exact = enrich.term_table(engine, index, settings.enrich.df_basis)
        out["df_exact_s"] = time.perf_counter() - started
        out["same_cap"] = policy.cap(exact.n_docs, exact.df.values()) == \
            policy.cap(table.n_docs, table.df.values())
    out["apply_uses"] = "bounded counts" if enrich.counts_bounded(
        out["documents"], settings.index.shards) else "aggregations"
    say("enrichment")
    started = time.perf_counter()
    applied = enrich.apply(engine, settings, policy, table=table)
    out["apply_s"] = time.perf_counter() - started
    out["cap"], out["enriched"] = applied.cap, applied.enriched
    out["index_mb"] = engine.size(index) / 2**20
    out |= _settled(engine, index, plan, say)
    say("validation and search")
    out |= _searches(engine, index, inputs, applied.cap, plan.repeat, plan.warm_up_s)
    return out


def _settled(engine: Engine, index: str, plan: Plan, say: Callable[[str], None]) -> dict:
    """Searches are timed on the index as an application finds it once the build is done:
    refreshed and its background merges over (else they share the CPUs with the searches),
    deleted copies where the merges left them, unless ``plan.force_merge``."""
    out: dict = {}
    engine.refresh(index)
    if plan.force_merge:
        say("force merge")
        started = time.perf_counter()
        engine.force_merge(index)
        out["force_merge_s"] = time.perf_counter() - started
    say("waiting for merges")
    engine.wait_for_merges(index)
    return out | {f"searched_{k}": v for k, v in engine.segments(index).items()}


def _searches(engine: Engine, index: str, inputs: Inputs, cap: int | None, repeat: int,
              warm_up_s: float) -> dict:
    pairs = Layout.of(engine.get_meta(index)).pair_fields
    # warm up on other phrases -- the sketches of the other queries, else the queries' own
    # words -- validated and searched as the timed ones will be, for ``warm_up_s`` at least
    # (an engine started for the run read 7.9 ms a validation and 2.3 ms a plain search at
    # its first size after 300 of each, 2.7 and 1.2 ms at the same size once warm), then
    # each sketch once, as a search validates it: a user's first validation of it
    warm = [phrases for qid, phrases in inputs.sketches.items()
            if qid not in inputs.queries] or \
        [text.split()[:10] for text in inputs.queries.values()]
    until = time.monotonic() + warm_up_s
    for i, phrases in enumerate(itertools.cycle(warm)):
        if i >= WARM_UP and time.monotonic() > until:
            break
        searched = query.validate(engine, index, phrases, cap, DEFAULT_MAX_N,
                                  pair_fields=pairs).terms
        engine.search(index, {**query.build_query(" ".join(phrases[:3]), searched),
                              "_source": False})
    # the shard request cache keeps size-0 results (the counts) until the next refresh: what
    # the warm-up counted would read as free
    engine.clear_request_cache(index)
    validate_ms, validated = [], {}
    for qid in inputs.queries:
        started = time.perf_counter()
        validated[qid] = query.validate(engine, index, inputs.sketches.get(qid, []), cap,
                                        DEFAULT_MAX_N, pair_fields=pairs)
        validate_ms.append((time.perf_counter() - started) * 1000)
    kinds = {"plain": lambda text, _: query.build_query(text, classes="none"),
             "literal": lambda text, _: query.build_query(text),
             "two": lambda text, qid: query.build_query(text, validated[qid].terms, w=DEFAULT_W)}
    wall: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(repeat):
        for qid, text in inputs.queries.items():
            for kind, body in kinds.items():
                started = time.perf_counter()
                engine.search(index, {**body(text, qid), "_source": False})
                wall[kind].append((time.perf_counter() - started) * 1000)
    out = {"validate_ms": float(np.median(validate_ms)),
           "validate_p95_ms": float(np.percentile(validate_ms, 95)),
           # one shard, no deleted copies: one read of it instead of a count per word
           "validation_reads_dictionary": dfstats.reads_dictionary(engine, index)}
    for kind, values in wall.items():
        out[f"{kind}_ms"], out[f"{kind}_p95_ms"] = np.mean(values), np.percentile(values, 95)
    # what a user's application waits for, against plain BM25
    out["expanded_vs_plain"] = (out["validate_ms"] + out["two_ms"]) / out["plain_ms"]
    return out


def slopes(rows: list[dict]) -> dict[str, float]:
    """Log-log slope of each figure between the two largest sizes measured."""
    if len(rows) < 2:
        return {}
    a, b = rows[-2], rows[-1]
    ratio = np.log(b["documents"] / a["documents"])
    return {key: float(np.log(max(b[key], 1e-9) / max(a[key], 1e-9)) / ratio)
            for key, _, _ in FIGURES if key in a and key in b}


def extrapolate(rows: list[dict], size: int) -> dict:
    """Each figure at ``size`` from the two largest sizes measured and their slope."""
    last, grow = rows[-1], slopes(rows)
    factor = size / last["documents"]
    return {"documents": size, "extrapolated": True,
            **{key: last[key] * factor ** slope for key, slope in grow.items()}}


def plot(by_shards: dict[int, list[dict]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for n, (shards, rows) in enumerate(by_shards.items()):
        style = ["-o", "--s", ":^"][n % 3]  # one colour per step, one line style per shards
        docs = [r["documents"] for r in rows]
        for i, (key, label, unit) in enumerate(FIGURES):
            if not all(key in r for r in rows):  # a step this run left out
                continue
            ax = axes[0] if unit == "s" else axes[1]
            ax.plot(docs, [r[key] for r in rows], style, color=colours[i % len(colours)],
                    label=f"{label} ({shards} shard{'s' if shards > 1 else ''})")
    for ax, unit in zip(axes, ("s", "ms"), strict=True):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("documents")
        ax.set_ylabel(unit)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_title("building: time per step")
    axes[1].set_title("searching: time per request, from the client")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run(engine: Engine, settings: Settings, inputs: Inputs, generator: Generator,
        sizes: list[int], shards: list[int], work: Path, plan: Plan = Plan(),
        say: Callable[[str], None] | None = None,
        landed: Callable[[dict[int, list[dict]]], None] | None = None,
        ) -> dict[int, list[dict]]:
    """Every size at every shard count, smallest first: {shards: [figures per size]}.
    ``landed``: called with the figures so far after each row (a run stopped part way
    keeps what it measured)."""
    tell = say or (lambda _: None)
    out: dict[int, list[dict]] = {}
    warm_up = True  # a first bulk load on a fresh engine reads slower than the next
    for size in sorted(sizes):
        folder = work / str(size)
        try:
            corpus, proposals = write_collection(inputs, generator, size, folder)
            if warm_up:
                at = settings.model_copy(update={"index": settings.index.model_copy(
                    update={"name": f"{settings.index.name}-scale-warm-up"})})
                try:
                    index_corpus(engine, at, corpus, recreate=True)
                except BaseException:
                    with suppress(Exception):  # the error to show is the first one
                        engine.delete_index(at.index.name)
                    raise
                engine.delete_index(at.index.name)
                warm_up = False
            for count in shards:
                index = settings.index.model_copy(update={
                    "name": f"{settings.index.name}-scale-{size}-{count}", "shards": count})
                at = settings.model_copy(update={"index": index})
                def step(name: str, size: int = size, count: int = count) -> None:
                    tell(f"{size:,} documents, {count} shard(s): {name}")

                row = measure(engine, at, inputs, corpus, proposals, plan, step)
                out.setdefault(count, []).append(row)
                if landed:
                    landed(out)
                if plan.job_workers and not plan.plain_only:
                    step(f"the job, {plan.job_workers} worker(s)")
                    row |= job.measure(engine, at, corpus, proposals, plan.job_workers)
                    if landed:
                        landed(out)
        finally:  # a million documents are gigabytes: not left behind by a stopped run
            for path in folder.glob("*.jsonl"):
                path.unlink()
    return out


def markdown(by_shards: dict[int, list[dict]], asked: list[int]) -> str:
    """The table per shard count: every figure per size, the growth exponent between the two
    largest sizes measured, and sizes asked for but not measured, extrapolated."""
    lines = []
    for shards, rows in by_shards.items():
        measured = {r["documents"] for r in rows}
        beyond = [s for s in sorted(asked) if s > max(measured)]
        cols = rows + ([extrapolate(rows, s) for s in beyond] if len(rows) > 1 else [])
        grow = slopes(rows)
        head = [f"{r['documents']:,}" + (" (extrapolated)" if r.get("extrapolated") else "")
                for r in cols]
        lines += [f"\n{shards} shard(s)\n", "| step | " + " | ".join(head) + " | slope |",
                  "|---" * (len(cols) + 2) + "|"]
        for key, label, unit in FIGURES:
            if not any(key in r for r in rows):  # a step this run left out
                continue
            cells = ["—" if key not in r else f"{r[key]:.2f} {unit}" if unit == "ms"
                     else f"{r[key]:.1f} {unit}" for r in cols]
            lines.append(f"| {label} | " + " | ".join(cells)
                         + f" | {grow.get(key, float('nan')):.2f} |")
        rows_only = [(r, f"{r['documents']:,}") for r in rows]
        lines.append("\n| measured | " + " | ".join(n for _, n in rows_only) + " |")
        lines.append("|---" * (len(rows) + 1) + "|")
        for label, cell in [
            ("plain bulk indexing, docs/s", lambda r: f"{r['documents'] / r['index_s']:,.0f}"),
            ("DF statistics apply uses", lambda r: r["apply_uses"]),
            ("the job ÷ plain bulk: cache empty, model waits excluded / filled",
             lambda r: f"{r['job_own_s'] / r['index_s']:.2f}x / "
                       f"{r['job_cached_s'] / r['index_s']:.2f}x"),
            ("the job's phases ÷ plain bulk, cache empty; filled",
             lambda r: f"{job.phase_ratios(r['job_phases'], r['index_s'])}; "
                       f"{job.phase_ratios(r['job_cached_phases'], r['index_s'])}"),
            ("the job: enriched, cache empty / filled; model calls when filled",
             lambda r: f"{r['job_enriched']:,} / {r['job_cached_enriched']:,}; "
                       f"{r['job_cached_model_calls']}"),
            ("proposals + DF + enrichment ÷ plain bulk",
             lambda r: f"{(r['import_s'] + _df_used(r) + r['apply_s']) / r['index_s']:.2f}x"),
            ("DF: candidate terms / bounded-count requests",
             lambda r: f"{r['candidate_terms']:,} / {r['df_requests']} "
                       f"({1000 * r['df_requests'] / max(1, r['candidate_terms']):.2f} per 1,000)"),
            ("DF: ms per 1,000 terms, bounded / aggregations",
             lambda r: f"{1e6 * r['df_s'] / max(1, r['candidate_terms']):.0f} / "
                       + (f"{1e6 * r['df_exact_s'] / max(1, r['candidate_terms']):.0f}"
                          if "df_exact_s" in r else "—")),
            ("term table: client memory growth (resident)", lambda r: f"{r['df_peak_mb']:.0f} MB"),
            ("cap (rank policy); same as from exact DFs", _rank_cap),
            ("validation cap (plain only)", lambda r: f"{r['cap']:,}" if "apply_s" not in r
             else "—"),
            ("index size", lambda r: f"{r['index_mb']:,.0f} MB"),
            ("searched: segments / deleted copies",
             lambda r: f"{r['searched_segments']} / {r['searched_deleted_docs']:,}"),
            ("requests sent again (busy answers, timeouts)",
             lambda r: resent_line(r["resent"]) or "none"),
            ("validation p95", lambda r: f"{r['validate_p95_ms']:.2f} ms"),
            ("validation's words from", lambda r: "the term dictionary"
             if r["validation_reads_dictionary"] else "count searches"),
            ("plain / literal / two-clause p95", lambda r: f"{r['plain_p95_ms']:.2f} / "
             f"{r['literal_p95_ms']:.2f} / {r['two_p95_ms']:.2f} ms"),
            ("(validation + two-clause) ÷ plain", lambda r: f"{r['expanded_vs_plain']:.2f}x"),
        ]:
            cells = [_or_dash(cell, r) for r, _ in rows_only]
            if any(c != "—" for c in cells):
                lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _rank_cap(row: dict) -> str:
    if "apply_s" not in row:
        raise KeyError("apply_s")  # a plain-only build has no rank cap
    return f"{row['cap']}; " + {True: "yes", False: "NO"}.get(row.get("same_cap"),
                                                              "not compared")


def _or_dash(cell: Callable[[dict], str], row: dict) -> str:
    try:
        return cell(row)
    except KeyError:  # a step this run left out
        return "—"


def _df_used(row: dict) -> float:
    return row["df_s"] if row["apply_uses"] == "bounded counts" else row["df_exact_s"]


def check_table(closeness: dict[str, tuple[float, float]]) -> str:
    lines = ["| statistic | real | generated | generated ÷ real |", "|---|---|---|---|"]
    for name, (real, made) in closeness.items():
        lines.append(f"| {name} | {real:,.2f} | {made:,.2f} | "
                     f"{made / real if real else float('nan'):.2f} |")
    return "\n".join(lines)
