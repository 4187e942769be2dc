#!/usr/bin/env bash
# The propose path's throughput on one NVIDIA GPU: vLLM (the version the manifests name)
# serving the default model's architecture with dummy weights (scripts/gpu_model.py), started
# with k8s/base/vllm.yaml's flags, driven by the project's client over a BEIR collection at
# the manifests' concurrency (scripts/gpu_throughput.py). Prints documents/s, tokens/s and the
# client's own CPU time; the figures go to $WORK/figures.json.
#
#   bash scripts/gpu_throughput.sh ../shared/data/scifact [DOCS]
#
#   VLLM=/path/to/bin/vllm   a vLLM already installed (else `vllm` on PATH, else it is
#                            installed into $WORK/venv, which needs PyPI)
#   QUANT=fp8                serve FP8 (--quantization fp8); the default model is BF16
#   WORK=/some/folder        where the model folder, the logs and the figures go
#   EXTRA="--mode completions --concurrency 64"   passed on to the driver
set -euo pipefail

collection="${1:?usage: gpu_throughput.sh BEIR_FOLDER [DOCS]}"
docs="${2:-2000}"
root="$(cd "$(dirname "$0")/.." && pwd)"
work="${WORK:-$(mktemp -d -t sira-gpu-XXXXXX)}"
mkdir -p "$work"
[ -f "$collection/corpus.jsonl" ] || { echo "$collection: no corpus.jsonl (a BEIR folder?)" >&2; exit 2; }
command -v nvidia-smi >/dev/null || { echo "no nvidia-smi: this script needs an NVIDIA GPU" >&2; exit 2; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

version="$(sed -n 's/^VLLM_CPU_VERSION=//p' "$root/scripts/vllm_cpu.sh")"  # the tested version
vllm="${VLLM:-$(command -v vllm || true)}"
if [ -z "$vllm" ]; then
  echo "installing vllm==$version into $work/venv..." >&2
  python3 -m venv "$work/venv"
  "$work/venv/bin/python" -m pip install -q "vllm==$version"
  vllm="$work/venv/bin/vllm"
fi
vpython="$(dirname "$vllm")/python"
[ -x "$vpython" ] || vpython=python3
if [ -x "$root/.venv/bin/python" ]; then python="$root/.venv/bin/python"; else python=python3; fi
model_name="$("$python" -c 'from pipeline.config import Settings; print(Settings().llm.model)')"

"$vpython" "$root/scripts/gpu_model.py" "$work/model" --collection "$collection" >/dev/null
port=8000
# the manifest's flags; --host and --port after them win
read -r -a flags <<<"$("$python" "$root/scripts/gpu_throughput.py" --serve-args)"
"$vllm" serve "$work/model" "${flags[@]}" --load-format dummy --served-model-name "$model_name" \
  --host 127.0.0.1 --port "$port" ${QUANT:+--quantization "$QUANT"} >"$work/vllm.log" 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true' EXIT
echo "vllm serve (pid $server) starting; log: $work/vllm.log" >&2
for _ in $(seq 1 1200); do
  curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null && break
  kill -0 "$server" 2>/dev/null || { tail -50 "$work/vllm.log" >&2; exit 1; }
  sleep 1
done
curl -sf "http://127.0.0.1:$port/v1/models" >/dev/null || { echo "vllm not up after 20 min" >&2; exit 1; }

# shellcheck disable=SC2086  # EXTRA is a list of flags
"$python" "$root/scripts/gpu_throughput.py" --url "http://127.0.0.1:$port/v1" \
  --model "$model_name" --collection "$collection" --docs "$docs" \
  --json "$work/figures.json" ${EXTRA:-}
echo "figures: $work/figures.json" >&2
