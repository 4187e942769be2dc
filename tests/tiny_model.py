"""A model folder vLLM can serve with no weights downloaded: a tiny Qwen2 architecture
(``config.json``), a byte-level BPE tokenizer trained here, a chat template. Served with
``--load-format dummy`` its weights are random, so what it writes is noise: it proves the
protocol (requests, JSON-schema decoding, batching), never quality.

Run with the vLLM venv's Python (it has ``tokenizers``): ``python tests/tiny_model.py DIR``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

VOCAB = 512
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CONFIG = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": VOCAB,
    "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "hidden_act": "silu", "tie_word_embeddings": True, "torch_dtype": "bfloat16",
    "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 0,
}
# what the tokenizer learns from: JSON punctuation and English words, so that prompts and
# the JSON answers tokenise into a few tokens each
TRAINING = [
    '{"keywords": ["shard allocation", "replica", "heap size", "snapshot"]}',
    "Title: Heap sizing\nText: Give the JVM half the memory of the machine.",
    "You are an expert search engineer. Propose search terms for this document.",
    "the of and to in is for on with as by an be this that from at or are it",
] * 50


def build(folder: Path, config: dict = CONFIG, training: list[str] = TRAINING,
          vocab: int = VOCAB) -> Path:
    """Write the model folder: ``config`` (its ``vocab_size`` the embedding rows, at least
    the tokenizer's ``vocab``), a tokenizer trained on ``training``, the chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(training, trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    assert tokenizer.get_vocab_size() <= config["vocab_size"], tokenizer.get_vocab_size()
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "chat_template": CHAT_TEMPLATE,
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "model_max_length": config["max_position_embeddings"]}))
    eos = tokenizer.token_to_id("<|im_end|>")
    (folder / "config.json").write_text(json.dumps({**config, "eos_token_id": eos}))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return folder


if __name__ == "__main__":
    print(build(Path(sys.argv[1])))
