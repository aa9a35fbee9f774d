"""DAPO with LoRA through the driver (``megatron_dapo.train.main``, issue 41): a 2-step run of the
tiny Qwen2 with ``--lora-rank 4 --lora-sync adapter`` (the base sent once, then the adapters alone;
probed after every sync; the merged sync: tests/training/test_lora.py), its
adapter-only checkpoints, the merged HF export and the PEFT export at the end (loaded by peft:
the same logits as the merged model), and a resume from its checkpoint."""

from __future__ import annotations

import json
import os

import pytest
from safetensors.torch import load_file

from megatron_dapo.checkpoint.dist_ckpt import checkpoint_tensor_shapes
from megatron_dapo.checkpoint.mapping import is_lora_param
from megatron_dapo.models.hf_config import lora_parameters, parse_hf_config
from tests.e2e.fixtures import make_prompts, make_tiny_qwen2_dir
from tests.e2e.test_train_e2e import base_args, read_metrics

pytestmark = [pytest.mark.slow]

LORA = {"--lora-rank": "4", "--lora-alpha": "8", "--lora-target-modules": "q_proj,v_proj,down_proj"}


def test_a_lora_run_trains_adapters_only_saves_them_and_resumes(tmp_path, capsys):
    from megatron_dapo.train import main

    hf = make_tiny_qwen2_dir(str(tmp_path / "hf"))
    prompts = make_prompts(str(tmp_path / "prompts.jsonl"))
    run, save = str(tmp_path / "run"), str(tmp_path / "ckpt")
    args = {**LORA, "--lora-sync": "adapter", "--no-progress": None, "--save": save, "--save-interval": "1"}
    args["--save-hf-final"] = None
    assert main(base_args(hf, prompts, run, **{"--num-rollout": "2", **args})) == 0
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    adapter_bytes = lora_parameters(parse_hf_config(hf), 4, ("q_proj", "v_proj", "down_proj")) * 4  # float32
    for r in rows:
        # after training, the adapters alone went to the engine (load_lora_adapter_from_tensors), and
        # it computes base + (alpha/r) B A: its logprobs of the probe equal megatron's with its adapters
        assert r["sync_bytes"] == adapter_bytes, (r["sync_bytes"], adapter_bytes)
        assert r["weight_sync_probe_diff"] < 1e-4, r
    with open(os.path.join(run, "hybrid_events.jsonl")) as f:
        events = [json.loads(line)["events"] for line in f if line.strip()]
    assert "engine_resume_weights" in events[0] and "sync_weights" in events[0]  # the base, once
    for step in events[1:]:  # the engine keeps its weights between steps (it releases its KV cache only)
        assert "sync_adapters" in step and "engine_resume_weights" not in step and "sync_weights" not in step, step
    # the checkpoint: adapters (and their optimizer state) only
    keys = checkpoint_tensor_shapes(os.path.join(save, "step_000002"))
    model_keys = [k for k in keys if not k.startswith(("optimizer", "scheduler"))]
    assert model_keys and all(is_lora_param(k) for k in model_keys), model_keys[:5]
    # the merged export: the adapted projections moved, every other tensor is the base's, bitwise
    base, final = (
        load_file(os.path.join(hf, "model.safetensors")),
        load_file(os.path.join(run, "final_hf", "model.safetensors")),
    )
    adapted = {n for n in final if n.endswith(("q_proj.weight", "v_proj.weight", "down_proj.weight"))}
    assert adapted and all(not (final[n] == base[n]).all() for n in adapted)
    assert all((final[n] == base[n]).all() for n in final if n not in adapted), [
        n for n in final if n not in adapted and not (final[n] == base[n]).all()
    ]

    # the converter merges a LoRA checkpoint with the base it names: the same tensors as the run's export
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    conv = str(tmp_path / "converted")
    done = subprocess.run(
        [
            sys.executable,
            os.path.join(root, "tools", "convert_megatron_to_hf.py"),
            "--load",
            os.path.join(save, "step_000002"),
            "--save",
            conv,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    converted = load_file(os.path.join(conv, "model.safetensors"))
    assert converted.keys() == final.keys() and all((converted[n] == final[n]).all() for n in final)

    # the adapters in PEFT's format: peft loads them on the base, and the result computes what the
    # merged export computes (float32; PEFT adds (alpha/r) B A x to W x, the export stores W + (alpha/r) B A)
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(hf), os.path.join(run, "final_peft"))
    merged = AutoModelForCausalLM.from_pretrained(os.path.join(run, "final_hf"))
    tokens = torch.randint(0, 1000, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a, b = peft_model(tokens).logits, merged(tokens).logits
    assert float((a - b).abs().max()) < 1e-4, float((a - b).abs().max())

    # a resume: the base from --hf-checkpoint, the adapters and optimizer from the checkpoint
    capsys.readouterr()
    resume = {**args, "--load": save}
    assert main(base_args(hf, prompts, run, **{"--num-rollout": "3", **resume})) == 0
    assert "continuing after step 2" in capsys.readouterr().out
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]
    # other adapters on the same checkpoint: refused before anything starts, in one line
    other = {**resume, "--lora-rank": "8"}
    assert main(base_args(hf, prompts, run, **{"--num-rollout": "4", **other})) == 2
    err = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(err) == 1 and "its adapters were trained with --lora-rank 4, this run has 8" in err[0], err
    # the adapter sync is wired for the HF engine only: SGLang is refused by the dry run
    refused = base_args(hf, prompts, run, **{**resume, "--rollout-engine": "sglang", "--dry-run": None})
    assert main(refused) != 0
    assert "--lora-sync adapter with --rollout-engine sglang" in capsys.readouterr().out
