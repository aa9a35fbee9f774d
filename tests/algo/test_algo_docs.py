"""docs/algorithm.md states the truth: its command lines, preset columns, flag forms and metric
names are checked against the project's CLI (megatron_dapo.config.cli), the presets and what
the trainer logs (docs/metrics.md, the metrics.jsonl contract that tests/driver/test_logging.py
checks against the code)."""

import dataclasses
import pathlib
import re
import shlex

import pytest
import torch

from megatron_dapo.algo import PRESETS, AlgorithmConfig, policy_loss
from megatron_dapo.config import parse_args
from tests.metrics_doc import documented_keys

DOCS = pathlib.Path(__file__).resolve().parents[2] / "docs"
DOC = DOCS / "algorithm.md"


def _parse(argv):
    return parse_args(list(argv)).algo


def _ablation_lines():
    text = DOC.read_text()
    block = text[text.index("## The paper's cumulative ablation") :]
    block = block.replace("\\\n", " ")
    lines = [ln.strip() for ln in block.splitlines() if ln.strip().startswith("python -m megatron_dapo.train")]
    return [shlex.split(ln.replace("$COMMON", ""))[3:] for ln in lines]


def _summary_rows():
    """(flag cell, grpo cell, dapo cell, metrics cell) of each row of the Summary table."""
    text = DOC.read_text()
    block = text[text.index("## Summary") : text.index("\n## ", text.index("## Summary") + 1)]
    rows = [ln for ln in block.splitlines() if ln.startswith("| ") and not ln.startswith("| Control")]
    return [tuple(c.strip() for c in ln.strip("|").split("|"))[1:] for ln in rows if "---" not in ln]


def _names(cell):
    """Metric names in a table cell: backticked identifiers; `x_mean/max` is x_mean and x_max."""
    out = []
    for tok in re.findall(r"`([a-z0-9_/]+)`", cell):
        head, *alts = tok.split("/")
        out.append(head)
        out += [head.rsplit("_", 1)[0] + "_" + a for a in alts]
    return out


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
    assert diffs == [
        {"overlong_filter"},
        {"eps_clip_high"},
        {"overlong_penalty"},
        {"loss_agg_mode"},
        {"dynamic_sampling"},
    ]
    # "Line 6 is --algorithm dapo --clip-ratio-c none"
    dapo_paper = AlgorithmConfig.from_preset("dapo", clip_ratio_c=None)
    assert dataclasses.replace(cfgs[5], algorithm="dapo") == dapo_paper
    assert _parse(["--algorithm", "dapo", "--clip-ratio-c", "none"]) == dapo_paper


def test_every_flag_is_documented():
    text = DOC.read_text()
    for f in dataclasses.fields(AlgorithmConfig):
        assert f.metadata["flag"] in text, f.metadata["flag"]


@pytest.mark.parametrize(
    "argv, field, value",
    [
        (["--algorithm", "grpo", "--eps-clip-high", "0.28"], "eps_clip_high", 0.28),
        (["--algorithm", "dapo", "--dynamic-sampling", "false"], "dynamic_sampling", False),
        (["--algorithm", "grpo", "--clip-ratio-c", "3"], "clip_ratio_c", 3.0),
        # "the project CLI also accepts a bare --overlong-filter and --no-overlong-filter"
        (["--algorithm", "grpo", "--overlong-filter"], "overlong_filter", True),
        (["--algorithm", "dapo", "--no-overlong-filter"], "overlong_filter", False),
    ],
)
def test_explicit_flags_win_over_presets(argv, field, value):
    assert getattr(_parse(argv), field) == value


def test_custom_is_the_dataclass_defaults_which_equal_dapo():
    assert _parse(["--algorithm", "custom"]) == dataclasses.replace(AlgorithmConfig(), algorithm="custom")
    assert {k: getattr(AlgorithmConfig(), k) for k in PRESETS["dapo"]} == PRESETS["dapo"]


def test_summary_table_preset_columns_are_the_presets():
    """Each row's `grpo` and `dapo` cells, one value per flag, are what the CLI gives."""
    checked = 0
    for flags_cell, grpo, dapo, *_ in _summary_rows():
        flags = re.findall(r"`(--[a-z-]+)", flags_cell)
        for preset, cell in (("grpo", grpo), ("dapo", dapo)):
            if not cell:
                continue
            values = [v.strip() for v in cell.split(",")]
            assert len(values) == len(flags), (flags_cell, cell)
            for flag, value in zip(flags, values):
                field = next(f.name for f in dataclasses.fields(AlgorithmConfig) if f.metadata["flag"] == flag)
                documented = getattr(_parse(["--algorithm", "custom", flag, value]), field)
                assert getattr(AlgorithmConfig.from_preset(preset), field) == documented, (preset, flag, value)
                checked += 1
    assert checked >= 20


def test_summary_table_metrics_are_logged():
    """A metric the table names is a key of policy_loss's metrics or a documented metrics.jsonl key."""
    lp = torch.zeros(1, 3)
    _, loss_metrics = policy_loss(lp, lp, torch.ones(1, 3), torch.ones(1, 3))
    known = set(loss_metrics) | documented_keys()
    named = [n for *_, metrics in _summary_rows() for n in _names(metrics)]
    assert len(named) >= 10
    assert [n for n in named if n not in known] == []
