"""Bulk indexing orchestration: documents from a loader, written to the engine in batches,
every skipped input and every rejected item counted and reported."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.config import Settings
from pipeline.engine import BulkResult, Engine
from pipeline.loaders import Document, LoadReport, iter_corpus

STATUS_PENDING = "pending"


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def to_index_doc(doc: Document) -> dict:
    """The stored form of a loaded document; enrichment fields are added later."""
    body: dict = {
        "_id": doc.id,
        "title": doc.title,
        "text": doc.text,
        "sira": {"content_hash": doc.content_hash, "status": STATUS_PENDING,
                 "indexed_at": now_iso()},
    }
    if doc.meta:
        body["meta"] = doc.meta
    if doc.source_path:
        body["source_path"] = doc.source_path
    return body


@dataclass
class IndexSummary:
    load: LoadReport = field(default_factory=LoadReport)
    bulk: BulkResult = field(default_factory=BulkResult)

    @property
    def indexed(self) -> int:
        return self.bulk.ok

    def line(self) -> str:
        return (f"loaded {self.load.loaded}, indexed {self.bulk.ok}, "
                f"skipped {self.load.skipped} bad input(s), rejected {self.bulk.failed} by engine")


def _counting(docs: Iterable[Document], on_doc: Callable[[], None] | None) -> Iterator[dict]:
    for doc in docs:
        if on_doc:
            on_doc()
        yield to_index_doc(doc)


def index_corpus(
    engine: Engine,
    settings: Settings,
    path: Path,
    *,
    recreate: bool = False,
    on_doc: Callable[[], None] | None = None,
) -> IndexSummary:
    """Create the index (if needed) from mappings/ and load ``path`` into it."""
    summary = IndexSummary()
    engine.create_index(settings.index, recreate=recreate)
    docs = iter_corpus(path, summary.load, settings.load.max_doc_bytes)
    summary.bulk = engine.bulk_index(
        settings.index.name, _counting(docs, on_doc), chunk_size=settings.load.bulk_batch_docs
    )
    engine.refresh(settings.index.name)
    return summary
