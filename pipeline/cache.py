"""The proposal cache: what the model proposed for a text, stored once per (hash of the text
it read, prompt version, model) in an index of sira's own (``SIRA_ENRICH__CACHE_INDEX``,
default ``sira-proposal-cache``; "" turns it off). An application overwriting a document
with the same text, a reindex into a new index, or the same text in another index costs no
model call: ``enrich.propose`` restores the proposals from here and sends only the rest. The
cache outlives the enriched indices; ``sira cache stats`` / ``sira cache prune`` look after
it. The cache holds what the model said (raw) and the terms made of it (normalised,
classified) with the key of the analysis that made them (``terms.analysis_key``): restored into
an index analysed the same way they are used as they are; into another one, the raw proposals
are normalised and classified again against it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass

from pipeline.engine import BulkResult, Engine
from pipeline.loaders import now_iso

DEFAULT_INDEX = "sira-proposal-cache"
ADDED = {  # fields added after the first caches were made (``ensure`` adds them to those)
    "analysis": {"type": "keyword"},
    "terms": {"type": "object", "enabled": False},
}
BODY = {
    "settings": {"index": {"number_of_shards": 1, "auto_expand_replicas": "0-1"}},
    "mappings": {"dynamic": "strict", "properties": {
        "content_hash": {"type": "keyword"},
        "prompt_version": {"type": "keyword"},
        "model": {"type": "keyword"},
        "raw": {"type": "keyword", "index": False, "doc_values": False},
        "at": {"type": "date"},
        **ADDED,
    }},
}


def key(content_hash: str, prompt_version: str, model: str) -> str:
    return hashlib.sha256(f"{content_hash}|{prompt_version}|{model}".encode()).hexdigest()


@dataclass
class Entry:
    content_hash: str
    raw: list[str]
    terms: list[dict] | None = None  # {"text", "norm", "class"} each, made under ``analysis``


class ProposalCache:
    def __init__(self, engine: Engine, index: str) -> None:
        self.engine, self.index = engine, index
        self._exists: bool | None = None

    @classmethod
    def of(cls, engine: Engine, index: str | None) -> ProposalCache | None:
        return cls(engine, index) if index else None

    def ensure(self) -> None:
        if not self._exists:
            if not self.engine.create(self.index, BODY):  # one made by an earlier version
                self.engine.put_mapping(self.index, ADDED)
            self._exists = True

    def lookup(self, hashes: dict[str, str], prompt_version: str, model: str,
               analysis: str | None = None) -> dict[str, Entry]:
        """Cached entries per document id, given each document's text hash; an entry's
        ``terms`` only where they were made under ``analysis``."""
        if not hashes:
            return {}
        if self._exists is None:
            self._exists = self.engine.index_exists(self.index)
        if not self._exists:
            return {}
        keys = {doc_id: key(h, prompt_version, model) for doc_id, h in hashes.items()}
        found = self.engine.mget(self.index, sorted(set(keys.values())),
                                 source=["raw", "terms", "analysis"])
        out = {}
        for doc_id, k in keys.items():
            if k in found:
                hit = found[k]
                same = analysis is not None and hit.get("analysis") == analysis
                out[doc_id] = Entry(hashes[doc_id], list(hit.get("raw") or []),
                                    hit.get("terms") if same else None)
        return out

    def store(self, entries: list[Entry], prompt_version: str, model: str,
              analysis: str | None = None) -> BulkResult:
        """Remember what the model proposed (a failed write only costs a later model call)."""
        if not entries:
            return BulkResult()
        self.ensure()
        at = now_iso()
        return self.engine.bulk_index(self.index, [
            {"_id": key(e.content_hash, prompt_version, model), "content_hash": e.content_hash,
             "prompt_version": prompt_version, "model": model, "raw": e.raw, "at": at,
             **({"terms": e.terms, "analysis": analysis} if e.terms is not None and analysis
                else {})}
            for e in entries])

    def stats(self) -> dict:
        if not self.engine.index_exists(self.index):
            return {"index": self.index, "entries": 0, "exists": False}
        self.engine.refresh(self.index)
        aggs = self.engine.aggregate(self.index, {
            "by": {"composite": {"size": 100, "sources": [
                {"model": {"terms": {"field": "model"}}},
                {"prompt_version": {"terms": {"field": "prompt_version"}}}]},
                "aggs": {"oldest": {"min": {"field": "at"}}, "newest": {"max": {"field": "at"}}}}})
        stats = self.engine.client.indices.stats(index=self.index, metric="store")
        size = dict(stats)["_all"]["primaries"]["store"]["size_in_bytes"]
        return {"index": self.index, "exists": True, "entries": self.engine.count(self.index),
                "size_bytes": int(size),
                "by_model_and_prompt": [
                    {**b["key"], "entries": b["doc_count"],
                     "oldest": b["oldest"].get("value_as_string"),
                     "newest": b["newest"].get("value_as_string")}
                    for b in aggs["by"]["buckets"]]}

    def prune(self, *, older_than_days: float | None = None, model: str | None = None,
              prompt_version: str | None = None, keep_prompt: str | None = None) -> int:
        """Delete entries: older than a number of days, of a model, of a prompt version, or
        of every prompt version but ``keep_prompt``. Returns how many went."""
        if not self.engine.index_exists(self.index):
            return 0
        must: list[dict] = []
        must_not: list[dict] = []
        if older_than_days is not None:
            before = dt.datetime.now(dt.UTC) - dt.timedelta(days=older_than_days)
            must.append({"range": {"at": {"lte": before.isoformat(timespec="seconds")}}})
        if model:
            must.append({"term": {"model": model}})
        if prompt_version:
            must.append({"term": {"prompt_version": prompt_version}})
        if keep_prompt:
            must_not.append({"term": {"prompt_version": keep_prompt}})
        if not must and not must_not:
            raise ValueError("say what to prune: --older-than, --model, --prompt-version or "
                             "--keep-current-prompt")
        return self.engine.delete_matching(self.index, {"bool": {"filter": must,
                                                                 "must_not": must_not}})
