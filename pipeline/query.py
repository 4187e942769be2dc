"""Query side: search the index. Plain BM25 for now; the expansion clause, the sketch and the
stored template build on the same result types."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.engine import Engine

TEXT_FIELD = "contents"  # title + text as one field (copy_to), as Pyserini's BEIR "flat" index


@dataclass
class Hit:
    id: str
    score: float
    title: str
    text: str


@dataclass
class SearchResult:
    query: str
    hits: list[Hit]
    took_ms: int
    total: int


def bm25_query(text: str) -> dict:
    return {"match": {TEXT_FIELD: {"query": text}}}


def search(engine: Engine, index: str, text: str, *, size: int = 10) -> SearchResult:
    """Plain BM25 over title + text."""
    response = engine.search(
        index, {"query": bm25_query(text), "size": size, "_source": ["title", "text"]}
    )
    hits = [
        Hit(h["_id"], float(h["_score"]), h["_source"].get("title", ""),
            h["_source"].get("text", ""))
        for h in response["hits"]["hits"]
    ]
    return SearchResult(text, hits, int(response["took"]), int(response["hits"]["total"]["value"]))
