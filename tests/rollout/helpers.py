"""Tiny random models for the rollout tests (built in code; nothing is downloaded)."""

from __future__ import annotations

import torch

VOCAB = 97
EOS = 5


def qwen2_config(tied=True, **kw):
    from transformers import Qwen2Config

    args = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        # a large init spreads the next-token distribution, so samples and greedy paths vary
        initializer_range=0.5,
        tie_word_embeddings=tied,
        eos_token_id=EOS,
        pad_token_id=0,
    )
    args.update(kw)
    return Qwen2Config(**args)


def llama_config(**kw):
    from transformers import LlamaConfig

    args = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        initializer_range=0.5,
        tie_word_embeddings=False,
        eos_token_id=EOS,
        pad_token_id=0,
    )
    args.update(kw)
    return LlamaConfig(**args)


def random_model(config, seed=0):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()


class CharTokenizer:
    """Decode-only stand-in for a tokenizer: token id -> a fixed string piece."""

    def __init__(self, vocab=VOCAB):
        letters = "abcdefghijklmnopqrstuvwxyz"
        self.pieces = [letters[i % 26] * (1 + (i // 26) % 2) for i in range(vocab)]  # 1 or 2 chars

    def decode(self, ids, **_):
        return "".join(self.pieces[i] for i in ids)


PROMPTS = [[1, 2, 3, 4, 9, 10], [7, 8], [11, 12, 13, 40, 41, 42, 43, 44, 45]]
