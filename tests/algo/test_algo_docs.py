"""The ablation command lines of docs/algorithm.md use real flags and give the intended configs.

The CLI itself is built elsewhere from the dataclass metadata; this test builds a minimal
argparse parser from the same metadata (flag, type, bool as true/false, 'none' for
Optional) so that the documented flags and the presets stay consistent.
"""

import argparse
import dataclasses
import pathlib
import re
import shlex
import typing

import pytest

from megatron_dapo.algo import AlgorithmConfig, apply_preset

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "algorithm.md"


def _bool(text):
    if text.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")
    return text.lower() == "true"


def _parser():
    p = argparse.ArgumentParser()
    for f in dataclasses.fields(AlgorithmConfig):
        t = f.type
        if t is bool:
            conv = _bool
        elif typing.get_origin(t) is typing.Union:
            inner = [a for a in typing.get_args(t) if a is not type(None)][0]
            conv = lambda s, inner=inner: None if s.lower() == "none" else inner(s)  # noqa: E731
        else:
            conv = t
        p.add_argument(f.metadata["flag"], dest=f.name, type=conv, default=argparse.SUPPRESS,
                       help=f.metadata["help"])
    return p


def _parse(argv):
    given = vars(_parser().parse_args(argv))
    cfg = AlgorithmConfig(**given)
    return apply_preset(cfg, cfg.algorithm, explicit=set(given)).validate()


def _ablation_lines():
    text = DOC.read_text()
    block = text[text.index("## The paper's cumulative ablation"):]
    block = block.replace("\\\n", " ")
    lines = [ln.strip() for ln in block.splitlines() if ln.strip().startswith("python -m megatron_dapo.train")]
    return [shlex.split(ln.replace("$COMMON", ""))[3:] for ln in lines]


def test_six_ablation_lines_are_cumulative_and_end_at_dapo():
    lines = _ablation_lines()
    assert len(lines) == 6
    cfgs = [_parse(argv) for argv in lines]
    for prev, cur in zip(lines, lines[1:]):
        assert cur[: len(prev)] == prev  # each line extends the previous one
    assert cfgs[0] == AlgorithmConfig.from_preset("grpo")
    diffs = []
    for a, b in zip(cfgs, cfgs[1:]):
        diffs.append({f.name for f in dataclasses.fields(AlgorithmConfig) if getattr(a, f.name) != getattr(b, f.name)})
    assert diffs == [{"overlong_filter"}, {"eps_clip_high"}, {"overlong_penalty"}, {"loss_agg_mode"},
                     {"dynamic_sampling"}]
    dapo_paper = AlgorithmConfig.from_preset("dapo", clip_ratio_c=None)
    assert dataclasses.replace(cfgs[5], algorithm="dapo") == dapo_paper
    assert _parse(["--algorithm", "dapo", "--clip-ratio-c", "none"]) == dapo_paper


def test_every_flag_is_documented():
    text = DOC.read_text()
    for f in dataclasses.fields(AlgorithmConfig):
        assert f.metadata["flag"] in text, f.metadata["flag"]


@pytest.mark.parametrize("argv, field, value", [
    (["--algorithm", "grpo", "--eps-clip-high", "0.28"], "eps_clip_high", 0.28),
    (["--algorithm", "dapo", "--dynamic-sampling", "false"], "dynamic_sampling", False),
    (["--algorithm", "grpo", "--clip-ratio-c", "3"], "clip_ratio_c", 3.0),
])
def test_explicit_flags_win_over_presets(argv, field, value):
    assert getattr(_parse(argv), field) == value


def test_project_cli_agrees_on_the_ablation_lines():
    """The project's CLI (megatron_dapo.config.cli) resolves the documented lines the same way."""
    cli = pytest.importorskip("megatron_dapo.config.cli")
    for argv in _ablation_lines():
        cfg = cli.parse_args(argv)
        assert cfg.algo == _parse(argv), argv
