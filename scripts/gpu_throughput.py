"""The propose path's throughput against a running vLLM server: the project's model client
sends real documents (a BEIR collection given by path) with the project's prompt and schema,
at the concurrency the Kubernetes manifests give the workers, and this prints documents/s,
requests/s, prompt and generated tokens/s (the server's own counters, /metrics) and the
client's own CPU time beside them. ``scripts/gpu_throughput.sh`` starts the server (the
default model's architecture with dummy weights) and runs this; it also runs against any
OpenAI-compatible vLLM:

    .venv/bin/python scripts/gpu_throughput.py --url http://127.0.0.1:8000/v1 \\
        --model Qwen/Qwen3-30B-A3B-Instruct-2507 --collection ../shared/data/scifact

``--serve-args`` prints the ``vllm serve`` flags of k8s/base/vllm.yaml instead.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import Counter
from itertools import islice
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from vllm_server import manifest_args  # noqa: E402

from pipeline import enrich  # noqa: E402
from pipeline.config import LLMSettings, Settings  # noqa: E402
from pipeline.llm import ModelClient  # noqa: E402
from pipeline.loaders import LoadReport, iter_corpus  # noqa: E402
from pipeline.prompts import document_body  # noqa: E402

PUBLISHED = "about 30 requests/s, 1,024 prompt / 128 generated tokens, 35B-A3B FP8, one H200"


def manifest_concurrency() -> int:
    """Requests in flight to vLLM the manifests allow: worker replicas x Celery processes
    per worker x SIRA_LLM__CONCURRENCY per process."""
    config = next(d for d in yaml.safe_load_all((ROOT / "k8s/base/sira-config.yaml").read_text())
                  if d and d["metadata"]["name"] == "sira-config")["data"]
    worker = next(d for d in yaml.safe_load_all((ROOT / "k8s/base/worker.yaml").read_text())
                  if d and d.get("kind") == "Deployment")
    args = worker["spec"]["template"]["spec"]["containers"][0]["args"]
    processes = int(next(a.split("=", 1)[1] for a in args if a.startswith("--concurrency=")))
    return int(worker["spec"]["replicas"]) * processes * int(config["SIRA_LLM__CONCURRENCY"])


def serve_args() -> list[str]:
    """``vllm serve``'s flags as k8s/base/vllm.yaml passes them, less the command and model."""
    return manifest_args(ROOT / "k8s" / "base" / "vllm.yaml", "vllm")[3:]


def counters(url: str) -> dict[str, float]:
    """vLLM's request and token counters (summed over their labels)."""
    text = httpx.get(re.sub(r"/v1/?$", "", url) + "/metrics", timeout=10).text
    names = {"vllm:request_success_total": "requests", "vllm:prompt_tokens_total": "prompt",
             "vllm:generation_tokens_total": "generated"}
    out = dict.fromkeys(names.values(), 0.0)
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            out[names[name]] += float(line.rsplit(" ", 1)[1])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--serve-args", action="store_true",
                        help="print the manifest's vllm serve flags and exit")
    parser.add_argument("--url", help="the server's /v1 URL")
    parser.add_argument("--model", default=Settings().llm.model)
    parser.add_argument("--collection", type=Path, help="a BEIR folder (its corpus.jsonl)")
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=None,
                        help="requests in flight (default: what the manifests allow)")
    parser.add_argument("--mode", choices=["chat", "completions"], default="chat")
    parser.add_argument("--max-tokens", type=int, default=Settings().llm.max_tokens)
    # dummy weights decoded greedily loop on JSON whitespace until max_tokens: sampled
    # answers end like a model's do (a real model runs at the default, 0)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--warmup", type=int, default=64, help="requests sent before timing")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    if args.serve_args:
        print(" ".join(serve_args()))
        return
    if not args.url or not args.collection:
        parser.error("--url and --collection are needed")
    concurrency = args.concurrency or manifest_concurrency()
    report = LoadReport()
    docs = list(islice(iter_corpus(args.collection, report, 10**7), args.docs + args.warmup))
    if len(docs) <= args.warmup:
        sys.exit(f"{args.collection}: {len(docs)} documents, fewer than --warmup + 1")
    items = [(d.id, document_body(d.title, d.text)) for d in docs]
    warm, timed = items[:args.warmup], items[args.warmup:]
    client = ModelClient(LLMSettings(
        url=args.url, model=args.model, mode=args.mode, concurrency=concurrency,
        max_tokens=args.max_tokens, temperature=args.temperature, read_timeout=600))
    prompt = enrich.prompt_for(Settings())
    try:
        client.keywords(prompt, warm)  # compilation, CUDA graphs, first connections
        before, cpu0, started = counters(args.url), time.process_time(), time.monotonic()
        answers = client.keywords(prompt, timed)
        wall, cpu = time.monotonic() - started, time.process_time() - cpu0
        after = counters(args.url)
    finally:
        client.close()
    served = {k: after[k] - before[k] for k in after}
    failed = Counter(a.reason.split(" (")[0] for a in answers if not a.ok and a.reason)
    figures = {
        "documents": len(timed), "answered": sum(a.ok for a in answers),
        "failed": dict(failed), "client_requests": sum(a.calls for a in answers),
        "server_requests": served["requests"], "concurrency": concurrency,
        "mode": args.mode, "max_tokens": args.max_tokens, "temperature": args.temperature,
        "wall_s": round(wall, 2), "docs_per_s": round(len(timed) / wall, 2),
        "requests_per_s": round(served["requests"] / wall, 2),
        "prompt_tokens_per_s": round(served["prompt"] / wall, 1),
        "generated_tokens_per_s": round(served["generated"] / wall, 1),
        "prompt_tokens_per_request": round(served["prompt"] / max(served["requests"], 1), 1),
        "generated_tokens_per_request": round(served["generated"] / max(served["requests"], 1),
                                              1),
        "client_cpu_s": round(cpu, 2), "client_cpu_ms_per_doc": round(1000 * cpu / len(timed), 2),
        "client_cpu_share_of_wall": round(cpu / wall, 3),
    }
    print(f"{len(timed)} documents of {args.collection} ({args.warmup} more sent first to warm "
          f"up), {concurrency} in flight, {args.mode} mode, model {args.model} at {args.url}")
    # vLLM counts each prompt of a completions list as a request: prompts, in either mode
    print(f"  {figures['docs_per_s']} documents/s, {figures['requests_per_s']} prompts/s "
          f"({figures['server_requests']:.0f} served; {figures['client_requests']} HTTP "
          f"requests from the client); {figures['answered']} answered, failed: "
          f"{dict(failed) or 'none'}")
    print(f"  prompt {figures['prompt_tokens_per_s']} tokens/s "
          f"({figures['prompt_tokens_per_request']} per request), generated "
          f"{figures['generated_tokens_per_s']} tokens/s "
          f"({figures['generated_tokens_per_request']} per request)")
    print(f"  the client's own CPU: {figures['client_cpu_s']} s, "
          f"{figures['client_cpu_ms_per_doc']} ms per document, "
          f"{100 * figures['client_cpu_share_of_wall']:.1f} % of the wall time")
    print(f"  published figure to compare with: {PUBLISHED}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
