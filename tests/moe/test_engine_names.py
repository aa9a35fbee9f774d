"""The names (and layouts) each engine receives for Qwen3 and Qwen3-MoE (checkpoint/mapping.py).

* ``transformers`` naming (the CPU engine): exactly the transformers model's parameters; a
  MoE layer's experts are its fused ``mlp.experts.gate_up_proj`` / ``down_proj``, stacked
  from megatron's per-expert ``linear_fc1`` (= ``[gate; up]``) and ``linear_fc2``.
* ``checkpoint`` naming (SGLang, and the HF files): exactly what ``save_pretrained`` writes,
  one tensor per expert; checked against the pinned SGLang wheel's own ``load_weights``
  renaming (its ``stacked_params_mapping`` and ``FusedMoE.make_expert_params_mapping``, run
  from the wheel's source) and the modules its Qwen3 / Qwen3-MoE classes define.
"""

import ast

import pytest
import torch

from megatron_dapo.checkpoint import mapping
from megatron_dapo.models import parse_hf_config
from tests.tiny import checkpoint_state_dict, random_hf_model, tiny_qwen3_config, tiny_qwen3_moe_config

CONFIGS = {"qwen3": tiny_qwen3_config(), "qwen3_moe": tiny_qwen3_moe_config()}


@pytest.fixture(scope="module")
def models():
    out = {}
    for name, cfg in CONFIGS.items():
        m = random_hf_model(cfg, seed=1)
        out[name] = (m, checkpoint_state_dict(m))
    return out


@pytest.mark.parametrize("name", list(CONFIGS))
def test_names_are_the_engines(models, name):
    arch = parse_hf_config(CONFIGS[name])
    model, files = models[name]
    tied = {"lm_head.weight"} if arch.tie_word_embeddings else set()
    assert sorted(mapping.engine_names(arch, "transformers")) == sorted(dict(model.named_parameters()))
    assert sorted(mapping.engine_names(arch, "checkpoint")) == sorted(set(files) - tied)
    assert sorted(mapping.hf_names(arch)) == sorted(set(files) - tied)


def test_expert_stack_is_the_transformers_layout(models):
    """megatron's experts (built from the checkpoint tensors by the mapping) stacked per layer
    are transformers' fused tensors, bit for bit; per expert they are the checkpoint's."""
    arch = parse_hf_config(CONFIGS["qwen3_moe"])
    model, files = models["qwen3_moe"]
    params = dict(model.named_parameters())
    full = dict(mapping.hf_to_megatron(arch, files.__getitem__))
    for layer in range(arch.num_layers):
        for which in ("linear_fc1", "linear_fc2"):
            stack = torch.stack(
                [
                    full[f"decoder.layers.{layer}.mlp.experts.local_experts.{e}.{which}.weight"]
                    for e in range(arch.num_experts)
                ]
            )
            ((name, fused),) = mapping.expert_stack_to_hf(
                arch, mapping.expert_stack_name(layer, which), stack, "transformers"
            )
            assert fused is stack and torch.equal(params[name].detach(), stack), name
            per_expert = mapping.expert_stack_to_hf(arch, mapping.expert_stack_name(layer, which), stack)
            assert len(per_expert) == arch.num_experts * (2 if which == "linear_fc1" else 1)
            for n, t in per_expert:
                assert t.data_ptr() >= stack.data_ptr() and t.is_contiguous()  # views, no copy
                assert torch.equal(t, files[n]), n
    # and back: megatron_to_hf of each full tensor gives the checkpoint's tensors
    for gname, t in full.items():
        for n, x in mapping.megatron_to_hf(arch, gname, t):
            assert torch.equal(x, files[n]), n


# ------------------------------------------------------------------ SGLang's own renaming ----
SGLANG = {
    "qwen3": ("sglang.srt.models.qwen3", "Qwen3ForCausalLM", ("qwen3", "qwen2")),
    "qwen3_moe": ("sglang.srt.models.qwen3_moe", "Qwen3MoeForCausalLM", ("qwen3_moe", "qwen2_moe")),
}


def _load_weights_literal(src, module, cls, var):
    fn = next(n for n in src.cls(module, cls).body if isinstance(n, ast.FunctionDef) and n.name == "load_weights")
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and node.targets[0].id == var:
            return ast.literal_eval(node.value)
    raise AssertionError(f"{module}.{cls}.load_weights has no {var}")


def _attributes(src, modules) -> set:
    """Every ``self.X = ...`` (also ``self.X, ... = ...``) in the wheel's model files."""
    out = set()
    for m in modules:
        for node in ast.walk(src.tree(f"sglang.srt.models.{m}")):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    for x in t.elts if isinstance(t, ast.Tuple) else [t]:
                        if isinstance(x, ast.Attribute) and isinstance(x.value, ast.Name) and x.value.id == "self":
                            out.add(x.attr)
    return out


def _expert_mapping(src, num_experts):
    from tests.rollout.sglang_wheel import extract

    code = extract(src, "sglang.srt.layers.moe.fused_moe_triton.layer", ["make_expert_params_mapping"], cls="FusedMoE")
    ns = {"List": list, "Tuple": tuple}
    exec(compile(code, "make_expert_params_mapping", "exec"), ns)
    return ns["make_expert_params_mapping"].__func__(
        None,
        ckpt_gate_proj_name="gate_proj",
        ckpt_down_proj_name="down_proj",
        ckpt_up_proj_name="up_proj",
        num_experts=num_experts,
    )


@pytest.mark.parametrize("name", list(CONFIGS))
def test_sglang_load_weights_takes_every_name(name):
    from tests.rollout.sglang_wheel import wheel

    src = wheel()
    module, cls, files = SGLANG[name]
    arch = parse_hf_config(CONFIGS[name])
    stacked = _load_weights_literal(src, module, cls, "stacked_params_mapping")
    experts = _expert_mapping(src, arch.num_experts) if arch.is_moe else []
    attrs = _attributes(src, files)
    seen_experts = set()
    for n in mapping.engine_names(arch, "checkpoint"):
        target = None
        for param, weight, _ in stacked:  # SGLang's loop, in its order
            if weight in n and "mlp.experts" not in n:
                target = n.replace(weight, param)
                break
        else:
            hits = [(p, w, e, s) for p, w, e, s in experts if w in n]
            if hits:
                assert len(hits) == 1, (n, hits)
                ((p, w, e, s),) = hits
                assert f".experts.{e}." in n and s in ("w1", "w2", "w3")
                seen_experts.add((n.split(".experts.")[0], e, s))
                target = n.replace(w, p)
            else:
                target = n
        segments = [s for s in target.split(".")[:-1] if not s.isdigit()]
        if ".experts." in n:  # FusedMoE's own parameters
            assert target.endswith((".mlp.experts.w13_weight", ".mlp.experts.w2_weight")), (n, target)
        missing = [s for s in segments if s not in attrs]
        assert not missing, (n, target, missing)
    if arch.is_moe:  # every (layer, expert, shard) of SGLang's mapping received once
        assert len(seen_experts) == arch.num_layers * arch.num_experts * 3
