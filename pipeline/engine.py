"""One adapter over the official ``elasticsearch`` and ``opensearch-py`` clients.

Everything the pipeline asks of a search engine goes through ``Engine``: index creation from
``mappings/``, bulk writes with per-item error accounting, partial updates, search,
aggregations, ``_analyze`` and stored search templates. The two clients share call shapes
(``body=``), so the adapter differs between engines only where the servers do.
"""

from __future__ import annotations

import copy
import json
import os
import random
import socket
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache, cached_property
from importlib import resources
from importlib.abc import Traversable
from itertools import islice
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from tenacity import (
    RetryCallState,
    retry,
    wait_exponential,
    wait_random,
)

from pipeline.config import EngineKind, EngineSettings, IndexSettings, redact_url
from pipeline.schema import ENRICHED_FIELD, PHRASE_TERMS_META, TEXT_FIELD

RETRY_ON_STATUS = (429, 502, 503, 504)
UNREACHABLE_ATTEMPTS = 4  # an engine that refuses connections: a few quick tries, then an error
BUSY_ITEM_WAITS = (1, 2, 4, 8, 16)  # seconds before bulk items refused as busy go again
POOL_SIZE = 10  # connections an engine client keeps open (the elasticsearch client's default)
# sira's own hidden index holding a document per index whose _meta a sira process is writing
META_LOCK_INDEX = "sira-locks"


@cache
def _unreachable_errors() -> tuple[type[BaseException], ...]:
    """Both clients' errors for an engine that cannot be reached. Functions, so that
    importing this module does not import both clients."""
    import elastic_transport
    import opensearchpy

    return (opensearchpy.ConnectionError, opensearchpy.ConnectionTimeout,
            elastic_transport.ConnectionError, elastic_transport.ConnectionTimeout)


@cache
def _timeout_errors() -> tuple[type[BaseException], ...]:
    import elastic_transport
    import opensearchpy

    return (opensearchpy.ConnectionTimeout, elastic_transport.ConnectionTimeout)


def transient_errors() -> tuple[type[BaseException], ...]:
    """Errors after which a whole operation may be tried again later (the engine was
    unreachable)."""
    return (*_unreachable_errors(), OSError)


def _with_backoff(send: Callable, retry_s: float, resent: Counter[str]) -> Callable:
    """A transport's ``perform_request`` that sends a request again, after a wait that grows
    (0.5, 1, 2 ... 30 s, with jitter), while the engine answers busy (429: its write queue or
    memory is full), a proxy in front of it cannot pass it on (502-504) or it times out, for
    up to ``retry_s``; a refused connection only a few times, quickly (a wrong URL should
    fail at once). The clients' own retries go again with no wait, which a busy engine
    answers busy again. Each resend is counted in ``resent`` by why (status, ``timeout``,
    ``unreachable``)."""

    def why(state: RetryCallState) -> str | None:
        """Why the last attempt is worth sending again ("429", "timeout" ...), else None."""
        outcome = state.outcome
        if outcome is None:
            return None
        if outcome.failed:
            exc = outcome.exception()
            if isinstance(exc, _timeout_errors()):
                return "timeout"
            if isinstance(exc, _unreachable_errors()):
                return "unreachable"
            status = status_of(exc)
        else:  # the Elasticsearch client raises for a response's status after the transport
            status = getattr(getattr(outcome.result(), "meta", None), "status", None)
        return str(status) if status in RETRY_ON_STATUS else None

    def stop(state: RetryCallState) -> bool:
        if retry_s <= 0:
            return True
        if why(state) == "unreachable":
            return state.attempt_number >= UNREACHABLE_ATTEMPTS
        return state.seconds_since_start >= retry_s

    return retry(retry=lambda state: why(state) is not None, stop=stop,
                 wait=wait_exponential(multiplier=0.5, max=30) + wait_random(0, 0.25),
                 before_sleep=lambda state: resent.update([why(state)]), reraise=True,
                 retry_error_callback=lambda state: state.outcome.result())(send)


class EngineUnavailable(RuntimeError):
    """No engine is configured, or the configured one cannot be reached."""


def meta_hold_s(engine: EngineSettings) -> float:
    """The longest a ``_meta`` write can hold its lock: two requests (read, write), each
    sent again for up to ``retry_s`` and waited on for ``request_timeout``."""
    return 2 * (engine.retry_s + engine.request_timeout) + 10


class MetaBusy(EngineUnavailable):
    """Another sira process held the lock on an index's ``_meta`` for longer than a write
    of it can take, and had not let go."""


class SearchRefused(RuntimeError):
    """One search of a multi-search (the one at ``position``) was refused; ``error`` is the
    engine's error object."""

    def __init__(self, status: int, error: Any, position: int) -> None:
        super().__init__(f"search refused ({status}): {_failure_reason(error)}")
        self.status, self.error, self.position = status, error, position


def mappings_dir() -> Traversable:
    """``mappings/`` beside the package in a checkout; inside it (``pipeline/mappings``) once
    installed from a wheel."""
    checkout = Path(__file__).resolve().parent.parent / "mappings"
    if checkout.is_dir():
        return checkout
    return resources.files("pipeline") / "mappings"


def load_mapping_file(name: str) -> dict:
    return json.loads(mappings_dir().joinpath(name).read_text("utf-8"))


def sira_mapping(text_options: dict) -> dict:
    """The mapping of the ``sira`` object (mappings/sira.json), its two enrichment fields
    given ``text_options`` (analyzer, similarity, copy_to)."""
    mapping = copy.deepcopy(load_mapping_file("sira.json"))
    mapping.pop("_comment", None)
    for name in ("echo", "bridge"):
        mapping["properties"][name].update(copy.deepcopy(text_options))
    return mapping


@dataclass
class ItemFailure:
    id: str
    status: int
    reason: str
    where: str | None = None  # file:line of the input it came from, when known

    def __str__(self) -> str:
        shown = self.id if len(self.id) <= 80 else f"{self.id[:60]}... ({len(self.id)} chars)"
        where = f"{self.where}: " if self.where else ""
        return f"{where}document {shown}: rejected by the engine ({self.status}): {self.reason}"


@dataclass
class BulkResult:
    ok: int = 0
    failures: list[ItemFailure] = field(default_factory=list)

    @property
    def failed(self) -> int:
        return len(self.failures)

    def merge(self, other: BulkResult) -> None:
        self.ok += other.ok
        self.failures.extend(other.failures)


@dataclass(frozen=True)
class Capabilities:
    """What the connected server can do; the minimal Elasticsearch distribution lacks the
    analysis-common and lang-mustache modules."""

    analysis: str  # "english" (analysis-common), "english-plugin" (ours), "english-nostem"
    search_templates: bool

    @property
    def stemming(self) -> bool:
        return self.analysis != "english-nostem"


def _error_body(exc: Any) -> Any:
    """The response body of a refused request (``body`` in elasticsearch, ``info`` in
    opensearch-py)."""
    return exc.body if hasattr(exc, "body") else getattr(exc, "info", None)


def reason_of(exc: Any) -> str:
    """The engine's own reason for a refused request (its error type and reason)."""
    body = _error_body(exc)
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return _failure_reason(body["error"])
    return str(exc)[:500]


def resent_line(resent: Mapping[str, int]) -> str:
    """``Engine.resent`` as people read it: "2 after 429, 1 after timeout"."""
    return ", ".join(f"{n} after {why}" for why, n in resent.items())


def _busy(failure: ItemFailure) -> bool:
    """Refused for the engine's load (429), not for a block (a full disk's is 429 too)."""
    return failure.status == 429 and not failure.reason.startswith("cluster_block_exception")


def _failure_reason(error: Any) -> str:
    if isinstance(error, dict):
        reason = f"{error.get('type', 'error')}: {error.get('reason', '')}".strip()
        caused = error.get("caused_by")
        if isinstance(caused, dict):
            reason += f" (caused by {caused.get('type')}: {caused.get('reason')})"
        return reason
    return str(error)


class _Elasticsearch:
    """What the ``elasticsearch`` client spells differently."""

    kind: EngineKind = "elasticsearch"

    @staticmethod
    def make(url: str, engine: EngineSettings, password: str | None, api_key: str | None,
             tls: dict[str, Any], common: dict[str, Any]) -> Any:
        from elasticsearch import Elasticsearch

        auth: dict[str, Any] = {}
        if engine.username and password:
            auth["basic_auth"] = (engine.username, password)
        if api_key:
            auth["api_key"] = api_key
        return Elasticsearch(url, **auth, **(tls if url.startswith("https") else {}), **common)

    @staticmethod
    def request(client: Any, method: str, path: str, body: Any) -> Any:
        headers = {"accept": "application/json"}
        if body is not None:
            headers["content-type"] = "application/json"
        return client.perform_request(method, path, headers=headers, body=body).body

    @staticmethod
    def forcemerge(client: Any, name: str) -> None:
        client.options(request_timeout=3600).indices.forcemerge(index=name, max_num_segments=1)

    @staticmethod
    def get(client: Any, index: str, doc_id: str) -> Any:
        return client.options(ignore_status=404).get(index=index, id=doc_id)

    @staticmethod
    def helpers() -> Any:
        from elasticsearch import helpers

        return helpers


class _OpenSearch:
    """What the ``opensearch-py`` client spells differently."""

    kind: EngineKind = "opensearch"

    @staticmethod
    def make(url: str, engine: EngineSettings, password: str | None, api_key: str | None,
             tls: dict[str, Any], common: dict[str, Any]) -> Any:
        from opensearchpy import OpenSearch

        auth: dict[str, Any] = {}
        if engine.username and password:
            auth["http_auth"] = (engine.username, password)
        headers = {"Authorization": f"ApiKey {api_key}"} if api_key else None
        if url.startswith("https"):
            tls = {**tls, "use_ssl": True, "ssl_show_warn": engine.verify_certs}
        else:
            tls = {}
        # opensearch-py names the client-wide timeout ``timeout``: given ``request_timeout``
        # it keeps its 10 s default without a word, and resends any request slower than that
        common = {("timeout" if k == "request_timeout" else k): v for k, v in common.items()}
        # its pool keeps one connection unless told (the elasticsearch client keeps 10): a
        # request sent beside another opened a connection of its own and dropped it after
        return OpenSearch([url], headers=headers, pool_maxsize=POOL_SIZE, **auth, **tls,
                          **common)

    @staticmethod
    def request(client: Any, method: str, path: str, body: Any) -> Any:
        return client.transport.perform_request(method, path, body=body)

    @staticmethod
    def forcemerge(client: Any, name: str) -> None:
        client.indices.forcemerge(index=name, max_num_segments=1, request_timeout=3600)

    @staticmethod
    def get(client: Any, index: str, doc_id: str) -> Any:
        return client.get(index=index, id=doc_id, ignore=404)

    @staticmethod
    def helpers() -> Any:
        from opensearchpy import helpers

        return helpers


CLIENTS = {c.kind: c for c in (_Elasticsearch, _OpenSearch)}


class Engine:
    def __init__(self, client: Any, kind: EngineKind, url: str):
        self.client = client
        self.kind = kind
        self.vendor = CLIENTS[kind]
        self.url = redact_url(url)
        # requests sent again after a busy answer or a timeout, by why ("429", "timeout" ...)
        self.resent: Counter[str] = Counter()
        # the longest a _meta write (two requests, each sent again for up to retry_s) can
        # hold its lock: older locks are a stopped process's, and taken over
        self.meta_hold_s = meta_hold_s(EngineSettings())
        self._lock_index_ready = False

    # -- connecting ----------------------------------------------------------------------

    @classmethod
    def connect(cls, engine: EngineSettings, url: str | None = None) -> Engine:
        url = url or engine.url
        if not url:
            raise EngineUnavailable("no engine URL given")
        password, api_key = _secret(engine.password), _secret(engine.api_key)
        if password and api_key:
            raise EngineUnavailable("set SIRA_ENGINE__PASSWORD or SIRA_ENGINE__API_KEY, not both")
        tls: dict[str, Any] = {"verify_certs": engine.verify_certs}
        if engine.ca_file:
            tls["ca_certs"] = str(engine.ca_file)
        # retries are _with_backoff's, not the clients' (theirs do not wait)
        common = {"request_timeout": engine.request_timeout, "max_retries": 0,
                  "retry_on_timeout": False, "retry_on_status": ()}
        client = CLIENTS[engine.kind].make(url, engine, password, api_key, tls, common)
        connected = cls(client, engine.kind, url)
        connected.meta_hold_s = meta_hold_s(engine)
        client.transport.perform_request = _with_backoff(
            client.transport.perform_request, engine.retry_s, connected.resent)
        return connected

    def close(self) -> None:
        self.client.close()

    def health(self) -> dict:
        return dict(self.client.cluster.health())

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        return self.vendor.request(self.client, method, path, body)

    @cached_property
    def version(self) -> str:
        """The nodes' versions (``_cat/nodes``: the minimal Elasticsearch has no ``GET /``)."""
        rows = self.client.cat.nodes(h="version", format="json")
        return ",".join(sorted({str(r.get("version")) for r in rows}))

    @cached_property
    def capabilities(self) -> Capabilities:
        analysis = "english-nostem"
        for name, stemmer in (("english", {"type": "stemmer", "language": "english"}),
                              ("english-plugin", {"type": "sira_porter_stem"})):
            try:
                self.client.indices.analyze(body={"tokenizer": "standard", "text": "running",
                                                  "filter": [stemmer]})
                analysis = name
                break
            except Exception as exc:  # the engine answers 400 for an unknown filter type
                if status_of(exc) != 400:
                    raise
        languages = self._request("GET", "/_script_language")
        names = {entry.get("language") for entry in languages.get("language_contexts", [])}
        return Capabilities(analysis=analysis, search_templates="mustache" in names)

    # -- indices -------------------------------------------------------------------------

    def index_body(self, index: IndexSettings) -> dict:
        """The create-index body: mappings/index.json with the analysis this engine supports
        and the BM25 and shard settings of ``index``."""
        body = copy.deepcopy(load_mapping_file("index.json"))
        analysis = load_mapping_file(f"analysis-{self.capabilities.analysis}.json")
        settings = body["settings"]
        settings["analysis"] = analysis
        settings["index"]["number_of_shards"] = index.shards
        settings["index"]["number_of_replicas"] = index.replicas
        settings["index"]["similarity"]["sira_bm25"].update(k1=index.bm25_k1, b=index.bm25_b)
        body["mappings"]["properties"]["sira"] = sira_mapping(
            {"analyzer": "sira_english", "similarity": "sira_bm25", "copy_to": ["enriched"]})
        if index.phrase_terms:
            pair_fields = [TEXT_FIELD, ENRICHED_FIELD]
            for name in pair_fields:
                body["mappings"]["properties"][name]["index_phrases"] = True
            body["mappings"]["_meta"] = {PHRASE_TERMS_META: pair_fields}
        return body

    def create_index(self, index: IndexSettings, *, recreate: bool = False) -> bool:
        """Create ``index.name``; False if it already existed (and ``recreate`` is off)."""
        if recreate:
            self.delete_index(index.name)
        elif self.index_exists(index.name):
            return False
        return self.create(index.name, self.index_body(index))

    def create(self, name: str, body: dict) -> bool:
        """Create an index from a body; False if it exists already."""
        try:
            self.client.indices.create(index=name, body=body)
        except Exception as exc:  # another job or writer created it a moment ago: fine
            if "resource_already_exists_exception" not in str(exc):
                raise
            return False
        self.client.cluster.health(index=name, wait_for_status="yellow")
        return True

    def delete_matching(self, index: str, query: dict) -> int:
        """Delete the matching documents (a scroll and bulk deletes: `_delete_by_query` is a
        module the minimal Elasticsearch lacks); how many were deleted."""
        self.refresh(index)
        actions = ({"_op_type": "delete", "_index": index, "_id": hit["_id"]}
                   for hit in self.scan(index, query, source=False))
        result = self._bulk(actions, 500)
        self.refresh(index)
        return result.ok

    def index_exists(self, name: str) -> bool:
        return bool(self.client.indices.exists(index=name))

    def delete_index(self, name: str) -> None:
        if self.index_exists(name):
            self.client.indices.delete(index=name)

    def refresh(self, name: str) -> None:
        self.client.indices.refresh(index=name)

    def clear_request_cache(self, name: str) -> None:
        """Drop the shard request cache of ``name`` (it keeps size-0 results, such as counts,
        until the next refresh that changes the index)."""
        self.client.indices.clear_cache(index=name, request=True)

    def segments(self, name: str) -> dict[str, int]:
        """Lucene segments of an index and the deleted documents they still hold."""
        rows = self.client.cat.segments(index=name, format="json")
        return {"segments": len(rows),
                "deleted_docs": sum(int(r.get("docs.deleted") or 0) for r in rows)}

    def writes(self, name: str) -> int:
        """Index operations the primaries of ``name`` have taken (every new document, every
        overwrite and every partial update counts one): what a job cost the engine."""
        stats = self.client.indices.stats(index=name, metric="indexing")
        return int(stats["_all"]["primaries"]["indexing"]["index_total"])

    def size(self, name: str) -> int:
        """Bytes the primaries of ``name`` take on disk."""
        stats = self.client.indices.stats(index=name, metric="store")
        return int(stats["_all"]["primaries"]["store"]["size_in_bytes"])

    def wait_for_merges(self, name: str, wait_s: float = 600.0) -> bool:
        """Wait until no merge of ``name`` is running (the engine merges segments in the
        background after writes), at most ``wait_s``; whether it got there."""
        deadline = time.monotonic() + wait_s
        while True:
            stats = self.client.indices.stats(index=name, metric="merge")
            if int(stats["_all"]["total"]["merges"]["current"]) == 0:
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(1)

    def force_merge(self, name: str, wait_s: float = 120.0) -> dict[str, int]:
        """Merge an index that is done being written into one segment, dropping the deleted
        copies that updates left behind (they count in BM25 statistics and cost search time).
        The engine keeps deleted copies until its shard history retention lease catches up
        (synced every 30 s by default), so this merges again until none are left or
        ``wait_s`` has passed; returns what is left."""
        deadline = time.monotonic() + wait_s
        while True:
            self.vendor.forcemerge(self.client, name)
            self.refresh(name)
            state = self.segments(name)
            if state["deleted_docs"] == 0 or time.monotonic() > deadline:
                return state
            time.sleep(5)

    def get_mapping(self, name: str) -> dict:
        found = dict(self.client.indices.get_mapping(index=name))
        return (found.get(name) or next(iter(found.values())))["mappings"]

    def put_mapping(self, index: str, properties: dict) -> None:
        """Add fields to an index's mapping (the engine refuses to change existing ones)."""
        self.client.indices.put_mapping(index=index, body={"properties": properties})

    def concrete_indices(self, name: str) -> list[str]:
        """The indices an index name, alias or pattern stands for."""
        return list(dict(self.client.indices.get_settings(index=name)))

    def index_settings(self, index: str) -> dict:
        found = dict(self.client.indices.get_settings(index=index))
        return (found.get(index) or next(iter(found.values())))["settings"]

    # -- writes --------------------------------------------------------------------------

    def _bulk(self, actions: Iterable[dict], chunk_size: int) -> BulkResult:
        result = BulkResult()
        it = iter(actions)
        while chunk := list(islice(it, chunk_size)):
            self._bulk_chunk(chunk, result)
        return result

    def _bulk_chunk(self, chunk: list[dict], result: BulkResult) -> None:
        """One bulk request; per-item failures are recorded. Items the engine refuses one by
        one as busy (429: its write queue full; not a block, as past the flood stage, which
        waiting does not lift) are sent again alone, after each of BUSY_ITEM_WAITS. A request
        refused as a whole was already sent again by the transport (``_with_backoff``) for
        as long as the settings allow, so it is not sent again here; one refused for what it
        carries (4xx: an over-long id, too large a body) is split in halves until only the
        bad items fail, so that one bad document loses only itself."""
        for wait in (*BUSY_ITEM_WAITS, None):
            refused, whole = self._send_chunk(chunk, result)
            status = status_of(whole) if whole is not None else None
            if whole is not None and len(chunk) > 1 and status is not None and \
                    400 <= status < 500 and status != 429:
                half = len(chunk) // 2
                self._bulk_chunk(chunk[:half], result)
                self._bulk_chunk(chunk[half:], result)
                return
            busy = [a for a, f in refused if _busy(f)] if whole is None else []
            if not busy or wait is None:
                break
            self.resent.update(["429"])
            time.sleep(wait)
            result.failures.extend(f for _, f in refused if not _busy(f))
            chunk = busy
        result.failures.extend(f for _, f in refused)

    def _send_chunk(self, chunk: list[dict], result: BulkResult
                    ) -> tuple[list[tuple[dict, ItemFailure]], Any]:
        """Send one bulk request: the items taken are counted in ``result``; the refused
        ones are returned with their actions, and the error that refused the request as a
        whole, if one did."""
        whole: Any = None
        refused: list[tuple[dict, ItemFailure]] = []
        requests = [{k: v for k, v in action.items() if k != "_where"} for action in chunk]
        answers = self.vendor.helpers().streaming_bulk(
            self.client, requests, chunk_size=len(chunk), max_retries=0,
            raise_on_error=False, raise_on_exception=False)
        for action, (success, item) in zip(chunk, answers, strict=True):  # in request order
            if success:
                result.ok += 1
                continue
            _op, detail = next(iter(item.items()))
            if "exception" in detail:  # the request as a whole failed
                whole = detail["exception"]
            refused.append((action, ItemFailure(
                id=str(detail.get("_id")), status=int(detail.get("status", 0) or 0),
                reason=_failure_reason(detail.get("error")) if whole is None
                else reason_of(whole), where=action.get("_where"))))
        return refused, whole

    def bulk_index(
        self, index: str, docs: Iterable[dict], *, chunk_size: int = 500
    ) -> BulkResult:
        """Index (create or replace) documents by ``_id`` (None: the engine gives one).
        ``_where`` (not stored; else ``source_path``) names a document in messages. Rejected
        items are returned with id and reason, never dropped."""

        def actions() -> Iterator[dict]:
            for doc in docs:
                source = {k: v for k, v in doc.items() if k not in ("_id", "_where")}
                action = {"_op_type": "index", "_index": index, "_source": source,
                          "_where": doc.get("_where") or doc.get("source_path")}
                if doc.get("_id") is not None:
                    action["_id"] = doc["_id"]
                yield action

        return self._bulk(actions(), chunk_size)

    def bulk_update(
        self, index: str, updates: Iterable[tuple[str, dict]], *, chunk_size: int = 500
    ) -> BulkResult:
        """Partial updates ``(id, fields)``: the fields are merged into the stored document."""
        actions = (
            {"_op_type": "update", "_index": index, "_id": doc_id, "doc": fields}
            for doc_id, fields in updates
        )
        return self._bulk(actions, chunk_size)

    PROBE_ID = "sira-write-probe"

    def write_refused(self, index: str) -> str | None:
        """The engine's reason if it refuses writes to ``index`` now (a write block, a full
        disk), else None. It asks for a partial update of a document that does not exist: the
        engine checks its blocks first, so nothing is ever written."""
        result = self.bulk_update(index, [(self.PROBE_ID, {})])
        failure = result.failures[0] if result.failures else None
        if failure is None or failure.status == 404:  # document_missing_exception: writable
            return None
        return failure.reason

    # -- reads ---------------------------------------------------------------------------

    def search(self, index: str, body: dict, **params: Any) -> dict:
        return dict(self.client.search(index=index, body=body, **params))

    def msearch(self, index: str, bodies: list[dict]) -> list[dict]:
        """The responses of several searches in one request; a search the engine refused
        raises ``SearchRefused`` with its reason."""
        lines: list[dict] = []
        for body in bodies:
            lines.extend([{"index": index}, body])
        responses = list(dict(self.client.msearch(body=lines))["responses"])
        for position, response in enumerate(responses):
            if "error" in response:
                raise SearchRefused(int(response.get("status") or 0), response["error"],
                                    position)
        return responses

    def count(self, index: str, query: dict | None = None) -> int:
        body = {"query": query} if query else None
        return int(self.client.count(index=index, body=body)["count"])

    def aggregate(self, index: str, aggs: dict, query: dict | None = None) -> dict:
        body: dict[str, Any] = {"size": 0, "aggs": aggs, "track_total_hits": True}
        if query:
            body["query"] = query
        return dict(self.search(index, body)["aggregations"])

    def get(self, index: str, doc_id: str) -> dict | None:
        """The stored source of one document, or None."""
        found = dict(self.vendor.get(self.client, index, doc_id))
        return found.get("_source") if found.get("found") else None

    def scan(self, index: str, query: dict | None = None, source: list[str] | bool | None = None,
             batch: int = 1000) -> Iterator[dict]:
        """Every matching document (``_id`` and ``_source``), streamed with a scroll."""
        body: dict[str, Any] = {"query": query or {"match_all": {}}}
        if source is not None:
            body["_source"] = source
        yield from self.vendor.helpers().scan(self.client, index=index, query=body, size=batch,
                                        preserve_order=False)

    def mget(self, index: str, ids: list[str], source: list[str] | None = None
             ) -> dict[str, dict]:
        """Stored sources by id; missing ids are absent from the result."""
        if not ids:
            return {}
        params: dict[str, Any] = {"_source": source} if source is not None else {}
        docs = self.client.mget(index=index, body={"ids": ids}, **params)["docs"]
        return {d["_id"]: d.get("_source", {}) for d in docs if d.get("found")}

    def update_meta(self, index: str, change: Callable[[dict], dict]) -> None:
        """Replace the index's ``_meta`` with ``change`` of it, read and written under the
        lock among sira's processes (the engine replaces ``_meta`` whole): ``change`` sees
        every entry another process wrote before."""
        with self._meta_lock(index):
            self.client.indices.put_mapping(index=index,
                                            body={"_meta": change(self.get_meta(index))})

    def put_meta(self, index: str, meta: dict) -> None:
        """Merge ``meta`` into the index's ``_meta`` (collection-level facts such as the
        active filter), keeping every other entry."""
        self.update_meta(index, lambda current: {**current, **meta})

    def get_meta(self, index: str) -> dict:
        return dict(self.get_mapping(index).get("_meta", {}))

    def drop_meta(self, index: str, keys: Iterable[str]) -> None:
        """Remove ``keys`` from the index's ``_meta``, keeping the rest."""
        gone = set(keys)
        self.update_meta(index, lambda current: {
            k: v for k, v in current.items() if k not in gone})

    @contextmanager
    def _meta_lock(self, index: str) -> Iterator[None]:
        """Hold the lock on ``index``'s ``_meta`` among sira's processes. The engine replaces
        ``_meta`` whole and has no conditional mapping update, so each write reads it first;
        two at once (a job's heartbeat, a follower's round, ``apply``, ``profile apply``)
        would each drop what the other wrote. The lock is a document created in
        META_LOCK_INDEX (creating fails while it exists), deleted after the write; one older
        than ``meta_hold_s`` is a stopped process's and is taken over. A writer outside sira
        that replaces ``_meta`` at the same moment is not held back: the engine cannot."""
        self._ensure_lock_index()
        path = f"/{META_LOCK_INDEX}/_doc/{index}"
        mine = {"index": index, "host": socket.gethostname(), "pid": os.getpid(),
                "token": uuid.uuid4().hex}
        give_up = time.monotonic() + 2 * self.meta_hold_s  # locks kept fresh that long
        while True:
            try:  # dated when taken: a lock waited for long is not stale once held
                taken = self._request("PUT", f"{path}?op_type=create", {**mine, "at": time.time()})
                break
            except Exception as exc:
                if status_of(exc) != 409:
                    raise
            held = dict(self.vendor.get(self.client, META_LOCK_INDEX, index))
            if not held.get("found"):
                continue  # let go a moment ago
            holder = held["_source"]
            if time.time() - float(holder.get("at", 0)) > self.meta_hold_s:
                self._release(path, held)  # a stopped process's: take it over
                continue
            if time.monotonic() > give_up:
                raise MetaBusy(
                    f"the _meta of {index} is locked by {holder.get('host')} (pid "
                    f"{holder.get('pid')}) since {time.ctime(float(holder.get('at', 0)))}; "
                    f"delete document {index} of index {META_LOCK_INDEX} if that process "
                    "is gone")
            time.sleep(random.uniform(0.02, 0.2))
        try:
            yield
        finally:
            self._release(path, taken)

    def _release(self, path: str, held: Mapping[str, Any]) -> None:
        """Delete the lock document if it is still the one ``held`` (else another process
        took it over: it is theirs now)."""
        try:
            self._request("DELETE", f"{path}?if_seq_no={held['_seq_no']}"
                                    f"&if_primary_term={held['_primary_term']}")
        except Exception as exc:
            if status_of(exc) not in (404, 409):
                raise

    def _ensure_lock_index(self) -> None:
        if self._lock_index_ready:
            return
        if not self.index_exists(META_LOCK_INDEX):
            self.create(META_LOCK_INDEX, {
                "settings": {"index": {"number_of_shards": 1, "auto_expand_replicas": "0-1",
                                       "hidden": True}},
                "mappings": {"dynamic": False, "properties": {
                    "index": {"type": "keyword"}, "at": {"type": "double"}}}})
        self._lock_index_ready = True

    def analyze(self, index: str, texts: list[str], *, analyzer: str | None = None,
                field: str | None = None, max_chars: int = 40_000) -> list[list[str]]:
        """Tokens of each text, as the index's analyzer (or a field's) produces them, in as
        few requests as ``max_chars`` per request allows."""
        out: list[list[str]] = []
        group: list[str] = []
        size = 0
        for text in texts:
            if group and size + len(text) > max_chars:
                out.extend(self._analyze_group(index, group, analyzer, field))
                group, size = [], 0
            group.append(text)
            size += len(text) + 1
        if group:
            out.extend(self._analyze_group(index, group, analyzer, field))
        return out

    def term_statistics(self, index: str, document: dict, fields: list[str], shard: int
                        ) -> dict[str, list[tuple[str, int, int, int]]]:
        """How an artificial ``document`` is indexed in each of ``fields`` (``_termvectors``:
        parsed by the index's mapping, so copy_to targets and multi-fields are filled too),
        with each token's statistics on one shard: (term, start offset, end offset, documents
        holding the term), per token, per field given tokens. The count is the shard's term
        dictionary's: deleted copies not yet merged away included, so at least the documents
        that hold it (exactly them where the shard holds none: ``deleted_copies``)."""
        body = {"doc": document, "fields": fields, "term_statistics": True,
                "field_statistics": False, "positions": False, "offsets": True,
                "payloads": False}
        found = self.client.termvectors(index=index, body=body, preference=f"_shards:{shard}")
        return {field: [(text, token["start_offset"], token["end_offset"],
                         int(term.get("doc_freq", 0)))
                        for text, term in vector["terms"].items() for token in term["tokens"]]
                for field, vector in (found.get("term_vectors") or {}).items()}

    def deleted_copies(self, index: str) -> int | None:
        """Deleted documents not merged away yet, over every copy of every shard (what a term
        dictionary still counts), where ``index`` is one index of one shard; None otherwise
        (several term dictionaries)."""
        found = dict(self.client.indices.stats(index=index, metric="docs", level="shards"))
        indices = found.get("indices") or {}
        if len(indices) != 1:
            return None
        shards = next(iter(indices.values())).get("shards") or {}
        if len(shards) != 1:
            return None
        return sum(int(copy["docs"]["deleted"]) for copies in shards.values() for copy in copies)

    def _analyze_group(self, index: str, texts: list[str], analyzer: str | None,
                       field: str | None) -> list[list[str]]:
        """One request for several texts. The engine concatenates an array with an offset gap
        of 1, so the tokens are split back per text by their start offsets."""
        body: dict[str, Any] = {"text": texts}
        if analyzer:
            body["analyzer"] = analyzer
        if field:
            body["field"] = field
        tokens = self.client.indices.analyze(index=index, body=body)["tokens"]
        bounds, start = [], 0
        for text in texts:
            bounds.append(start + len(text))
            start += len(text) + 1
        out: list[list[str]] = [[] for _ in texts]
        which = 0
        for token in tokens:
            while which < len(bounds) - 1 and token["start_offset"] > bounds[which]:
                which += 1
            out[which].append(token["token"])
        return out

    # -- search templates ----------------------------------------------------------------

    def put_search_template(self, template_id: str, source: str | dict) -> None:
        if not isinstance(source, str):
            source = json.dumps(source)
        self.client.put_script(
            id=template_id, body={"script": {"lang": "mustache", "source": source}}
        )

    def get_search_template(self, template_id: str) -> str | None:
        """A stored template's source, or None."""
        try:
            found = dict(self.client.get_script(id=template_id))
        except Exception as exc:
            if status_of(exc) == 404:
                return None
            raise
        return (found.get("script") or {}).get("source") if found.get("found", True) else None

    def delete_search_template(self, template_id: str) -> None:
        self.client.delete_script(id=template_id)

    def render_search_template(self, template_id: str, params: dict) -> dict:
        rendered = self.client.render_search_template(body={"id": template_id, "params": params})
        return dict(rendered)["template_output"]

    def search_template(self, index: str, template_id: str, params: dict) -> dict:
        return dict(
            self.client.search_template(index=index, body={"id": template_id, "params": params})
        )


def describe_error(exc: BaseException, url: str | None = None) -> str | None:
    """One line for an error the engine or the way to it caused (unreachable, credentials
    refused, no such index, a query over the clause limit, any refused request), naming the
    engine by its URL (never with credentials); None if ``exc`` is not such an error."""
    import elasticsearch
    import opensearchpy

    where = f" at {redact_url(url)}" if url else ""
    if isinstance(exc, MetaBusy):
        return str(exc)
    if isinstance(exc, _unreachable_errors()):
        detail = str(getattr(exc, "info", None) or exc).splitlines()[0][:200]
        return f"cannot reach the engine{where}: {detail}"
    if isinstance(exc, SearchRefused):
        status, reason, body = exc.status, _failure_reason(exc.error), {"error": exc.error}
    elif isinstance(exc, opensearchpy.TransportError | elasticsearch.ApiError):
        status, reason, body = status_of(exc), reason_of(exc), _error_body(exc)
    else:
        return None
    if status == 401:
        return (f"the engine{where} refused the credentials (401): check "
                "SIRA_ENGINE__USERNAME / SIRA_ENGINE__PASSWORD or SIRA_ENGINE__API_KEY")
    if status == 403:
        return f"the engine{where} does not allow this (403): {reason}"
    if "index_not_found_exception" in reason:
        error = body.get("error") if isinstance(body, dict) else None
        name = error.get("index") if isinstance(error, dict) else None
        if name is None and isinstance(error, dict):  # a multi-search's error object
            name = next((c.get("index") for c in error.get("root_cause") or []), None)
        return f"no such index: {name or reason} (load one with `sira index`)"
    if "too_many_clauses" in reason or "maxClauseCount" in reason:
        return ("the query has more terms than the engine's clause limit "
                f"(indices.query.bool.max_clause_count): shorten it ({reason[:200]})")
    return f"the engine{where} refused the request ({status}): {reason[:500]}"


def _secret(value: SecretStr | str | None) -> str | None:
    return value.get_secret_value() if isinstance(value, SecretStr) else value


def status_of(exc: Exception) -> int | None:
    """The HTTP status of a refused request, whichever client raised it."""
    for attr in ("status_code", "status", "meta"):
        value = getattr(exc, attr, None)
        if isinstance(value, int):
            return value
        if attr == "meta" and value is not None and isinstance(getattr(value, "status", None), int):
            return value.status
    return None
