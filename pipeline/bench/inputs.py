"""What the bench reads: the collection and its splits, the recorded sketches, the bench
index (built once per inputs and settings, through the product's own indexing and
``import-proposals``)."""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline import batchfiles
from pipeline.config import Settings
from pipeline.engine import Engine, mappings_dir
from pipeline.jobs import index_corpus
from pipeline.loaders import CorpusError, beir_split

HELD_ASIDE = 0.3  # share of the test queries used as dev when a collection has no dev qrels


def _file_key(path: Path | None) -> str:
    if path is None:
        return "-"
    stat = path.stat()
    return f"{path.resolve()}:{stat.st_size}:{int(stat.st_mtime)}"


def bench_key(dataset: Path, proposals: Path | None, settings: Settings) -> str:
    mapping_text = "".join(mappings_dir().joinpath(n).read_text("utf-8") for n in
                           ("index.json", "sira.json", "analysis-english.json",
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

