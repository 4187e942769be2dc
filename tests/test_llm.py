"""The model client against the tests' OpenAI-compatible HTTP server: retries, timeouts,
malformed and truncated answers, both API modes."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from pydantic import SecretStr

from pipeline.bench.stand_in import StandInModel
from pipeline.config import LLMSettings
from pipeline.llm import BadAnswer, ModelClient, NotConfigured, parse_keywords
from pipeline.prompts import corpus_prompt, document_body

PROMPT = corpus_prompt("new+key", max_terms=10, max_n=3, doc_chars=4000)

CASES = {
    "plain": "text",
    "rate limited": "FAULT:429:2",
    "server error": "FAULT:500:1",
    "slow": "FAULT:slow:1",
    "garbage once": "FAULT:garbage:1",
    "garbage always": "FAULT:garbage",
    "truncated": "FAULT:truncated",
    "bad request": "FAULT:400",
}


@pytest.fixture
def server() -> Iterator[StandInModel]:
    answers = {"plain": ["heap size", "JVM"], "rate limited": ["ok after 429"],
               "server error": ["ok after 500"], "slow": ["ok after timeout"],
               "garbage once": ["ok after strict retry"]}
    with StandInModel(answers, slow_seconds=1.5) as fake:
        yield fake


def client(server: StandInModel, **overrides: object) -> ModelClient:
    options = dict(url=server.url, model="test-model", read_timeout=0.7, connect_timeout=1.0,
                   max_attempts=4, api_key=SecretStr("sk-test-secret")) | overrides
    settings = LLMSettings(**options)
    return ModelClient(settings, backoff=0.01, backoff_max=0.05)


def run_cases(model: ModelClient) -> dict:
    items = [(title, document_body(title, text)) for title, text in CASES.items()]
    return {a.key: a for a in model.keywords(PROMPT, items)}


@pytest.mark.parametrize("mode", ["chat", "completions"])
def test_retries_timeouts_and_bad_answers(server: StandInModel, mode: str) -> None:
    answers = run_cases(client(server, mode=mode, completions_batch=3))
    assert answers["plain"].keywords == ["heap size", "JVM"]
    assert answers["rate limited"].keywords == ["ok after 429"]
    assert answers["server error"].keywords == ["ok after 500"]
    assert answers["slow"].keywords == ["ok after timeout"]
    assert answers["garbage once"].keywords == ["ok after strict retry"]

    assert not answers["garbage always"].ok
    assert "not JSON" in answers["garbage always"].reason
    assert "stricter retry" in answers["garbage always"].reason
    assert "truncated" in answers["truncated"].reason
    assert "HTTP 400" in answers["bad request"].reason

    if mode == "chat":  # one request per document: the calls are exact
        assert server.calls["rate limited"] == 3  # two 429s, then the answer
        assert server.calls["server error"] == 2
        assert server.calls["slow"] == 2  # the first timed out on the client
        assert server.calls["garbage once"] == 2  # the stricter retry
        assert server.calls["garbage always"] == 2  # normal + strict, then it gives up
        assert server.calls["bad request"] == 1  # a 400 is not retried
        assert answers["rate limited"].calls == 3


def test_no_model_configured() -> None:
    with pytest.raises(NotConfigured, match="SIRA_LLM__URL"):
        ModelClient(LLMSettings(url=None))


def test_parse_keywords() -> None:
    assert parse_keywords('```json\n{"keywords": ["a", " b "]}\n```', "stop") == ["a", "b"]
    for bad in ['{"words": []}', "[]", '{"keywords": [1]}', ""]:
        with pytest.raises(BadAnswer):
            parse_keywords(bad, "stop")


def test_prompt_versions_and_cut() -> None:
    other = corpus_prompt("new", max_terms=10, max_n=3, doc_chars=4000)
    assert PROMPT.version != other.version
    assert PROMPT.version == corpus_prompt("new+key", 10, 3, 4000).version
    short = corpus_prompt("new+key", 10, 3, doc_chars=300)
    assert short.messages("x" * 1000)[1]["content"].endswith("\n\n" + "x" * 300)
    assert "NOT already appear" in other.instructions and "own most distinctive" in \
        PROMPT.instructions


def test_one_loop_and_client_for_the_life_of_the_object(server: StandInModel) -> None:
    def loops() -> int:
        return sum(1 for t in threading.enumerate() if t.name == "sira-model-client")

    model = client(server)
    before = loops()
    for _ in range(3):
        answer = model.keywords(PROMPT, [("plain", document_body("plain", "text"))])[0]
        assert answer.keywords == ["heap size", "JVM"]
    assert loops() == before + 1  # one loop thread, reused
    model.close()
    time.sleep(0.2)
    assert loops() == before


@pytest.mark.parametrize("fault", ["FAULT:500", "FAULT:slow"])
def test_completions_batch_failure_fails_only_the_bad_prompt(server: StandInModel,
                                                             fault: str) -> None:
    """One prompt that keeps failing (or is too slow) must not fail its 15 neighbours in the
    same /v1/completions request; every request is counted on some answer."""
    model = client(server, mode="completions", completions_batch=16, max_attempts=2)
    items = [(f"doc {i}", document_body(f"doc {i}", fault if i == 6 else f"text {i}"))
             for i in range(16)]
    answers = {a.key: a for a in model.keywords(PROMPT, items)}
    assert [k for k, a in answers.items() if not a.ok] == ["doc 6"]
    assert all(a.keywords for k, a in answers.items() if k != "doc 6")
    assert sum(a.calls for a in answers.values()) == server.requests
