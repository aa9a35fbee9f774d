"""The dry run as a validator (launch/preflight.py; the checks in preflight_inputs.py and
preflight_checkpoints.py): each check with a real failing input and a passing one, the driver's
dry run with several mistakes at once, the real run's checks before Ray, and run_qwen32b.sh never
substituting a path the user gave.

Real inputs: the Qwen2 tokenizer and the DAPO-Math / AIME files of tests/data, a tiny HF model
converted to torch_dist by tools/convert_hf_to_megatron.py; broken files are made from them in
tmp dirs. No Ray, no model weights beyond the tiny one.
"""

import json
import os
import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest

from megatron_dapo.config import parse_args
from megatron_dapo.launch.preflight_checkpoints import check_disk, check_hf_checkpoint, check_load, check_torch_dist
from megatron_dapo.launch.preflight_inputs import check_eval_data, check_prompt_data, check_reward, load_tokenizer
from megatron_dapo.launch.preflight_result import FAIL, OK, SHAPE_ONLY_FILE, WARN
from megatron_dapo.models.hf_config import parse_hf_config
from tests.data import DATA, qwen2_tokenizer_dir
from tests.launch.procs import run_in_session
from tests.tiny import tiny_qwen2_config

ROOT = Path(__file__).resolve().parents[2]
DAPO = str(DATA / "train" / "dapo-math-17k-head16.parquet")
AIME = str(DATA / "eval" / "aime-2024.parquet")
QWEN25_32B = ROOT / "examples" / "qwen2.5-32b" / "config.json"


@pytest.fixture(scope="module")
def tok_dir():
    return qwen2_tokenizer_dir()


@pytest.fixture(scope="module")
def tok(tok_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tok_dir)


def _config_dir(path, marker=False, **over) -> str:
    """An HF directory holding only config.json (a Qwen2 shape; ``over`` changes it)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    base = json.loads(QWEN25_32B.read_text()) if over.pop("qwen32b", False) else tiny_qwen2_config()
    (path / "config.json").write_text(json.dumps({**base, **over}))
    if marker:
        (path / SHAPE_ONLY_FILE).write_text("shape only\n")
    return str(path)


def _cfg(hf, *extra):
    return parse_args(["--hf-checkpoint", hf, "--wandb-mode", "disabled", *extra])


def _one(checks, name):
    (c,) = [c for c in checks if c.name == name]
    return c


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A tiny Qwen2 (HF, with weights) and its torch_dist conversion by the real converter."""
    from tests.tiny import random_hf_model

    d = tmp_path_factory.mktemp("ckpt")
    hf = d / "hf"
    random_hf_model(tiny_qwen2_config(num_hidden_layers=2)).save_pretrained(hf, safe_serialization=True)
    td = d / "torch_dist"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    p = run_in_session(
        [
            sys.executable,
            str(ROOT / "tools" / "convert_hf_to_megatron.py"),
            "--hf-checkpoint",
            str(hf),
            "--save",
            str(td),
            "--dtype",
            "fp32",
        ],
        300,
        env=env,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return str(hf), str(td)


# ----------------------------------------------------------------------------- tokenizer


def test_a_tokenizer_larger_than_the_vocabulary_fails_naming_both(tmp_path, tok_dir, tok):
    import torch

    small = _config_dir(tmp_path / "small", vocab_size=151000, eos_token_id=151643)
    cfg = _cfg(small, "--tokenizer", tok_dir)
    c, got = load_tokenizer(cfg, parse_hf_config(small), dry_run=True)
    assert c.status == FAIL and got is None, c.line
    # the real Qwen2 vocabulary: 151,643 BPE tokens, then <|endoftext|>, <|im_start|>, <|im_end|>
    assert "--tokenizer has 151,936 tokens" in c.detail and "vocab_size is 151,000" in c.detail, c.line
    assert "643 ordinary and 3 special token ids >= 151,000" in c.detail and f"--hf-checkpoint {small}" in c.detail
    assert c.line.startswith(f"[check] FAIL tokenizer {tok_dir}: ")
    # what the check prevents: a chat-templated real prompt holds <|im_start|> = 151644, past a 151000-row table
    ids = tok(tok.apply_chat_template([{"role": "user", "content": "1+1?"}], tokenize=False), add_special_tokens=False)
    with pytest.raises(IndexError):
        torch.nn.functional.embedding(torch.tensor(ids["input_ids"]), torch.zeros(151000, 4))

    ok = _config_dir(tmp_path / "ok", qwen32b=True)  # Qwen2.5-32B: vocab_size 152064
    c, got = load_tokenizer(_cfg(ok, "--tokenizer", tok_dir), parse_hf_config(ok), dry_run=True)
    assert c.status == OK and got is not None, c.line
    assert "151,936 tokens <= vocab_size 152,064" in c.detail and "eos '<|endoftext|>' 151643 (a stop token" in c.detail


def test_filler_tokens_past_the_vocabulary_warn_and_a_foreign_eos_fails(tmp_path, tok_dir):
    # the e2e tiny model's vocabulary (151680) stops inside the tokenizer's [PAD...] fillers
    fill = _config_dir(tmp_path / "fill", vocab_size=151680, eos_token_id=151643)
    c, got = load_tokenizer(_cfg(fill, "--tokenizer", tok_dir), parse_hf_config(fill), dry_run=True)
    assert c.status == WARN and got is not None, c.line
    assert "256 plain added tokens have ids >= vocab_size 151,680" in c.detail and "[PAD151680]" in c.detail
    foreign = _config_dir(tmp_path / "foreign", qwen32b=True, eos_token_id=200000)
    c, _ = load_tokenizer(_cfg(foreign, "--tokenizer", tok_dir), parse_hf_config(foreign), dry_run=True)
    assert c.status == FAIL and "eos_token_id 200000" in c.detail and "outside the model vocabulary" in c.detail


def test_a_missing_or_empty_tokenizer_directory_fails_and_a_shape_only_model_warns_in_the_dry_run(tmp_path):
    hf = _config_dir(tmp_path / "hf", qwen32b=True)
    arch = parse_hf_config(hf)
    c, _ = load_tokenizer(_cfg(hf, "--tokenizer", str(tmp_path / "typo")), arch, dry_run=True)
    assert c.status == FAIL and "not found (--tokenizer)" in c.detail, c.line
    c, _ = load_tokenizer(_cfg(hf), arch, dry_run=True)  # config.json only: no tokenizer there
    assert c.status == FAIL and "no tokenizer files" in c.detail and "--tokenizer DIR" in c.detail, c.line
    (Path(hf) / "tokenizer_config.json").write_text("{}")  # transformers builds an empty Qwen2 tokenizer from it
    c, _ = load_tokenizer(_cfg(hf), arch, dry_run=True)
    assert c.status == FAIL and "a tokenizer without a vocabulary" in c.detail, c.line
    marked = _config_dir(tmp_path / "marked", marker=True, qwen32b=True)
    c, _ = load_tokenizer(_cfg(marked), arch, dry_run=True)
    assert c.status == WARN and "a model shape only" in c.detail, c.line
    c, _ = load_tokenizer(_cfg(marked), arch, dry_run=False)  # the real run needs the tokenizer
    assert c.status == FAIL, c.line


# ----------------------------------------------------------------------------- data


def test_prompt_data_counts_the_prompts_within_the_length_filter(tok):
    from megatron_dapo.data import read_rows

    # the count, by hand: render each real prompt with the chat template and tokenize it
    lengths = [
        len(
            tok(
                tok.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True),
                add_special_tokens=False,
            )["input_ids"]
        )
        for r in read_rows(DAPO)
    ]
    limit = sorted(lengths)[len(lengths) // 2]  # about half of them fit
    within = sum(n <= limit for n in lengths)
    assert 0 < within < 16
    cfg = _cfg("unused", "--prompt-data", DAPO, "--max-prompt-length", str(limit), "--rollout-batch-size", "4")
    c, ds = check_prompt_data(cfg, tok, None)
    assert c.status == OK and len(ds) == within, c.line
    assert c.line.startswith(
        f"[check] prompt-data {DAPO}: parquet, 16 rows, columns ok, {within} prompts within "
        f"--max-prompt-length {limit} (longest {max(n for n in lengths if n <= limit)} tokens; "
        f"0 duplicates removed, {16 - within} too long skipped"
    ), c.line
    cfg = _cfg("unused", "--prompt-data", DAPO, "--max-prompt-length", "5")
    c, _ = check_prompt_data(cfg, tok, None)
    assert c.status == FAIL and "16 prompt(s) are longer than --max-prompt-length 5" in c.detail, c.line
    assert "--prompt-overflow truncate-left" in c.detail


def _broken(tmp_path) -> dict:
    import pyarrow as pa
    import pyarrow.parquet as pq

    good = Path(DAPO).read_bytes()
    out = {
        "empty": tmp_path / "empty.parquet",
        "truncated": tmp_path / "truncated.parquet",
        "csv": tmp_path / "renamed-csv.parquet",
        "columns": tmp_path / "columns.parquet",
    }
    out["empty"].write_bytes(b"")
    out["truncated"].write_bytes(good[: len(good) * 2 // 3])
    out["csv"].write_text("prompt,answer\nWhat is 1+1?,2\n")
    pq.write_table(pa.table({"question": ["What is 1+1?"], "answer": ["2"]}), out["columns"])
    return {k: str(v) for k, v in out.items()}


def test_broken_prompt_and_eval_files_fail_naming_the_file_and_the_fix(tmp_path, tok):
    why = {
        "empty": "the file is empty (0 bytes)",
        "truncated": "not a parquet file, or truncated",
        "csv": "not a parquet file, or truncated",
        "columns": "no 'prompt' column (columns: answer, question)",
    }
    for kind, path in _broken(tmp_path).items():
        c, _ = check_prompt_data(_cfg("unused", "--prompt-data", path), tok, None)
        assert c.status == FAIL and c.line.startswith(f"[check] FAIL prompt-data {path}: --prompt-data: "), c.line
        assert why[kind] in c.detail and "\n" not in c.line, c.line
        if kind != "columns":
            assert "re-download or re-export it" in c.detail
            c, _ = check_eval_data(_cfg("unused", "--eval-interval", "5"), path, None)
            assert c.status == FAIL and c.line.startswith(f"[check] FAIL eval-data {path}: --eval-data: "), c.line
    c, _ = check_eval_data(_cfg("unused"), str(tmp_path / "typo.parquet"), None)
    assert c.status == FAIL and "file not found" in c.detail


def test_eval_data_is_read_as_the_evaluator_reads_it():
    c, problems = check_eval_data(_cfg("unused", "--eval-interval", "10"), AIME, None)
    assert c.status == OK and len(problems) == 30, c.line
    assert c.detail == "parquet, 960 rows, 30 problems (32 copies each); evaluated every 10 steps"
    c, _ = check_eval_data(_cfg("unused"), AIME, None)
    assert c.status == WARN and "never evaluated during training: --eval-interval is 0" in c.detail


# ----------------------------------------------------------------------------- reward


def test_reward_sources_are_checked_and_mapped_to_the_data_sources(tmp_path):
    for entry, why in (
        ("aime", "must look like DATA_SOURCE=SPEC"),
        ("aime=no_such_module_for_preflight:score", "cannot import module 'no_such_module_for_preflight'"),
        ("aime=http://", "remote reward model URL must look like"),
    ):
        c = check_reward(_cfg("unused", "--reward-source", entry))
        assert c.status == FAIL and f"--reward-source {entry}: " in c.detail and why in c.detail, c.line
    c = check_reward(_cfg("unused", "--reward-fn", "no_such_module_for_preflight:score"))
    assert c.status == FAIL and "--reward-fn no_such_module_for_preflight:score" in c.detail, c.line

    # the real files' sources: DAPO-Math rows and AIME problems
    from megatron_dapo.data import read_rows

    sources = Counter(r["data_source"] for r in read_rows(AIME)[:1] + read_rows(DAPO))
    (aime_source,) = {r["data_source"] for r in read_rows(AIME)}
    c = check_reward(_cfg("unused", "--reward-source", f"{aime_source}=math"), sources)
    assert c.status == OK, c.line
    assert f"data source {aime_source!r} (1 prompts) -> math (--reward-source)" in c.detail
    assert "default dapo (--reward-mode)" in c.detail
    c = check_reward(_cfg("unused", "--reward-source", f"{aime_source}x=math"), sources)  # a typo
    assert c.status == WARN and f"{aime_source + 'x'!r} that no row of the data has" in c.detail, c.line


# ----------------------------------------------------------------------------- checkpoints


def test_hf_weights_are_required_where_they_are_the_initial_weights(tmp_path, converted):
    hf, td = converted
    arch = parse_hf_config(hf)
    c = check_hf_checkpoint(_cfg(hf), arch, dry_run=True)
    assert c.status == OK and "initial weights: 1 safetensors file(s)" in c.detail, c.line
    bare = _config_dir(tmp_path / "bare", num_hidden_layers=2)
    c = check_hf_checkpoint(_cfg(bare), arch, dry_run=True)
    assert c.status == FAIL and "no model.safetensors or model.safetensors.index.json" in c.detail, c.line
    c = check_hf_checkpoint(_cfg(bare, "--pretrained-checkpoint", td), arch, dry_run=False)
    assert c.status == OK and "come from --pretrained-checkpoint" in c.detail, c.line
    (Path(bare) / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}})
    )
    c = check_hf_checkpoint(_cfg(bare), arch, dry_run=True)
    assert c.status == FAIL and "names 1 missing shard file(s) (model-00001-of-00002.safetensors)" in c.detail
    marked = _config_dir(tmp_path / "marked", marker=True, num_hidden_layers=2)
    assert check_hf_checkpoint(_cfg(marked), arch, dry_run=True).status == WARN
    assert check_hf_checkpoint(_cfg(marked), arch, dry_run=False).status == FAIL


def test_torch_dist_paths_are_checked_against_the_model(tmp_path, converted):
    hf, td = converted
    arch = parse_hf_config(hf)
    c = check_torch_dist(_cfg(hf), arch, "--pretrained-checkpoint", td)
    assert c.status == OK, c.line
    assert (
        c.detail.startswith("torch_dist, fp32, saved at TP 1 x PP 1") and "architecture matches the model" in c.detail
    )
    c = check_torch_dist(_cfg(hf), arch, "--pretrained-checkpoint", str(tmp_path / "typo"))
    assert c.status == FAIL and c.line.startswith(
        f"[check] FAIL pretrained-checkpoint {tmp_path / 'typo'}: --pretrained-checkpoint: not found"
    ), c.line
    c = check_torch_dist(_cfg(hf), arch, "--ref-load", hf)  # the HF directory instead of its conversion
    assert c.status == FAIL and "convert it with tools/convert_hf_to_megatron.py" in c.detail, c.line
    other = _config_dir(tmp_path / "three", num_hidden_layers=3)
    c = check_torch_dist(_cfg(other), parse_hf_config(other), "--pretrained-checkpoint", td)
    assert c.status == FAIL and "num_layers (HF num_hidden_layers): the checkpoint has 2, model has 3" in c.detail
    partial = tmp_path / "partial"
    shutil.copytree(td, partial, ignore=shutil.ignore_patterns("*.distcp"))  # a copy that stopped early
    c = check_torch_dist(_cfg(hf), arch, "--pretrained-checkpoint", str(partial))
    assert c.status == FAIL and "incomplete" in c.detail and ".distcp" in c.detail, c.line
    c = check_torch_dist(_cfg(hf), arch, "--ref-load", td)
    assert c.status == WARN and "unused: --kl-coef is 0" in c.detail


def test_load_reports_its_layout_and_refuses_changed_data(tmp_path, converted, tok):
    import torch

    from megatron_dapo.checkpoint import dist_ckpt, manifest

    hf, td = converted
    arch = parse_hf_config(hf)
    save = tmp_path / "save"
    shutil.copytree(td, save / "step_000003")
    _, ds = check_prompt_data(_cfg(hf, "--prompt-data", DAPO, "--rollout-batch-size", "4"), tok, None)
    torch.save({"step": 3, "data_fingerprint": ds.fingerprint}, save / "step_000003" / "trainer_state.pt")
    (save / "latest").write_text("step_000003\n")

    c = check_load(_cfg(hf, "--load", str(save), "--prompt-data", DAPO), arch, ds)
    assert (
        c.status == OK
        and "step_000003: torch_dist, architecture matches the model, saved at TP 1 x PP 1" in c.detail
        and "same layout" in c.detail
        and "step 3, the same prompt data" in c.detail
    ), c.line
    wider = _cfg(
        hf,
        "--load",
        str(save),
        "--actor-num-gpus-per-node",
        "2",
        "--tensor-model-parallel-size",
        "2",
        "--rollout-num-gpus-per-engine",
        "2",
    )
    c = check_load(wider, arch)
    if hasattr(dist_ckpt, "resume_note"):  # the checkpoint module's verdict on the layout change
        assert c.status == OK and "saved at TP 1 x PP 1" in c.detail and "same layout" not in c.detail, c.line
    else:
        assert c.status == WARN and "resumed at TP 2 x PP 1 x CP 1 x DP 1 (world 2, 1 node)" in c.detail, c.line

    torch.save({"step": 3, "data_fingerprint": "0123456789abcdef"}, save / "step_000003" / "trainer_state.pt")
    c = check_load(_cfg(hf, "--load", str(save), "--prompt-data", DAPO), arch, ds)
    assert c.status == FAIL and "the dataset changed since the checkpoint" in c.detail, c.line
    assert "--allow-data-change" in c.detail
    c = check_load(_cfg(hf, "--load", str(tmp_path)), arch)
    assert c.status == FAIL and "no checkpoint found" in c.detail

    meta_file = save / "step_000003" / dist_ckpt.METADATA_FILE
    meta = json.loads(meta_file.read_text())
    if hasattr(dist_ckpt, "resume_note") and meta.get("layout"):
        # what a trainer saved with --use-distributed-optimizer records; resumed without it: refused by the verdict
        meta["layout"]["distributed_optimizer"] = True
        meta_file.write_text(json.dumps(meta))
        manifest.write_manifest(str(save / "step_000003"))  # as a save with that metadata would record it
        c = check_load(_cfg(hf, "--load", str(save)), arch)
        assert c.status == FAIL and "cannot resume at this layout" in c.detail, c.line


# ----------------------------------------------------------------------------- disk


def _layers_for(tmp_path, target_bytes: float, bf16: bool) -> int:
    """Layers of a Qwen2.5-32B-wide model whose checkpoint is about ``target_bytes``."""
    one = parse_hf_config(_config_dir(tmp_path / "l1", qwen32b=True, num_hidden_layers=1)).num_parameters
    two = parse_hf_config(_config_dir(tmp_path / "l2", qwen32b=True, num_hidden_layers=2)).num_parameters
    per_param = 14 if bf16 else 12
    return max(1, round((target_bytes / per_param - one) / (two - one)) + 1)


def test_disk_space_for_a_checkpoint(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    tiny = _config_dir(tmp_path / "tiny")
    (c,) = check_disk(_cfg(tiny, "--save", str(tmp_path / "save")), parse_hf_config(tiny))
    assert c.status == OK and "one checkpoint ~" in c.detail and " MB (" in c.detail, c.line

    # more than the filesystem holds: a known filesystem (--save's parent exists) fails, an unknown one warns
    huge = _config_dir(tmp_path / "huge", qwen32b=True, num_hidden_layers=_layers_for(tmp_path, 3 * free, True))
    arch = parse_hf_config(huge)
    (c,) = check_disk(_cfg(huge, "--bf16", "--save", str(tmp_path / "save")), arch)
    assert c.status == FAIL and "the first save cannot fit" in c.detail, c.line
    assert "bf16 weights 2 + fp32 main params 4 + Adam m, v 8" in c.detail and c.detail.startswith("--save: ")
    (c,) = check_disk(_cfg(huge, "--bf16", "--save", str(tmp_path / "not" / "mounted" / "save")), arch)
    assert c.status == WARN and "(--save and its parent do not exist yet)" in c.detail, c.line

    # one fits, --keep-last 2 + 1 do not: a warning
    mid = _config_dir(tmp_path / "mid", qwen32b=True, num_hidden_layers=_layers_for(tmp_path, 0.6 * free, False))
    (c,) = check_disk(_cfg(mid, "--save", str(tmp_path / "save"), "--keep-last", "2"), parse_hf_config(mid))
    assert c.status == WARN and "do not fit; lower --keep-last" in c.detail, c.line

    # HF exports are never rotated: a warning when they add up past the free space
    checks = check_disk(
        _cfg(huge, "--bf16", "--run-dir", str(tmp_path / "run"), "--save-hf-interval", "10", "--num-rollout", "30"),
        arch,
    )
    (c,) = checks
    assert c.status == WARN and "3 HF export(s)" in c.detail and "they do not all fit" in c.detail, c.line


# ----------------------------------------------------------------------------- the driver


def _train(*args, timeout=300):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.pop("MEGATRON_DAPO_DEBUG", None)
    return run_in_session(
        [sys.executable, "-m", "megatron_dapo.train", "--wandb-mode", "disabled", *args], timeout, env=env, cwd=ROOT
    )


def test_the_dry_run_reports_every_mistake_then_exits_2_with_one_line(tmp_path, tok_dir, converted):
    hf, td = converted
    small = _config_dir(tmp_path / "small", qwen32b=True, vocab_size=151000)  # the tokenizer does not fit
    broken = _broken(tmp_path)
    (tmp_path / "file").write_text("x")
    p = _train(
        "--dry-run",
        "--hf-checkpoint",
        small,
        "--tokenizer",
        tok_dir,
        "--pretrained-checkpoint",
        td,
        "--prompt-data",
        broken["columns"],
        "--eval-data",
        broken["truncated"],
        "--eval-interval",
        "5",
        "--ref-load",
        hf,
        "--kl-coef",
        "0.01",
        "--run-dir",
        str(tmp_path / "run"),
        "--save",
        str(tmp_path / "file" / "save"),
        "--rollout-batch-size",
        "4",
        "--global-batch-size",
        "64",
    )
    out, err = p.stdout, p.stderr
    assert p.returncode == 2 and "Traceback" not in out + err, err[-3000:]
    assert len(err.strip().splitlines()) == 1, err
    assert "error: dry run: 6 of 9 checks failed ([check] FAIL lines above)" in err, err
    fails = [x for x in out.splitlines() if x.startswith("[check] FAIL ")]
    for needle in (
        f"[check] FAIL tokenizer {tok_dir}: --tokenizer has 151,936 tokens",
        f"[check] FAIL pretrained-checkpoint {td}: --pretrained-checkpoint: the checkpoint does not match",
        f"[check] FAIL prompt-data {broken['columns']}: --prompt-data: no 'prompt' column",
        f"[check] FAIL eval-data {broken['truncated']}: --eval-data: cannot be read as parquet",
        f"[check] FAIL ref-load {hf}: --ref-load: not a megatron-dapo torch_dist checkpoint",
        "[check] FAIL outputs: --save ",
    ):
        assert any(x.startswith(needle) for x in fails), (needle, fails)
    assert len(fails) == 6 and "--- placement" in out  # the plan is printed too


@pytest.fixture(scope="module")
def qwen2_tiny(tmp_path_factory, tok):
    """A tiny Qwen2 with weights, the Qwen2 tokenizer and a vocabulary that holds all of it (151,936)."""
    from tests.tiny import random_hf_model

    d = tmp_path_factory.mktemp("qwen2-tiny") / "hf"
    cfg = tiny_qwen2_config(
        vocab_size=151936,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        eos_token_id=151643,
        bos_token_id=151643,
        max_position_embeddings=32768,
    )
    random_hf_model(cfg).save_pretrained(d, safe_serialization=True)
    tok.save_pretrained(d)
    return str(d)


def test_a_clean_dry_run_prints_one_line_per_check_and_exits_0(tmp_path, qwen2_tiny):
    p = _train(
        "--dry-run",
        "--hf-checkpoint",
        qwen2_tiny,
        "--prompt-data",
        DAPO,
        "--eval-data",
        AIME,
        "--eval-interval",
        "5",
        "--reward-source",
        "math_dapo=math",
        "--run-dir",
        str(tmp_path / "run"),
        "--save",
        str(tmp_path / "save"),
        "--rollout-batch-size",
        "4",
        "--global-batch-size",
        "64",
    )
    assert p.returncode == 0 and "Traceback" not in p.stderr, (p.stdout + p.stderr)[-3000:]
    lines = [x for x in p.stdout.splitlines() if x.startswith("[check] ")]
    assert [x.split()[1].rstrip(":") for x in lines] == [
        "tokenizer",
        "hf-checkpoint",
        "prompt-data",
        "eval-data",
        "reward",
        "disk",
        "outputs",
    ], lines
    assert "--- 7 checks: 7 ok, 0 warnings, 0 failed" in p.stdout
    assert (
        f"[check] prompt-data {DAPO}: parquet, 16 rows, columns ok, 16 prompts within --max-prompt-length 2048"
        in p.stdout
    )
    assert "data source 'math_dapo' (30 prompts) -> math (--reward-source)" in p.stdout
    assert f"[outputs] --run-dir {tmp_path / 'run'}: new" in p.stdout
    assert not (tmp_path / "run").exists() and not (tmp_path / "save").exists()  # a dry run writes nothing


def test_the_real_run_stops_before_ray_on_what_would_fail_inside_it(tmp_path, tok_dir):
    small = _config_dir(tmp_path / "small", qwen32b=True, vocab_size=151000)
    p = _train(
        "--hf-checkpoint",
        small,
        "--tokenizer",
        tok_dir,
        "--prompt-data",
        DAPO,
        "--eval-data",
        AIME,
        "--eval-interval",
        "5",
        "--run-dir",
        str(tmp_path / "run"),
        "--num-rollout",
        "1",
    )
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert len(p.stderr.strip().splitlines()) == 1 and "before launch: 2 of 4 checks failed" in p.stderr, p.stderr
    assert "tokenizer" in p.stderr and "no model.safetensors" in p.stderr
    assert "[check] eval-data" in p.stdout and "[init]" not in p.stdout and "[data]" not in p.stdout
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- run_qwen32b.sh

RUN = ROOT / "examples" / "run_qwen32b.sh"


def _script_env(tmp_path, **extra):
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SLURM_")
        and k not in ("RAY_ADDRESS", "DRY_RUN", "HF_CKPT", "PROMPT_DATA", "EVAL_DATA", "TOKENIZER")
    }
    # a --save whose filesystem is not mounted here (the 32B checkpoint would not fit this machine's disk)
    env.update(
        SAVE_DIR=str(tmp_path / "cluster" / "checkpoints" / "save"),
        RUN_DIR=str(tmp_path / "run"),
        SHARED_DATA=str(DATA),
        PYTHON=sys.executable,
        **extra,
    )
    return env


def test_run_qwen32b_never_substitutes_a_path_the_user_gave(tmp_path):
    typo = str(tmp_path / "dapo-math-17k.parquet")
    p = run_in_session(["bash", str(RUN), "--dry-run"], 300, env=_script_env(tmp_path, PROMPT_DATA=typo), cwd=ROOT)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert "PROMPT_DATA not set" not in p.stderr and "16-row sample" not in p.stderr
    assert f"--prompt-data {typo}" in p.stderr  # passed on as given
    errors = [x for x in p.stderr.splitlines() if not x.startswith("[run_qwen32b] ")]
    assert len(errors) == 1 and typo in errors[0] and "not found" in errors[0], p.stderr
    # a checkpoint path the user gave is not replaced by the public config either
    p = run_in_session(
        ["bash", str(RUN), "--dry-run"], 300, env=_script_env(tmp_path, HF_CKPT=str(tmp_path / "no")), cwd=ROOT
    )
    assert p.returncode == 2 and "public config" not in p.stderr and str(tmp_path / "no") in p.stderr.splitlines()[-1]


def test_run_qwen32b_substitutes_samples_only_for_unset_variables_and_says_so(tmp_path, tok_dir):
    p = run_in_session(["bash", str(RUN), "--dry-run"], 300, env=_script_env(tmp_path, TOKENIZER=tok_dir), cwd=ROOT)
    out, err = p.stdout, p.stderr
    assert p.returncode == 0, (out + err)[-3000:]
    sample = DATA / "train" / "dapo-math-17k-head16.parquet"
    assert (
        "[run_qwen32b] PROMPT_DATA not set and /data/dapo-math-17k.parquet not found: dry run with the 16-row "
        f"sample {sample}" in err
    )
    assert "HF_CKPT not set and /checkpoints/Qwen2.5-32B/config.json not found: dry run with the public config" in err
    assert "TOKENIZER not set" not in err and f"--tokenizer {tok_dir}" in err  # the user's tokenizer is kept
    assert f"[check] WARN prompt-data {sample}: parquet, 16 rows, columns ok, 16 prompts" in out  # 16 < 1536 a round
    assert "[check] tokenizer " in out and "tokens <= vocab_size 152,064" in out
    assert "[check] WARN hf-checkpoint " in out and "a model shape only (SHAPE_ONLY.md)" in out
    assert "(--save and its parent do not exist yet): a checkpoint would not fit there" in out or "[check] disk" in out


def test_the_driver_reuses_the_tokenizer_the_preflight_checked(tmp_path, qwen2_tiny, tok_dir):
    """The real run loads its tokenizer once (~1 s of CPU): the trainer takes the one the
    tokenizer check loaded, when it comes from the same directory; another --tokenizer is loaded."""
    from megatron_dapo.launch.preflight import check_before_launch
    from megatron_dapo.train import Trainer

    def trainer(*extra):
        cfg = parse_args(
            ["--hf-checkpoint", qwen2_tiny, "--prompt-data", DAPO, "--run-dir", str(tmp_path / "r"), *extra]
        )
        checks = check_before_launch(cfg, parse_hf_config(qwen2_tiny))
        return checks, Trainer(cfg, checks)

    checks, t = trainer()
    assert checks.tokenizer is not None and checks.tokenizer_dir == qwen2_tiny
    assert t.tokenizer is checks.tokenizer and len(t.dataset) == 16
    other = shutil.copytree(tok_dir, tmp_path / "tok")
    checks, t = trainer("--tokenizer", str(other))
    assert checks.tokenizer_dir == str(other) and t.tokenizer is checks.tokenizer
    _, fresh = trainer()
    checks.tokenizer_dir = "/elsewhere"  # a tokenizer from another directory is not taken
    assert Trainer(fresh.cfg, checks).tokenizer is not checks.tokenizer
