"""Tiny random-weight causal LMs with a byte-level tokenizer and a ChatML chat template.

Tests of mechanics (serving, LoRA, training) use these instead of downloaded models:

    path = make_tiny_model("/tmp/tiny")     # a normal HF folder: config, weights, tokenizer
    AutoModelForCausalLM.from_pretrained(path)
"""

from __future__ import annotations

import json
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# An assistant turn's tool calls, Hermes-style (shared with tiny_vlm's template).
TOOL_CALLS = (
    "{% for call in message.tool_calls or [] %}"
    '<tool_call>{"name": "{{ call.function.name }}", "arguments": '
    "{{ call.function.arguments if call.function.arguments is string "
    "else call.function.arguments | tojson }}}</tool_call>"
    "{% endfor %}"
)

# ChatML with Hermes-style tools, the shape SmolLM2/Qwen templates use.
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n<tools>\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}</tools>\n"
    'Call a tool as <tool_call>{"name": ..., "arguments": {...}}</tool_call>'
    "<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'system' and tools %}"
    "{% elif message.role == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ message.role }}\n"
    "{% if message.content %}{{ message.content }}{% endif %}"
    + TOOL_CALLS
    + "<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_tokenizer():
    """A byte-level BPE tokenizer with no merges: every byte is one token, plus ChatML tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in sorted(alphabet):
        vocab[ch] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def make_tiny_model(
    path: str | Path,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    max_position_embeddings: int = 1024,
    seed: int = 0,
) -> Path:
    """Write a tiny Llama with random weights and the byte tokenizer to `path` (reused if there)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(path)
    spec = {
        "hidden": hidden_size,
        "layers": num_layers,
        "ctx": max_position_embeddings,
        "seed": seed,
    }
    marker = path / "tiny_model.json"
    if marker.exists() and json.loads(marker.read_text()) == spec:
        return path
    tokenizer = make_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    marker.write_text(json.dumps(spec))
    return path
