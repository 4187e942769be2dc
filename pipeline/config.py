"""One settings object for the whole pipeline.

Values come from, in rising priority: defaults here, environment variables ``SIRA_*``
(nested with ``__``, e.g. ``SIRA_ENGINE__URL``), then CLI flags, which call
``Settings.model_copy(update=...)``. Secrets are ``SecretStr`` so that printing or logging a
settings object never shows them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from pipeline.policies import PolicyKind

EngineKind = Literal["opensearch", "elasticsearch"]


def redact_url(url: str) -> str:
    """The URL with any user:password part shown as ``***``, for messages and logs."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = "***@" + (parts.hostname or "")
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


class RedactedRepr:
    """Settings print their URLs without credentials (``redis://:secret@host`` ->
    ``redis://***@host``): a settings object in a log line or a traceback shows no password."""

    def __repr_args__(self) -> Iterator[tuple[str | None, Any]]:
        for name, value in super().__repr_args__():  # type: ignore[misc]
            yield name, redact_url(value) if isinstance(value, str) and "@" in value else value


def default_state_dir() -> Path:
    return Path.home() / ".cache" / "sira-pipeline"


class EngineSettings(RedactedRepr, BaseModel):
    """How to reach a search engine. With no ``url``, the CLI uses the local engine that
    ``sira engine start`` recorded under the state directory."""

    kind: EngineKind = "opensearch"
    url: str | None = None
    username: str | None = None
    password: SecretStr | None = None
    api_key: SecretStr | None = None
    ca_file: Path | None = None
    verify_certs: bool = True
    request_timeout: float = 60.0
    # how long a request the engine answered busy (429) or a proxy could not pass (502-504),
    # or that timed out, is sent again, with growing waits; 0: sent once
    retry_s: float = 120.0


class IndexSettings(RedactedRepr, BaseModel):
    name: str = "sira"
    shards: int = 1
    replicas: int = 0
    # BM25 parameters of every scored field. Engine defaults; the bench overrides them
    # (e.g. Pyserini's BEIR settings k1=0.9, b=0.4).
    bm25_k1: float = 1.2
    bm25_b: float = 0.75
    # Longest proposed phrase, in words (the prompt asks for 1..max_ngram), and the longest
    # part of a sketch phrase that validation looks up (max_n); 1..3.
    max_ngram: int = Field(default=3, ge=1, le=3)
    # Index two-word phrases of the text and enriched fields as terms of their own
    # (index_phrases): sketch validation and apply's DF statistics then count one and two
    # words from the term dictionary, a cost that does not grow with the collection, at the
    # price of indexing time and space (README: Scale). New indices only; recorded in _meta.
    phrase_terms: bool = False


class LLMSettings(RedactedRepr, BaseModel):
    """The model server: vLLM's OpenAI-compatible API (or any server that speaks it)."""

    url: str | None = None  # e.g. http://vllm:8000/v1 ; None = no model configured
    model: str = "Qwen/Qwen3-30B-A3B-Instruct-2507"
    api_key: SecretStr | None = None
    # chat: /v1/chat/completions, one document per request, concurrent;
    # completions: /v1/completions with a list of raw prompts per request.
    mode: Literal["chat", "completions"] = "chat"
    concurrency: int = Field(default=32, ge=1)  # in-flight requests; vLLM batches them
    completions_batch: int = Field(default=16, ge=1)
    connect_timeout: float = 10.0
    read_timeout: float = 180.0
    search_timeout: float = 10.0  # the query-side sketch: one attempt, then search without it
    sketch_phrases: int = Field(default=10, ge=1, le=50)  # phrases the query-side sketch asks for
    max_attempts: int = Field(default=5, ge=1)  # per request, for 429/5xx/timeouts
    max_tokens: int = 512
    temperature: float = 0.0


Stance = Literal["new", "new+key"]
DfBasis = Literal["text", "proposals", "both"]


class EnrichSettings(RedactedRepr, BaseModel):
    # new: only vocabulary absent from the document (the reference prompt, "bridge" terms);
    # new+key: also the document's own most distinctive phrases ("echo" terms).
    stance: Stance = "new+key"
    max_terms: int = Field(default=10, ge=1, le=50)
    doc_chars: int = Field(default=4000, ge=200)  # the document is cut to this for the model
    batch_docs: int = Field(default=64, ge=1)  # documents per propose batch
    policy: PolicyKind = "rank"
    rank_k: int = Field(default=50, ge=0)
    ratio: float = Field(default=0.05, gt=0, le=1)
    absolute_cap: int = Field(default=50, ge=1)
    # what a term's document frequency counts: documents whose text contains the phrase,
    # documents the phrase was proposed for, or either.
    df_basis: DfBasis = "both"
    # the proposal cache (pipeline.cache): "" turns it off. Read from the environment even
    # when the section is built in code, so one variable turns it off everywhere.
    cache_index: str = Field(default_factory=lambda: os.environ.get(
        "SIRA_ENRICH__CACHE_INDEX", "sira-proposal-cache"))


class WorkerSettings(RedactedRepr, BaseModel):
    """The Celery layer. With no broker URL the local default is kombu's filesystem transport
    under the state directory (no server needed)."""

    broker_url: str | None = None  # e.g. redis://redis:6379/0
    queue: str = "sira"
    # an unacknowledged message is delivered again after this long: longer than any task
    visibility_timeout: int = 3600
    # propose batches (enrich.batch_docs each) per task: a worker overlaps storing one batch
    # with the next one's model requests, which only happens within a task
    task_batches: int = Field(default=4, ge=1)
    soft_time_limit: int = 1800  # seconds per task
    time_limit: int = 2100
    max_doc_attempts: int = 3  # a failed document is retried by later jobs until this many
    # the job re-enqueues documents still queued after this long without any progress
    requeue_after: float = 300.0
    max_requeues: int = Field(default=3, ge=0)  # then the job ends, naming what is left


class LoadSettings(RedactedRepr, BaseModel):
    # A document whose title + text is larger than this is skipped with an error.
    max_doc_bytes: int = 1_000_000
    bulk_batch_docs: int = 500


class Settings(RedactedRepr, BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SIRA_", env_nested_delimiter="__", extra="ignore"
    )

    engine: EngineSettings = EngineSettings()
    index: IndexSettings = IndexSettings()
    load: LoadSettings = LoadSettings()
    llm: LLMSettings = LLMSettings()
    enrich: EnrichSettings = EnrichSettings()
    worker: WorkerSettings = WorkerSettings()
    state_dir: Path = Field(default_factory=default_state_dir)

    def to_env(self) -> dict[str, str]:
        """These settings as SIRA_* variables, secrets included, for the worker processes
        this one starts (never for printing)."""
        env: dict[str, str] = {"SIRA_STATE_DIR": str(self.state_dir)}
        for section in ("engine", "index", "load", "llm", "enrich", "worker"):
            model = getattr(self, section)
            for name in type(model).model_fields:
                value = getattr(model, name)
                if value is None:
                    continue
                if isinstance(value, SecretStr):
                    value = value.get_secret_value()
                env[f"SIRA_{section.upper()}__{name.upper()}"] = str(value)
        return env
