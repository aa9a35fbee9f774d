"""A tiny random Qwen2 checkpoint directory with the real Qwen2 tokenizer, a prompt set and a
reward whose correctness is mixed within groups (a random model never solves math)."""

from __future__ import annotations

import json
import os


def make_tiny_qwen2_dir(out: str, layers: int = 2, seed: int = 0) -> str:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from tests.tiny import tiny_qwen2_config

    if os.path.exists(os.path.join(out, "model.safetensors")):
        return out
    from tests.data import qwen2_tokenizer_dir

    tok = AutoTokenizer.from_pretrained(qwen2_tokenizer_dir())
    cfg = tiny_qwen2_config(
        vocab_size=151680,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        eos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
        bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
    )
    torch.manual_seed(seed)
    conf = AutoConfig.for_model(**{k: v for k, v in cfg.items() if k != "architectures"})
    conf.architectures = ["Qwen2ForCausalLM"]
    model = AutoModelForCausalLM.from_config(conf, dtype=torch.float32)
    os.makedirs(out, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


def make_prompts(path: str, n: int = 64) -> str:
    with open(path, "w") as f:
        for i in range(n):
            a, b = 10 + (i * 7) % 80, 11 + (i * 13) % 77
            f.write(
                json.dumps(
                    {
                        "data_source": "tiny",
                        "prompt": [{"role": "user", "content": f"What is {a} + {b}?"}],
                        "reward_model": {"ground_truth": str(a + b), "style": "rule"},
                    }
                )
                + "\n"
            )
    return path


def parity_reward(response: str, ground_truth: str, **extra):
    """'Correct' when the response has an even number of characters: mixed within groups."""
    from megatron_dapo.reward import RewardResult

    ok = len(response) % 2 == 0
    return RewardResult(score=1.0 if ok else -1.0, acc=ok, pred=str(len(response)), reason="ok" if ok else "wrong")
