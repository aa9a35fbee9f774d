"""One clear line for every mistake (issue #24, point 4), one test per kind.

Every mistake a user can make ends the command with exit code 2 and exactly one line on stderr
that names the flag or file (and the fix), no traceback; ``MEGATRON_DAPO_DEBUG=1`` shows the
traceback. Entry points: the driver (``python -m megatron_dapo.train``), the converters,
``tools/eval.py``, ``tools/diagnose.py`` and ``examples/slurm/submit_dapo.sbatch``.

Most cases call an entry point's ``main`` in this process (a mistake found before Ray costs no
process start); a few run the real command line, which is what a user sees. Nothing here starts
Ray: every case fails before it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys

import pytest
import torch

from megatron_dapo import known_warnings, train
from megatron_dapo.errors import DEBUG_ENV
from tests.e2e.fixtures import make_prompts, make_tiny_qwen2_dir
from tests.launch.procs import run_in_session
from tests.tiny import tiny_qwen2_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch):
    monkeypatch.delenv(DEBUG_ENV, raising=False)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A real tiny model (weights, tokenizer) and prompts: what passes every check before Ray."""
    d = tmp_path_factory.mktemp("user_errors")
    return make_tiny_qwen2_dir(str(d / "hf")), make_prompts(str(d / "prompts.jsonl"), n=8)


def _args(tiny, tmp_path, *extra):
    hf, prompts = tiny
    return [
        "--hf-checkpoint",
        hf,
        "--prompt-data",
        prompts,
        "--run-dir",
        str(tmp_path / "run"),
        "--wandb-mode",
        "disabled",
        "--num-rollout",
        "1",
        "--max-prompt-length",
        "64",
        "--max-response-length",
        "12",
        "--overlong-buffer-length",
        "4",
        "--reward-num-workers",
        "1",
        *extra,
    ]


def one_line(err: str, *needles: str) -> str:
    """The only line of ``err``; it names every one of ``needles``; no traceback."""
    assert "Traceback" not in err, err[-3000:]
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err[-3000:]
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def _train(capfd, argv) -> str:
    """``megatron_dapo.train.main(argv)`` must return 2 (argparse's own errors: exit 2);
    returns its one stderr line."""
    capfd.readouterr()
    try:
        code = train.main(argv)
    except SystemExit as e:
        code = e.code
    assert code == 2, capfd.readouterr()
    return capfd.readouterr().err


def _train_cmd(args, **env_extra):
    env = {k: v for k, v in os.environ.items() if k not in (DEBUG_ENV, "RAY_ADDRESS")}
    env.update(PYTHONPATH=ROOT, OMP_NUM_THREADS="1", **env_extra)
    return subprocess.run(
        [sys.executable, "-m", "megatron_dapo.train", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _tool(name):
    spec = importlib.util.spec_from_file_location(
        f"_tools_{name}_user_errors", os.path.join(ROOT, "tools", f"{name}.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _exits_2(capfd, fn, *args) -> str:
    capfd.readouterr()
    with pytest.raises(SystemExit) as e:
        fn(*args)
    assert e.value.code == 2, e.value.code
    return capfd.readouterr().err


# ------------------------------------------------------------------------------------- config


def test_config_mistakes_are_one_line(tiny, tmp_path, capfd):
    bad = tmp_path / "broken.yaml"
    bad.write_text("optim:\n  lr: [1e-6\n")
    one_line(
        _train(capfd, _args(tiny, tmp_path, "--config", str(bad))), "--config", "broken.yaml", "invalid YAML", "line 3"
    )
    listed = tmp_path / "list.yaml"
    listed.write_text("- lr\n- 1e-6\n")
    one_line(_train(capfd, _args(tiny, tmp_path, "--config", str(listed))), "--config", "list.yaml", "mapping")
    choice = tmp_path / "choice.yaml"
    choice.write_text("rollout-engine: vllm\n")  # a YAML value outside the flag's choices was accepted
    one_line(
        _train(capfd, _args(tiny, tmp_path, "--config", str(choice))), "--rollout-engine", "vllm", "auto, hf, sglang"
    )
    one_line(_train(capfd, _args(tiny, tmp_path, "--config", str(tmp_path))), "--config", "cannot read")
    one_line(_train(capfd, _args(tiny, tmp_path, "--rollout-stop", "\\x4")), "--rollout-stop", "bad escape")
    one_line(
        _train(capfd, _args(tiny, tmp_path, "--eps-clip-low", "0.3", "--eps-clip-high", "0.2")),
        "--eps-clip-high 0.2",
        "--eps-clip-low 0.3",
        "swap",
    )
    # argparse's own errors: one line (not a usage text of a hundred lines), the closest flag
    one_line(_train(capfd, _args(tiny, tmp_path, "--eps-clip-hihg", "0.28")), "unrecognized", "--eps-clip-high")
    one_line(_train(capfd, _args(tiny, tmp_path, "--lr", "fast")), "--lr", "fast")
    one_line(_train(capfd, _args(tiny, tmp_path, "--max-num-gen-batches", "0")), "--max-num-gen-batches")
    one_line(
        _train(capfd, _args(tiny, tmp_path, "--tokenizer", str(tmp_path / "no-tokenizer"))),
        "--tokenizer",
        "no-tokenizer",
        "not found",
    )


def test_rollout_stop_escapes_decode_and_keep_other_characters():
    from megatron_dapo.config.cli import decode_escapes

    # the old codecs.decode(s, "unicode_escape") turned "é" into "Ã©" and "。" into an error
    assert decode_escapes("--rollout-stop", ["\\n\\nQuestion:", "</answer>", "é", "。", "\\u2028"]) == [
        "\n\nQuestion:",
        "</answer>",
        "é",
        "。",
        "\u2028",
    ]


def test_the_real_command_line_and_the_debug_switch(tiny, tmp_path):
    bad = tmp_path / "broken.yaml"
    bad.write_text("lr: [\n")
    p = _train_cmd(_args(tiny, tmp_path, "--config", str(bad)))
    assert p.returncode == 2
    one_line(p.stderr, "megatron_dapo.train: error: --config", "broken.yaml")
    p = _train_cmd(_args(tiny, tmp_path, "--config", str(bad)), **{DEBUG_ENV: "1"})
    assert p.returncode != 0 and "Traceback" in p.stderr and "ConfigError" in p.stderr, p.stderr[-2000:]


def test_an_unusable_run_dir_is_one_line(tiny, tmp_path):
    """Found after the tokenizer, the data and the reward pool were set up, still before Ray."""
    (tmp_path / "a-file").write_text("x")
    args = _args(tiny, tmp_path)
    args[args.index("--run-dir") + 1] = str(tmp_path / "a-file" / "run")
    p = _train_cmd(args)
    assert p.returncode == 2
    one_line(p.stderr, "--run-dir", "a-file/run")
    p = _train_cmd(_args(tiny, tmp_path, "--run-dir", "/proc/megatron-dapo-no-such-dir/run"))
    assert p.returncode == 2
    one_line(p.stderr, "/proc/megatron-dapo-no-such-dir")


def test_a_run_that_stalls_ends_in_one_line_and_prints_no_known_library_warning(tiny, tmp_path):
    """A real run (Ray, an engine, a trainer rank) whose dynamic sampling finds no mixed group
    within its budget: the stall's own line, exit 2, no traceback; the known-harmless warnings
    of megatron-core and Ray (megatron_dapo/known_warnings.py) do not print."""
    args = _args(tiny, tmp_path, "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--global-batch-size", "4")
    # the tiny random model answers no prompt right: every group is all-wrong
    p = _train_cmd([*args, "--max-num-gen-batches", "1"])
    assert p.returncode == 2, p.stderr[-3000:]
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    assert "megatron_dapo.train: error: step 1: only 0 of --rollout-batch-size 2 mixed-correctness groups" in last, last
    assert "--max-num-gen-batches" in last
    for k in known_warnings.KNOWN:
        assert not re.search(k.message, p.stderr), (k.message, p.stderr[-3000:])
    assert "Token authentication is enabled" not in p.stderr


# --------------------------------------------------------------------------------------- data


def test_data_mistakes_are_one_line(tiny, tmp_path, capfd):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    one_line(_train(capfd, _args(tiny, tmp_path, "--prompt-data", str(empty))), "empty.jsonl")
    one_line(
        _train(capfd, _args(tiny, tmp_path, "--prompt-data", str(tmp_path / "typo.jsonl"))),
        "--prompt-data",
        "typo.jsonl",
    )
    assert not (tmp_path / "run").exists()  # nothing written
    truthy = tmp_path / "truthy.jsonl"
    truthy.write_text('{"prompt": "Is it?", "reward_model": {"ground_truth": true}}\n')
    one_line(
        _train(capfd, _args(tiny, tmp_path, "--prompt-data", str(truthy))),
        "truthy.jsonl: row 0",
        "reward_model.ground_truth",
        "got bool True",
    )
    parts = tmp_path / "parts.jsonl"
    parts.write_text(
        '{"prompt": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], '
        '"reward_model": {"ground_truth": "1"}}\n'
    )
    one_line(_train(capfd, _args(tiny, tmp_path, "--prompt-data", str(parts))), "parts.jsonl: row 0", "'image_url'")


# --------------------------------------------------------------------------------- checkpoint


def test_checkpoint_mistakes_are_one_line(tiny, tmp_path, capfd):
    (tmp_path / "not-a-checkpoint").mkdir()
    one_line(
        _train(capfd, _args(tiny, tmp_path, "--load", str(tmp_path / "not-a-checkpoint"))), "--load", "not-a-checkpoint"
    )
    one_line(_train(capfd, _args(tiny, tmp_path, "--load", str(tmp_path / "typo"))), "--load", "typo")
    to_hf = _tool("convert_megatron_to_hf")
    err = _exits_2(
        capfd,
        to_hf.main,
        ["--load", str(tmp_path / "not-a-checkpoint"), "--save", str(tmp_path / "out"), "--tokenizer", tiny[0]],
    )
    one_line(err, "not-a-checkpoint", "not a megatron-dapo torch_dist checkpoint")
    assert not (tmp_path / "out").exists()
    for size in ("0", "-1", "nan"):  # issue 38: a shard size that cannot be, before anything is read or written
        err = _exits_2(
            capfd,
            to_hf.main,
            [
                "--load",
                str(tmp_path / "not-a-checkpoint"),
                "--save",
                str(tmp_path / "out"),
                "--max-shard-size-gb",
                size,
            ],
        )
        one_line(err, "--max-shard-size-gb must be a finite number > 0", size)
    assert not (tmp_path / "out").exists()
    # an HF checkpoint with an integer "weight": refused from the headers, nothing built or written
    import shutil

    from safetensors.torch import load_file, save_file

    ints = tmp_path / "int-weights"
    shutil.copytree(tiny[0], ints)
    tensors = load_file(str(ints / "model.safetensors"))
    name = sorted(tensors)[0]
    tensors[name] = tensors[name].to(torch.int64)
    save_file(tensors, str(ints / "model.safetensors"))
    to_mg = _tool("convert_hf_to_megatron")
    err = _exits_2(capfd, to_mg.main, ["--hf-checkpoint", str(ints), "--save", str(tmp_path / "mg")])
    one_line(err, "model.safetensors", repr(name), "dtype I64", "not a floating-point weight")
    assert not (tmp_path / "mg").exists()


# -------------------------------------------------------------------------------------- model


def test_model_mistakes_are_one_line(tiny, tmp_path, capfd):
    gpt2 = tmp_path / "gpt2"
    gpt2.mkdir()
    (gpt2 / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    args = _args(tiny, tmp_path)
    args[args.index("--hf-checkpoint") + 1] = str(gpt2)
    one_line(_train(capfd, args), "model_type='gpt2'", "qwen2")
    no_config = tmp_path / "no-config"
    no_config.mkdir()
    args[args.index("--hf-checkpoint") + 1] = str(no_config)
    one_line(_train(capfd, args), "--hf-checkpoint", "no-config", "config.json")
    # a model directory without a tokenizer: transformers built an empty one from config.json
    shape_only = tmp_path / "shape-only"
    shape_only.mkdir()
    cfg = tiny_qwen2_config(vocab_size=151680)
    (shape_only / "config.json").write_text(json.dumps(cfg))
    for f in os.listdir(tiny[0]):
        if f.startswith("model."):
            os.symlink(os.path.join(tiny[0], f), shape_only / f)
    args[args.index("--hf-checkpoint") + 1] = str(shape_only)
    one_line(_train(capfd, args), "--hf-checkpoint", "shape-only", "tokenizer")


def test_a_tokenizer_without_a_vocabulary_is_refused_where_it_is_loaded(tmp_path):
    from megatron_dapo.config.validate import load_tokenizer
    from megatron_dapo.models.hf_config import ModelConfigError

    (tmp_path / "config.json").write_text(json.dumps(tiny_qwen2_config()))  # a Qwen2 model: transformers builds
    (tmp_path / "tokenizer_config.json").write_text("{}")  # an empty Qwen2 tokenizer from these two files
    with pytest.raises(ModelConfigError, match="--tokenizer .*no vocabulary"):
        load_tokenizer(str(tmp_path), "--tokenizer")
    with pytest.raises(ModelConfigError, match="--hf-checkpoint .*no tokenizer there"):
        load_tokenizer(str(tmp_path / "nothing"), "--hf-checkpoint")


# ------------------------------------------------------------------------------------- reward


def test_reward_mistakes_are_one_line(tiny, tmp_path, capfd):
    from megatron_dapo.errors import user_error_types
    from megatron_dapo.reward.api import RewardConfigError, compute_score

    assert RewardConfigError in user_error_types()
    with pytest.raises(RewardConfigError, match="reward mode"):
        compute_score("Answer: 1", "1", mode="sympy")
    one_line(
        _train(capfd, _args(tiny, tmp_path, "--reward-fn", "no_such_module:score")), "--reward-fn", "no_such_module"
    )
    one_line(_train(capfd, _args(tiny, tmp_path, "--reward-source", "tiny")), "--reward-source", "DATA_SOURCE=SPEC")
    one_line(
        _train(capfd, _args(tiny, tmp_path, "--reward-source", "tiny=tests.e2e.fixtures:no_such_fn")),
        "--reward-source",
        "no_such_fn",
    )
    one_line(_train(capfd, _args(tiny, tmp_path, "--reward-timeout", "0")), "--reward-timeout", "> 0")


# ----------------------------------------------------------------------------------- diagnose


def test_diagnose_refuses_a_metrics_file_without_metrics(tmp_path, capfd):
    from megatron_dapo.diagnostics.cli import main

    cases = {
        "empty": ("", "no metrics in it"),
        "garbage": ("not json\n\x00\x01\n[1, 2]\n", "3 line(s) that are not JSON objects"),
        "other": ('{"loss": 1}\n{"loss": 2}\n', "none of the 4 boundaries"),
    }
    for name, (text, needle) in cases.items():
        path = tmp_path / f"{name}.jsonl"
        path.write_text(text)
        capfd.readouterr()
        assert main([str(path), "--fail-on-alert", "--no-plot"]) == 2, name  # was 0: a CI gate that passed
        one_line(capfd.readouterr().err, f"{name}.jsonl", needle)
    bad = tmp_path / "th.yaml"
    bad.write_text("a: [\n")
    capfd.readouterr()
    assert main([str(tmp_path / "other.jsonl"), "--thresholds", str(bad)]) == 2
    one_line(capfd.readouterr().err, "--thresholds", "th.yaml")
    err = _exits_2(capfd, main, [str(tmp_path / "other.jsonl"), "--fail-on-alrt"])
    one_line(err, "--fail-on-alert")


# --------------------------------------------------------------------------------------- eval


def test_eval_mistakes_are_one_line_before_the_model_loads(tiny, tmp_path, capfd, monkeypatch):
    from megatron_dapo.data import DataError

    tool = _tool("eval")
    hf, prompts = tiny
    monkeypatch.chdir(tmp_path)  # the default --out (runs/eval/...) is relative: never inside the repository
    common = ["--engine", "hf", "--k", "1", "--no-progress", "--reward-workers", "1"]
    one_line(_exits_2(capfd, tool.main, ["--model", hf, "--data", str(tmp_path / "typo.jsonl"), *common]), "typo.jsonl")
    weightless = tmp_path / "weightless"
    weightless.mkdir()
    (weightless / "config.json").write_text(json.dumps(tiny_qwen2_config()))
    one_line(
        _exits_2(capfd, tool.main, ["--model", str(weightless), "--data", prompts, *common]),
        "--model",
        "weightless",
        "no weights",
    )
    (tmp_path / "a-file").write_text("x")
    one_line(
        _exits_2(
            capfd, tool.main, ["--model", hf, "--data", prompts, "--out", str(tmp_path / "a-file" / "out"), *common]
        ),
        "--out",
        "a-file/out",
    )
    one_line(
        _exits_2(capfd, tool.main, ["--model", hf, "--data", prompts, "--tokenizer", str(weightless), *common]),
        "--tokenizer",
        "weightless",
    )
    one_line(_exits_2(capfd, tool.main, ["--model", hf, "--data", prompts, "--k", "0"]), "--k")
    monkeypatch.setenv(DEBUG_ENV, "1")
    with pytest.raises(DataError, match="typo.jsonl"):  # the traceback, for a bug report
        tool.main(["--model", hf, "--data", str(tmp_path / "typo.jsonl"), *common])
    assert not (tmp_path / "runs").exists()  # a refused evaluation creates no output directory


# ------------------------------------------------------------------------------------- sbatch


def test_sbatch_mistakes_are_one_line(tmp_path):
    sbatch = os.path.join(ROOT, "examples", "slurm", "submit_dapo.sbatch")
    base = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k not in ("RAY_ADDRESS", "DRY_RUN")}
    cases = [
        ({}, ("not under Slurm", "sbatch")),
        ({"DRY_RUN": "1", "GPUS_PER_NODE": "eight"}, ("GPUS_PER_NODE", "eight")),
        ({"DRY_RUN": "1", "DRIVER_SCRIPT": str(tmp_path / "nope.sh")}, ("DRIVER_SCRIPT", "nope.sh")),
        ({"DRY_RUN": "1", "PYTHON": str(tmp_path / "no-python")}, ("PYTHON", "no-python")),
        ({"DRY_RUN": "1", "NODELIST": ","}, ("no nodes", "NODELIST")),
        ({"SLURM_JOB_ID": "7", "PATH": "/usr/bin:/bin"}, ("scontrol", "SLURM_JOB_ID")),
    ]
    for extra, needles in cases:
        p = run_in_session(["bash", sbatch], 120, env={**base, **extra}, cwd=ROOT)
        assert p.returncode == 2, (extra, p.stdout[-2000:], p.stderr[-2000:])
        one_line(p.stderr, "submit_dapo:", *needles)
        assert "would run" not in p.stdout  # refused before anything is planned or started


def test_a_worker_killed_by_rays_memory_monitor_is_one_line_naming_the_memory(capsys):
    """What the CPU demo met when other jobs filled the node: Ray's OutOfMemoryError (a 90-line
    traceback) becomes one stopping line with the node's memory, what to lower and how to go on."""
    import ray.exceptions

    from megatron_dapo.errors import EXIT_USER_ERROR, out_of_memory_stop, report_user_error

    oom = ray.exceptions.OutOfMemoryError(
        "1 worker(s) were killed due to the node running low on memory. Memory on the node (IP: 192.0.2.2, "
        "ID: 96f5) was 22.37GB used / 23.54GB limit (0.950409)\nOOM kill reason: Memory usage 24029134848B"
    )
    assert report_user_error("megatron_dapo.train", out_of_memory_stop(oom) or oom) == EXIT_USER_ERROR
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "the node ran out of memory (22.37GB used of 23.54GB) and Ray killed a worker" in err
    assert "--micro-batch-size" in err and "--load" in err
    assert out_of_memory_stop(MemoryError("x")) is None  # only Ray's monitor, matched by its class
