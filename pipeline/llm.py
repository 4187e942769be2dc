"""The only module that talks to a model: vLLM's OpenAI-compatible API.

- ``chat`` mode: one ``/v1/chat/completions`` request per input, many in flight at once (up to
  ``concurrency``) so that vLLM's continuous batching fills the GPU.
- ``completions`` mode: ``/v1/completions`` with a list of raw prompts per request.

Answers are asked for as JSON with a schema (``response_format``). Transient failures (429,
5xx, timeouts, connection errors) are retried with exponential backoff and jitter; other 4xx are
not. An answer that is not the requested JSON gets one stricter retry; after that the input is
reported as failed with the reason. The API key is sent as a header and never logged.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from dataclasses import dataclass

import httpx
from tenacity import (
    AsyncRetrying,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)

from pipeline.config import LLMSettings
from pipeline.prompts import STRICT_REMINDER, Prompt

FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")


class NotConfigured(RuntimeError):
    """No model server URL is configured."""


class BadAnswer(ValueError):
    """The model answered, but not with the requested JSON."""


@dataclass
class Answer:
    key: str
    keywords: list[str] | None  # None when failed
    reason: str | None = None
    calls: int = 0  # HTTP requests made for this input, retries included

    @property
    def ok(self) -> bool:
        return self.keywords is not None


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, httpx.HTTPStatusError):
        status = exc.response.status_code
        return status == 429 or status >= 500
    return isinstance(exc, httpx.TimeoutException | httpx.TransportError)


def describe(exc: BaseException) -> str:
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code} from model server: {exc.response.text[:200]}"
    if isinstance(exc, httpx.TimeoutException):
        return f"model server timed out ({type(exc).__name__})"
    return f"{type(exc).__name__}: {exc}"


def parse_keywords(content: str | None, finish_reason: str | None) -> list[str]:
    """The ``keywords`` list of an answer, or BadAnswer saying why not."""
    if finish_reason == "length":
        raise BadAnswer("truncated answer (finish_reason=length)")
    if not content or not content.strip():
        raise BadAnswer("empty answer")
    text = FENCE.sub("", content.strip())
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadAnswer(f"answer is not JSON ({exc.msg}): {content[:120]!r}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("keywords"), list):
        raise BadAnswer(f'answer lacks a "keywords" list: {content[:120]!r}')
    if not all(isinstance(w, str) for w in data["keywords"]):
        raise BadAnswer(f'"keywords" must hold strings: {content[:120]!r}')
    # an empty string proposes nothing (vLLM's schema-guided decoding allows it): skipped,
    # not a reason to lose the document's other terms
    return [w.strip() for w in data["keywords"] if w.strip()]


def _common(settings: LLMSettings, prompt: Prompt) -> dict:
    return {"model": settings.model,
            "response_format": {"type": "json_schema", "json_schema": {
                "name": "keywords", "schema": prompt.schema, "strict": True}},
            "max_tokens": settings.max_tokens, "temperature": settings.temperature}


def chat_request(settings: LLMSettings, prompt: Prompt, body: str, strict: bool = False
                 ) -> dict:
    """The body of one ``/v1/chat/completions`` request: what the online client sends and
    what ``export-batch`` writes for ``vllm run-batch``, built in this one place."""
    messages = prompt.messages(body)
    if strict:
        messages.append({"role": "user", "content": STRICT_REMINDER})
    return {**_common(settings, prompt), "messages": messages}


class ModelClient:
    def __init__(self, settings: LLMSettings, *, backoff: float = 0.5, backoff_max: float = 20.0):
        if not settings.url:
            raise NotConfigured(
                "no model server configured: set SIRA_LLM__URL (an OpenAI-compatible /v1 URL)"
            )
        self.settings = settings
        self.base_url = settings.url.rstrip("/")
        self.backoff, self.backoff_max = backoff, backoff_max
        # One event loop thread and one HTTP client for the life of this object: a new
        # client per batch costs ~50 ms (TLS context) and new connections to the server.
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: httpx.AsyncClient | None = None
        # one gate for every call in flight: overlapping batches (pipeline.enrich.propose)
        # share ``concurrency`` requests instead of each getting its own
        self._gate: asyncio.Semaphore | None = None
        self._lock = threading.Lock()

    @property
    def model(self) -> str:
        return self.settings.model

    def _http(self) -> httpx.AsyncClient:
        headers = {}
        if self.settings.api_key:
            headers["Authorization"] = f"Bearer {self.settings.api_key.get_secret_value()}"
        timeout = httpx.Timeout(self.settings.read_timeout, connect=self.settings.connect_timeout)
        limits = httpx.Limits(max_connections=self.settings.concurrency)
        return httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=timeout,
                                 limits=limits)

    async def _post(self, http: httpx.AsyncClient, path: str, payload: dict,
                    counter: list[int]) -> dict:
        async for attempt in AsyncRetrying(
            stop=stop_after_attempt(self.settings.max_attempts),
            wait=wait_random_exponential(multiplier=self.backoff, max=self.backoff_max),
            retry=retry_if_exception(is_transient),
            reraise=True,
        ):
            with attempt:
                counter[0] += 1
                response = await http.post(path, json=payload)
                response.raise_for_status()
                return response.json()
        raise AssertionError("unreachable")  # AsyncRetrying either returns or reraises

    def _payload(self, prompt: Prompt, bodies: list[str], strict: bool) -> tuple[str, dict]:
        """Path and payload for one chat request, or one completions request for a list."""
        if self.settings.mode == "chat":
            return "/chat/completions", chat_request(self.settings, prompt, bodies[0], strict)
        raws = [prompt.raw(b) + (f"\n{STRICT_REMINDER}\n" if strict else "") for b in bodies]
        return "/completions", {**_common(self.settings, prompt), "prompt": raws}

    def _choices(self, data: dict, count: int) -> list[tuple[str | None, str | None]]:
        """(content, finish_reason) per input, in input order."""
        by_index = {c.get("index", i): c for i, c in enumerate(data.get("choices") or [])}
        out = []
        for i in range(count):
            choice = by_index.get(i) or {}
            content = (choice.get("message") or {}).get("content") \
                if self.settings.mode == "chat" else choice.get("text")
            out.append((content, choice.get("finish_reason")))
        return out

    async def _one(self, http: httpx.AsyncClient, gate: asyncio.Semaphore, prompt: Prompt,
                   key: str, body: str, *, strict_only: bool = False) -> Answer:
        """One input on its own: the normal request, then (if the answer is not the requested
        JSON) one stricter retry."""
        calls = [0]
        reason = ""
        for strict in (True,) if strict_only else (False, True):
            path, payload = self._payload(prompt, [body], strict)
            async with gate:
                try:
                    data = await self._post(http, path, payload, calls)
                except Exception as exc:  # transient errors were already retried
                    return Answer(key, None, describe(exc), calls[0])
            try:
                return Answer(key, parse_keywords(*self._choices(data, 1)[0]), None, calls[0])
            except BadAnswer as exc:
                reason = str(exc)
        return Answer(key, None, f"{reason} (after a stricter retry)", calls[0])

    async def _batch(self, http: httpx.AsyncClient, gate: asyncio.Semaphore, prompt: Prompt,
                     items: list[tuple[str, str]]) -> list[Answer]:
        """Completions mode: one request for many prompts. Inputs whose answer is not JSON get
        the stricter retry alone; a request that fails (refused, or still failing or too slow
        after its retries) is split into one request per input, so that one bad or slow
        prompt cannot fail its neighbours."""
        calls = [0]
        path, payload = self._payload(prompt, [body for _, body in items], strict=False)
        failure: Exception | None = None
        async with gate:
            try:
                data = await self._post(http, path, payload, calls)
            except Exception as exc:
                failure = exc
        if failure is not None:
            if len(items) == 1:
                return [Answer(items[0][0], None, describe(failure), calls[0])]
            answers = list(await asyncio.gather(
                *[self._one(http, gate, prompt, key, body) for key, body in items]))
        else:
            answers = []
            for (key, body), choice in zip(items, self._choices(data, len(items)), strict=True):
                try:
                    answers.append(Answer(key, parse_keywords(*choice)))
                except BadAnswer:
                    answers.append(await self._one(http, gate, prompt, key, body,
                                                   strict_only=True))
        answers[0].calls += calls[0]  # the shared request(s) are counted once, on the first
        return answers

    def first_requests(self, count: int) -> list[int]:
        """How many requests ``keywords`` sends first for each of ``count`` inputs (before
        any retry), counted as the answers count them: one each in chat mode; in completions
        mode one per group of ``completions_batch``, on the group's first input."""
        if self.settings.mode == "chat":
            return [1] * count
        return [1 if i % self.settings.completions_batch == 0 else 0 for i in range(count)]

    async def _run(self, prompt: Prompt, items: list[tuple[str, str]]) -> list[Answer]:
        if self._client is None:  # made on the loop thread, the one that uses them
            self._client = self._http()
            self._gate = asyncio.Semaphore(self.settings.concurrency)
        http, gate = self._client, self._gate
        assert gate is not None
        if self.settings.mode == "chat":
            jobs = [self._one(http, gate, prompt, key, body) for key, body in items]
            return list(await asyncio.gather(*jobs))
        size = self.settings.completions_batch
        batches = [items[i:i + size] for i in range(0, len(items), size)]
        results = await asyncio.gather(*[self._batch(http, gate, prompt, b) for b in batches])
        return [answer for batch in results for answer in batch]

    def keywords(self, prompt: Prompt, items: list[tuple[str, str]]) -> list[Answer]:
        """Keywords for each ``(key, body)``, in order; failures carry their reason."""
        if not items:
            return []
        return asyncio.run_coroutine_threadsafe(self._run(prompt, items), self._loop_thread()
                                                ).result()

    def _loop_thread(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                threading.Thread(target=self._loop.run_forever, name="sira-model-client",
                                 daemon=True).start()
            return self._loop

    def close(self) -> None:
        if self._loop is None:
            return
        if self._client is not None:
            asyncio.run_coroutine_threadsafe(self._client.aclose(), self._loop).result()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop, self._client, self._gate = None, None, None
