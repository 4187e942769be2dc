"""A small OpenAI-compatible stand-in for the model server, for the tests and the job's
benchmarks (``sira bench-scale``, ``scripts/bench_job.py``): the real client talks to it over
HTTP. It is never presented as model output. Answers are deterministic and keyed by the
prompt's content; faults are asked for by the document itself, so each test states its
scenario in its data:

- the keywords given for the document's title in ``answers``; otherwise the title's words
  plus one made-up bridge term;
- ``FAULT:429:N`` / ``FAULT:500:N`` / ``FAULT:400``: that status for the first N calls for
  this document (for every call without N);
- ``FAULT:slow:N``: the first N calls answer after ``slow_seconds`` (past the client timeout);
- ``FAULT:garbage`` (always) / ``FAULT:garbage:N`` (first N): an answer that is not JSON;
- ``FAULT:truncated``: cut-off JSON with ``finish_reason: length``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

FAULT = re.compile(r"FAULT:(400|429|500|slow|garbage|truncated)(?::(\d+))?")
TITLE = re.compile(r"Title: (.*)")


class _Server(ThreadingHTTPServer):
    request_queue_size = 512  # many workers with many requests in flight each
    daemon_threads = True


class StandInModel:
    """The server, started and stopped as a context manager (``url`` while it runs)."""

    def __init__(self, answers: dict[str, list[str]] | None = None,
                 slow_seconds: float = 2.0, delay: float = 0.0, slots: int = 0) -> None:
        self.answers = answers or {}
        self.slow_seconds = slow_seconds
        self.delay = delay  # seconds before every answer, like a model generating
        # like a GPU server: at most ``slots`` answers generated at once (0: no limit); the
        # others wait their turn, so throughput is slots / delay at most
        self.slots = threading.BoundedSemaphore(slots) if slots else None
        self.calls: Counter[str] = Counter()  # per document key (its title, else its text)
        self.requests = 0
        self.in_flight = self.peak = 0  # answers being generated now, and the most at once
        self.spans: list[tuple[str, float, float]] = []  # (key, start, end) of each answer
        self.lock = threading.Lock()
        self.server = _Server(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/v1"

    def __enter__(self) -> StandInModel:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    # -- answers ---------------------------------------------------------------------------

    @staticmethod
    def key_of(prompt: str) -> str:
        title = TITLE.search(prompt)
        return title.group(1).strip() if title else prompt[-200:]

    def answer(self, prompt: str) -> tuple[int, str, str]:
        """(HTTP status, content, finish_reason) for one prompt."""
        key = self.key_of(prompt)
        with self.lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        started = time.monotonic()
        try:
            return self._answer(key, prompt)
        finally:
            with self.lock:
                self.in_flight -= 1
                self.spans.append((key, started, time.monotonic()))

    def _answer(self, key: str, prompt: str) -> tuple[int, str, str]:
        if self.delay:
            with self.slots or contextlib.nullcontext():
                time.sleep(self.delay)
        with self.lock:
            self.calls[key] += 1
            call = self.calls[key]
        fault = FAULT.search(prompt)
        if fault:
            kind, times = fault.group(1), fault.group(2)
            active = times is None or call <= int(times)
            if active and kind in ("400", "429", "500"):
                return int(kind), "", ""
            if active and kind == "slow":
                time.sleep(self.slow_seconds)
            if active and kind == "garbage":
                return 200, "Sure! Here are some keywords: alpha, beta", "stop"
            if active and kind == "truncated":
                return 200, '{"keywords": ["alpha", "be', "length"
        if key in self.answers or "" in self.answers:  # "" = the answer for any input
            words = self.answers.get(key, self.answers.get(""))
        else:
            words = key.split()[:3] + [f"zz{hashlib.sha1(key.encode()).hexdigest()[:6]}"]
        return 200, json.dumps({"keywords": words}), "stop"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                length = int(self.headers.get("Content-Length", 0))
                payload = json.loads(self.rfile.read(length))
                with fake.lock:
                    fake.requests += 1
                if self.path.endswith("/chat/completions"):
                    prompt = "\n".join(m["content"] for m in payload["messages"])
                    status, content, finish = fake.answer(prompt)
                    body = {"model": payload["model"], "choices": [{
                        "index": 0, "finish_reason": finish,
                        "message": {"role": "assistant", "content": content}}]}
                elif self.path.endswith("/completions"):
                    prompts = payload["prompt"]
                    prompts = prompts if isinstance(prompts, list) else [prompts]
                    answers = [fake.answer(p) for p in prompts]
                    status = max(a[0] for a in answers)
                    body = {"model": payload["model"], "choices": [
                        {"index": i, "text": content, "finish_reason": finish}
                        for i, (_, content, finish) in enumerate(answers)]}
                else:
                    status, body = 404, {"error": "unknown path"}
                data = json.dumps(body if status == 200 else {"error": "injected"}).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

            def log_message(self, *args: object) -> None:
                pass

        return Handler
