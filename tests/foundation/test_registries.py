"""Every registry-backed flag: its --help choices are the registry's names, and docs/design.md
holds exactly the table ``python -m megatron_dapo.config.registries --markdown`` generates."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from megatron_dapo.config import build_parser
from megatron_dapo.config.registries import BEGIN, END, markdown, registries
from megatron_dapo.reward.api import REWARD_MODES, compute_score, is_equivalent, register_reward_mode
from megatron_dapo.reward.plugins import RewardRouter, spec_kind
from megatron_dapo.rollout.engines import ENGINE_KINDS, engine_choices, resolve_engine_kind

ROOT = pathlib.Path(__file__).resolve().parents[2]
DESIGN = (ROOT / "docs" / "design.md").read_text()


def _choices():
    return {a.option_strings[0]: a.choices for a in build_parser()._actions if a.option_strings}


@pytest.mark.parametrize("flag", [f for f, _, _ in registries()])
def test_help_choices_are_the_registrys_names(flag):
    reg = dict((f, r) for f, r, _ in registries())[flag]
    assert reg.flag == flag
    want = list(engine_choices()) if flag == "--rollout-engine" else list(reg.names())
    assert _choices()[flag] == want
    assert len(reg) >= 2


def test_docs_hold_exactly_the_generated_table():
    assert DESIGN.count(BEGIN) == 1 and DESIGN.count(END) == 1
    start = DESIGN.index(BEGIN)
    held = DESIGN[start : DESIGN.index(END) + len(END)]
    assert held == markdown(), "docs/design.md is stale: paste `python -m megatron_dapo.config.registries --markdown`"
    for _, reg, _ in registries():
        for name in reg:
            assert reg.doc(name), f"{reg.kind} {name!r} has no docstring for the docs' table"


def test_the_module_prints_the_table():
    out = subprocess.run(
        [sys.executable, "-m", "megatron_dapo.config.registries", "--markdown"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert out.strip() == markdown()


def test_a_registered_reward_mode_is_selectable_everywhere():
    """One decorator makes a mode a --reward-mode choice, a --reward-source spec and a scorer mode."""

    @register_reward_mode("test-exact", equivalent=lambda gold, pred: gold.strip() == pred.strip())
    def exact(response, ground_truth, eos_text=None):
        """Exact string match (test only)."""
        from megatron_dapo.reward.result import RewardResult

        ok = response.strip() == ground_truth.strip()
        return RewardResult(score=1.0 if ok else -1.0, acc=ok, pred=response.strip(), reason="ok" if ok else "wrong")

    try:
        assert "test-exact" in _choices()["--reward-mode"]
        assert spec_kind("test-exact") == "builtin"
        assert RewardRouter(mode="test-exact").default == "test-exact"
        assert compute_score("42", "42", mode="test-exact").score == 1.0
        assert compute_score("41", "42", mode="test-exact").score == -1.0
        assert is_equivalent("42", " 42", mode="test-exact")
    finally:
        REWARD_MODES._items.pop("test-exact")
    with pytest.raises(ValueError, match="--reward-mode: unknown reward mode 'test-exact'; one of dapo, math"):
        compute_score("42", "42", mode="test-exact")


def test_engine_kinds_resolve_auto_and_name_their_class_without_importing_it():
    assert resolve_engine_kind("auto", on_gpu=False) == "hf"
    assert resolve_engine_kind("auto", on_gpu=True) == "sglang"
    assert resolve_engine_kind("hf", on_gpu=True) == "hf"
    with pytest.raises(ValueError, match="--rollout-engine: unknown engine kind 'vllm'"):
        resolve_engine_kind("vllm", on_gpu=True)
    assert ENGINE_KINDS.get("hf").load_class().__name__ == "HFEngine"
    assert ENGINE_KINDS.get("sglang").engine_class == "megatron_dapo.rollout.sglang_engine:SGLangEngine"
    assert [ENGINE_KINDS.get(k).lag for k in ("hf", "sglang")] == [0, 1]
