"""A model folder with the default model's architecture (Qwen/Qwen3-30B-A3B-Instruct-2507,
the values of its published config.json written out here) for ``vllm serve --load-format
dummy``: the GPU does the work of the real model (48 layers, 128 experts, 8 active) on random
weights, so throughput is the real model's and the text is noise. The tokenizer is a
byte-level BPE trained here on the collection's own text (the real one cannot be downloaded
on a machine without network), so prompt token counts are close to, not equal to, Qwen's.

Run with the vLLM venv's Python (it has ``tokenizers``):
``python scripts/gpu_model.py DIR --collection ../shared/data/scifact``.
"""

from __future__ import annotations

import argparse
import json
import sys
from itertools import islice
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from tiny_model import TRAINING, build  # noqa: E402

QWEN3_30B_A3B_2507 = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
    "moe_intermediate_size": 768, "num_hidden_layers": 48, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "num_experts": 128, "num_experts_per_tok": 8,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
    "max_position_embeddings": 262144, "rope_theta": 10000000, "rope_scaling": None,
    "rms_norm_eps": 1e-6, "hidden_act": "silu", "attention_bias": False,
    "attention_dropout": 0.0, "sliding_window": None, "use_sliding_window": False,
    "max_window_layers": 48, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "router_aux_loss_coef": 0.001, "output_router_logits": False, "use_cache": True,
    "bos_token_id": 151643, "eos_token_id": 151645,
}
TOKENIZER_VOCAB = 32000  # learned from the collection; the embedding keeps Qwen's 151,936 rows


def collection_text(folder: Path, limit: int = 20000) -> list[str]:
    with open(folder / "corpus.jsonl", encoding="utf-8") as fh:
        rows = [json.loads(line) for line in islice(fh, limit)]
    return [f"{r.get('title') or ''}\n{r.get('text') or ''}" for r in rows]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--collection", type=Path, required=True, help="a BEIR folder")
    args = parser.parse_args()
    print(build(args.folder, QWEN3_30B_A3B_2507, TRAINING + collection_text(args.collection),
                TOKENIZER_VOCAB))


if __name__ == "__main__":
    main()
