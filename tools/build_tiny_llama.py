"""Build the tiny random-weight Llama (and its tokenizer) that the real-vLLM conformance stage serves.

Usage (with the vLLM venv's python, which has torch, transformers and tokenizers):

    /var/cache/llmfleet/vllm-venv/bin/python tools/build_tiny_llama.py OUT_DIR

Offline and deterministic (`docs/vllm-facts.md`, "The real server on CPU"): a byte-level BPE with
2,048 tokens trained on text every Debian/Python machine has (the common licences, then the
standard library's sources, sorted, up to about 8 MB), a 2-layer Llama with head_dim 32 (a size
the CPU attention backend supports) and seed 0. When OUT_DIR already holds a complete build
it is left alone.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<|user|>", "<|assistant|>", "<|system|>"]
VOCAB_SIZE = 2048
TRAIN_BYTES = 8 * 1024 * 1024
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{% if message['content'] is string %}"
    "{% set content = message['content'] %}{% else %}"
    "{% set content = message['content'] | map(attribute='text') | join('') %}{% endif %}"
    "<|{{ message['role'] }}|>\n{{ content }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
EXPECTED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def training_files() -> list[Path]:
    files = sorted(p for p in Path("/usr/share/common-licenses").glob("*") if p.is_file())
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files += sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts)
    out, total = [], 0
    for path in files:
        try:
            size = path.stat().st_size
        except OSError:
            continue
        out.append(path)
        total += size
        if total >= TRAIN_BYTES:
            break
    return out


def text_iterator(files: list[Path]):  # type: ignore[no-untyped-def]
    for path in files:
        try:
            yield path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue


def build(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
    )
    tok.train_from_iterator(text_iterator(training_files()), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=2048,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE

    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        intermediate_size=256,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=3,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=3)
    model.save_pretrained(out, safe_serialization=True)
    fast.save_pretrained(out)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: build_tiny_llama.py OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    if all((out / name).exists() for name in EXPECTED_FILES):
        print(f"tiny llama already built in {out}")
        return 0
    build(out)
    print(f"tiny llama built in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
