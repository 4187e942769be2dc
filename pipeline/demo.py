"""The first run (``sira demo``): the sample collection enriched — with the model output
recorded for it (``sample/recorded/``, replayed through the code ``import-proposals`` uses),
or the live model when one is configured — and every judged sample query searched three
ways: plain BM25, with the documents' enrichment, and with the query-side sketch too."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from pipeline import batchfiles, enrich
from pipeline.bench.measures import mean, per_query
from pipeline.config import Settings
from pipeline.engine import Engine
from pipeline.llm import ModelClient
from pipeline.query import Hit, search

SAMPLE = Path(__file__).parent / "sample"
RECORDED = SAMPLE / "recorded"
CONFIGS = ("BM25", "+ doc terms", "+ sketch")
MEASURES = ("nDCG@10", "R@10")


class ReplayFailed(RuntimeError):
    """The recorded output could not all be stored (the message names what)."""


def replay_recorded(engine: Engine, settings: Settings) -> tuple[str, int]:
    """Store the sample's recorded proposals and apply the filter; (model, documents)."""
    path = RECORDED / "proposals.jsonl"
    summary = batchfiles.import_proposals(engine, settings, path)
    if summary.report.skipped or summary.refused or summary.rejected:
        raise ReplayFailed(f"{path}: {summary.line()}")
    enrich.apply(engine, settings)
    model = json.loads(path.read_text("utf-8").splitlines()[0])["model"]
    return model, summary.stored


def recorded_sketches() -> dict[str, list[str]]:
    rows = (json.loads(line) for line in
            (RECORDED / "sketches.jsonl").read_text("utf-8").splitlines() if line.strip())
    return {row["query_id"]: row["terms"] for row in rows}


@dataclass
class Compared:
    query_id: str
    text: str
    judged: set[str]
    rankings: dict[str, list[Hit]] = field(default_factory=dict)  # config -> hits
    sketch: list[str] | None = None
    note: str | None = None  # what became of the sketch, where not all of it was used

    def first_judged(self, config: str) -> int | None:
        return next((rank for rank, hit in enumerate(self.rankings[config], start=1)
                     if hit.id in self.judged), None)


def compare(engine: Engine, settings: Settings, queries: dict[str, str],
            qrels: dict[str, dict[str, int]], *, sketches: dict[str, list[str]] | None = None,
            client: ModelClient | None = None, size: int = 10) -> list[Compared]:
    """Each query three ways. ``sketches``: recorded sketches; else the live model's
    (``client``), as ``sira search --expand`` asks for them."""
    out = []
    for qid, text in queries.items():
        row = Compared(qid, text, {d for d, grade in qrels.get(qid, {}).items() if grade > 0})
        row.rankings["BM25"] = search(engine, settings, text, classes="none", size=size).hits
        row.rankings["+ doc terms"] = search(engine, settings, text, size=size).hits
        if sketches is not None:
            expanded = search(engine, settings, text, expansion=sketches.get(qid, []),
                              size=size)
        else:
            expanded = search(engine, settings, text, expand=True, client=client, size=size)
        row.sketch, row.note = expanded.expansion, expanded.expansion_note
        row.rankings["+ sketch"] = expanded.hits
        out.append(row)
    return out


def measures(rows: list[Compared], qrels: dict[str, dict[str, int]]
             ) -> dict[str, dict[str, float]]:
    """nDCG@10 and R@10 of each configuration over the compared queries."""
    judged = {row.query_id: qrels.get(row.query_id, {}) for row in rows}
    out = {}
    for config in CONFIGS:
        # scored by rank: the engine's order, ties included, is what is measured
        run = {row.query_id: [(h.id, float(len(row.rankings[config]) - rank))
                              for rank, h in enumerate(row.rankings[config])] for row in rows}
        values = per_query(run, judged)
        out[config] = {m: mean(values, m) for m in MEASURES}
    return out
