"""Enrichment on an index of the user's own, measured: which analyzer should the enrichment
fields get? A BEIR collection is written into a plain user index (title and text, analysed
with each of ``--source-analyzers``), attached (the enrichment fields analysed like the first
source field, the default, or with each other analyzer), given recorded proposals through
``import-proposals``' own code, filtered with the default policy, and searched four ways:

- ``bm25``: the user's fields only, as before attaching;
- ``discover``: what free text in Discover / Dashboards sends (``multi_match`` with no
  field named, so every field the index default searches, the enrichment included);
- ``doc``: ``sira search``'s literal clause (the source fields + the enrichment);
- ``doc+query``: ``sira search`` with the recorded sketch at the default weight.

    .venv/bin/python scripts/bench_attach.py --dataset ../shared/data/scifact \\
        --proposals ../shared/data/scifact/recorded/proposals.jsonl \\
        --sketches ../shared/data/scifact/recorded/sketches.jsonl

Needs a local engine (`sira engine start`). Fixed w and K (no tuning): a comparison of
analyzers, not the bench's tuned table.
"""

from __future__ import annotations

import argparse
import uuid
from pathlib import Path

from pipeline import attach, batchfiles, enrich, local, query
from pipeline.bench import load_sketches
from pipeline.bench.measures import DEPTH, Run, mean, per_query
from pipeline.config import Settings
from pipeline.engine import Engine
from pipeline.loaders import LoadReport, beir_split, iter_corpus, load_queries
from pipeline.profile import DEFAULT_MAX_N, DEFAULT_W, Profile
from pipeline.schema import Layout

MEASURES = ("nDCG@10", "R@10", "R@100")


def user_index(engine: Engine, name: str, dataset: Path, analyzer: str) -> None:
    """A user's plain index of the collection: title and text, nothing of sira's."""
    text = {"type": "text", "analyzer": analyzer}
    engine.create(name, {"settings": {"index": {"number_of_shards": 1,
                                                "number_of_replicas": 0}},
                         "mappings": {"properties": {"title": text, "text": text}}})
    docs = ({"_id": d.id, "title": d.title, "text": d.text}
            for d in iter_corpus(dataset / "corpus.jsonl", LoadReport(), 10_000_000))
    result = engine.bulk_index(name, docs)
    assert result.failed == 0, result.failures[:1]
    engine.refresh(name)


def searches(engine: Engine, index: str, queries: dict[str, str],
             sketches: dict[str, list[str]]) -> dict[str, Run]:
    layout = Layout.of(engine.get_meta(index))
    cap = engine.get_meta(index)["sira_filter"]["cap"]
    validated = query.validate_many(engine, index, {q: sketches.get(q, []) for q in queries},
                                    cap, DEFAULT_MAX_N, layout.phrase_fields(enriched=True))
    bodies: dict[str, dict[str, dict]] = {"bm25": {}, "discover": {}, "doc": {}, "doc+query": {}}
    for qid, text in queries.items():
        bodies["bm25"][qid] = query.search_bodies(
            text, {}, w=DEFAULT_W, classes="none", size=DEPTH, source=False, layout=layout)[0]
        bodies["discover"][qid] = {"size": DEPTH, "_source": False, "query": {"multi_match": {
            "query": text, "type": "best_fields", "lenient": True}}}
        bodies["doc"][qid] = query.search_bodies(
            text, {}, w=DEFAULT_W, classes="both", size=DEPTH, source=False, layout=layout)[0]
        expansion = validated[qid].terms if qid in validated else {}
        bodies["doc+query"][qid] = query.search_bodies(
            text, expansion, w=DEFAULT_W, classes="both", size=DEPTH, source=False,
            layout=layout)[0]
    runs = {}
    for name, by_query in bodies.items():
        qids = list(by_query)
        run: Run = {}
        for start in range(0, len(qids), 64):
            part = qids[start:start + 64]
            for qid, response in zip(part, engine.msearch(index, [by_query[q] for q in part]),
                                     strict=True):
                run[qid] = [(h["_id"], float(h["_score"])) for h in response["hits"]["hits"]]
        runs[name] = run
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", type=Path, required=True)
    parser.add_argument("--proposals", type=Path, required=True)
    parser.add_argument("--sketches", type=Path, required=True)
    parser.add_argument("--split", default="test")
    parser.add_argument("--source-analyzers", nargs="+", default=["standard", "english"])
    parser.add_argument("--enrichment-analyzers", nargs="+", default=["standard", "english"])
    args = parser.parse_args()
    base = Settings()
    engine = local.connect(base)
    queries, qrels = beir_split(args.dataset, args.split)
    sketches = load_sketches(args.sketches, set(load_queries(args.dataset / "queries.jsonl")))
    prompt = enrich.prompt_for(base)
    policy = Profile.from_settings(base.enrich).filter_policy()
    rows = []
    for source in args.source_analyzers:
        for enrichment in [None, *[a for a in args.enrichment_analyzers if a != source]]:
            name = f"bench-attach-{uuid.uuid4().hex[:6]}"
            settings = base.model_copy(update={"index": base.index.model_copy(
                update={"name": name})})
            try:
                user_index(engine, name, args.dataset, source)
                attach.attach(engine, name, ["title", "text"], prompt_version=prompt.version,
                              policy=policy.stored(), template=False, analyzer=enrichment)
                imported = batchfiles.import_proposals(engine, settings, args.proposals)
                applied = enrich.apply(engine, settings)
                runs = searches(engine, name, queries, sketches)
            finally:
                engine.delete_index(name)
            label = f"{source} / {enrichment or f'{source} (default: the first field)'}"
            print(f"{label}: {imported.line()}; {applied.line()}")
            for config, run in runs.items():
                values = per_query(run, qrels)
                rows.append((label, config, *(mean(values, m) for m in MEASURES)))
    print(f"\n{args.dataset.name} ({args.split}, {len(qrels)} judged queries), engine "
          f"{engine.kind}; policy {policy.describe()}, w {DEFAULT_W}, max_n {DEFAULT_MAX_N}")
    print("| text fields / enrichment analyzer | search | " + " | ".join(MEASURES) + " |")
    print("|---|---|" + "---|" * len(MEASURES))
    for label, config, *values in rows:
        print(f"| {label} | {config} | " + " | ".join(f"{v:.4f}" for v in values) + " |")


if __name__ == "__main__":
    main()
