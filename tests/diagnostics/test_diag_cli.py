"""tools/diagnose.py: exit codes, printed verdicts, the dashboard PNG."""

import json
import os
import subprocess
import sys

import diag_synthetic as S
import pytest

from megatron_dapo.diagnostics import History, diagnose, plot_diagnosis
from megatron_dapo.diagnostics.cli import main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _is_png(path):
    with open(path, "rb") as f:
        return os.path.getsize(path) > 10_000 and f.read(8) == PNG_MAGIC


def test_healthy_run_exits_zero_and_writes_dashboard(tmp_path, capsys):
    run = S.write_run(tmp_path / "run", S.healthy())
    assert main([str(run), "--fail-on-alert"]) == 0
    out = capsys.readouterr().out
    assert out.count("[     OK]") == 4 and "verdict: no alerts" in out
    assert _is_png(run / "diagnosis.png")


@pytest.mark.parametrize("mode", ["entropy_collapse", "too_easy", "repetition", "truncation"])
def test_alerts_exit_code_only_with_fail_on_alert(tmp_path, capsys, mode):
    boundary, make, kind = S.FAILURE_MODES[mode]
    run = S.write_run(tmp_path / "run", make())
    assert main([str(run), "--no-plot"]) == 0
    assert main([str(run), "--no-plot", "--fail-on-alert"]) == 1
    out = capsys.readouterr().out
    assert kind in out and "[  ALERT]" in out
    assert not (run / "diagnosis.png").exists()


def test_out_thresholds_set_and_json(tmp_path, capsys):
    run = S.write_run(tmp_path / "run", S.reward_truncation())
    png = tmp_path / "elsewhere" / "dash.png"
    assert main([str(run), "--out", str(png), "--fail-on-alert"]) == 1
    assert _is_png(png) and not (run / "diagnosis.png").exists()
    th = tmp_path / "th.yaml"
    th.write_text("truncation_ratio_max: 0.9\n")
    # the file lifts one threshold; --set lifts the other
    assert main([str(run), "--no-plot", "--fail-on-alert", "--thresholds", str(th)]) == 1
    assert (
        main(
            [
                str(run),
                "--no-plot",
                "--fail-on-alert",
                "--thresholds",
                str(th),
                "--set",
                "overlong_penalty_max=0.9",
                "--json",
                str(tmp_path / "d.json"),
            ]
        )
        == 0
    )
    d = json.loads((tmp_path / "d.json").read_text())
    assert d["any_alert"] is False and d["thresholds"]["truncation_ratio_max"] == 0.9
    capsys.readouterr()
    assert main([str(run), "--list-thresholds"]) == 0
    assert "entropy_collapse_ratio: 0.3" in capsys.readouterr().out


def test_usage_errors(tmp_path, capsys):
    assert main([str(tmp_path)]) == 2  # no metrics.jsonl
    run = S.write_run(tmp_path / "run", S.healthy())
    assert main([str(run), "--set", "nonsense=1"]) == 2
    assert main([str(run), "--thresholds", str(tmp_path / "missing.yaml")]) == 2
    assert "bad thresholds" in capsys.readouterr().err


def test_partial_metrics_and_no_data_panel(tmp_path, capsys):
    run = S.write_run(
        tmp_path / "run", S.healthy(), drop=("truncation_ratio", "overlong_penalty_mean", "no_answer_rate")
    )
    assert main([str(run), "--fail-on-alert"]) == 0
    out = capsys.readouterr().out
    assert "[NO DATA] Reward interpretation" in out
    assert _is_png(run / "diagnosis.png")


def test_plot_every_failure_mode(tmp_path):
    for mode, (_, make, _) in S.FAILURE_MODES.items():
        h = History.from_records(S.records(make()))
        path = plot_diagnosis(diagnose(h), h, str(tmp_path / f"{mode}.png"))
        assert _is_png(path)


def test_script_runs_from_repo_root(tmp_path):
    run = S.write_run(tmp_path / "run", S.group_contrast_too_easy())
    cmd = [sys.executable, "tools/diagnose.py", str(run), "--plain"]
    ok = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert "Group contrast" in ok.stdout and "kept_groups_low" in ok.stdout
    assert _is_png(run / "diagnosis.png")
    fail = subprocess.run(cmd + ["--fail-on-alert", "--no-plot"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert fail.returncode == 1
