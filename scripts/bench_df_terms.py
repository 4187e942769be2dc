"""Where the time of apply's DF statistics goes as the collection grows: the scan that reads
every document's proposals (linear in documents), and the counts of the rank policy's
first round (one search per candidate term stopping at 64) by kind of term, each timed
again after the whole term table as apply gathers it. Same collections as ``sira
bench-scale`` (the real one grown with the generator), one index per size, against the local
engine (``sira engine start``):

    python scripts/bench_df_terms.py --dataset ../shared/data/scifact --sizes 10000,100000

Prints one JSON line per size: seconds per part, candidate terms per kind and µs per term.
At 1,000,000 documents (about 45 minutes here, most of it storing the proposals) add
``--no-recount`` (the term table and the kinds each of its rounds counted, not every term
again by kind) and ``--keep`` (keep the index, and measure it again later without
building it).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

from pipeline import batchfiles, dfstats, enrich, local
from pipeline.bench import scale
from pipeline.bench.synthetic import Generator
from pipeline.config import Settings
from pipeline.jobs import index_corpus
from pipeline.loaders import beir_split
from pipeline.profile import Profile
from pipeline.schema import Layout


def kind_of(text: str, pairs: bool) -> str:
    words = text.split()
    if not all(w.isascii() and w.isalnum() for w in words):
        return "other (split by the analyzer)"
    return {1: "one word", 2: "two words (a term)" if pairs else "two words"}.get(
        len(words), "three or more words")


def measure(engine, settings: Settings, corpus: Path, proposals: Path,  # noqa: ANN001
            recount: bool, keep: bool) -> dict:  # noqa: ANN001
    index = settings.index.name
    if not (keep and engine.index_exists(index)):
        index_corpus(engine, settings, corpus, recreate=True)
        batchfiles.import_proposals(engine, settings, proposals)
        engine.refresh(index)
        engine.wait_for_merges(index)
    out: dict = {"documents": engine.count(index)}
    # as apply gathers them (the first time: the engine's caches cold)
    policy = Profile.from_settings(settings.enrich).filter_policy()
    basis = settings.enrich.df_basis
    rounds: list[dict] = []
    original = dfstats._bounded

    def timed(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        started = time.perf_counter()
        got = original(*args, **kwargs)
        rounds.append({"terms": len(args[2]), "bound": args[3], "stopped": len(got[1]),
                       "s": round(time.perf_counter() - started, 2),
                       "kinds": Counter(kind_of(t, pairs) for t in args[2].values())})
        return got

    def timed_bounds(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        started = time.perf_counter()
        got = original_bounds(*args, **kwargs)
        out["word_bounds_s"] = round(time.perf_counter() - started, 2)
        return got

    layout = Layout.of(engine.get_meta(index))
    fields = layout.phrase_fields(enriched=False)
    pairs = len(fields) == 1 and fields[0] in layout.pair_fields
    out["segments"] = engine.segments(index)
    original_bounds = dfstats.word_bounds
    dfstats._bounded, dfstats.word_bounds = timed, timed_bounds
    started = time.perf_counter()
    table = enrich.term_table(engine, index, basis, policy, bounded_from=0)
    out["term_table_s"] = time.perf_counter() - started
    dfstats._bounded, dfstats.word_bounds = original, original_bounds
    out["rounds"] = rounds
    out["outside_counts_s"] = out["term_table_s"] - sum(r["s"] for r in rounds)
    out["cap"] = policy.cap(table.n_docs, table.df.values())
    if not recount:
        if not keep:
            engine.delete_index(index)
        return out
    # then its parts again, one by one (the counts are size-0 searches: the shard request
    # cache would answer them the second time)
    engine.clear_request_cache(index)
    started = time.perf_counter()
    surfaces: dict[str, str] = {}
    for _, source in enrich.proposed_documents(engine, index, ["sira.proposals.terms"]):
        for t in enrich.stored_terms(source):
            surfaces.setdefault(t["norm"], t["text"])
    out["scan_s"] = time.perf_counter() - started
    out["candidate_terms"] = len(surfaces)
    by_kind: dict[str, dict[str, str]] = defaultdict(dict)
    for norm, text in surfaces.items():
        by_kind[kind_of(text, pairs)][norm] = text
    for kind, terms in sorted(by_kind.items()):
        started = time.perf_counter()
        _, halted = dfstats._bounded(engine, index, terms, dfstats.FIRST_BOUND, fields, basis,
                                     dfstats.COUNTS_BATCH, layout.pair_fields, whole=False)
        took = time.perf_counter() - started
        out[kind] = {"terms": len(terms), "s": round(took, 2),
                     "us_per_term": round(took / len(terms) * 1e6, 1),
                     "stopped": len(halted)}
    if not keep:
        engine.delete_index(index)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", type=Path, required=True, help="a BEIR folder with "
                        "recorded/proposals.jsonl")
    parser.add_argument("--sizes", default="10000,100000")
    parser.add_argument("--no-recount", action="store_true", help="only the term table as "
                        "apply gathers it, not every candidate term again by kind (hours "
                        "at 1,000,000 documents)")
    parser.add_argument("--keep", action="store_true", help="keep each index, and measure "
                        "one kept before again instead of building it (warm)")
    args = parser.parse_args()
    proposals = args.dataset / "recorded/proposals.jsonl"
    base = Settings()
    engine = local.connect(base, local_name="local")
    queries, _ = beir_split(args.dataset, "test")
    inputs = scale.Inputs(args.dataset, proposals, queries, {})
    generator = Generator.fit(args.dataset, proposals)
    with tempfile.TemporaryDirectory() as folder:
        for size in (int(s) for s in args.sizes.split(",")):
            settings = base.model_copy(update={"index": base.index.model_copy(
                update={"name": f"sira-df-terms-{size}"})})
            corpus, props = scale.write_collection(inputs, generator, size,
                                                   Path(folder) / str(size))
            print(json.dumps({"size": size, "phrase_terms": base.index.phrase_terms}
                             | measure(engine, settings, corpus, props,
                                       not args.no_recount, args.keep)), flush=True)


if __name__ == "__main__":
    main()
