"""tools/eval.py builds its engine from the engine registry (rollout/engines.py: ENGINE_KINDS):
a kind registered with a ``standalone`` is an ``--engine`` choice, is built with the options
the command line gave, and brings its own default dtype and batch size; tools/eval.py names no
kind. (The real HF engine through main() is tests/eval/test_runner.py::test_tools_eval_main.)"""

from __future__ import annotations

import importlib.util
import inspect
from pathlib import Path

import pytest

from megatron_dapo.config import ConfigError
from megatron_dapo.rollout.engines import ENGINE_KINDS, EngineKind, Standalone, StandaloneOptions

ROOT = Path(__file__).resolve().parents[2]


def _load_eval_tool():
    spec = importlib.util.spec_from_file_location("_tools_eval_engines_under_test", ROOT / "tools" / "eval.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _never(*a, **k):
    raise AssertionError("a standalone engine uses neither the trainer's options, build nor codec")


@pytest.fixture
def registered():
    """Two test kinds, removed again: one that serves a checkpoint by itself, one that cannot."""
    built = []

    def build(model_dir, tokenizer, opts):
        built.append((model_dir, tokenizer, opts))
        return "engine-object"

    ENGINE_KINDS.register(
        "test-standalone",
        EngineKind(
            "tests.none:Engine",
            "A test engine kind (tools/eval.py test only).",
            _never,
            _never,
            _never,
            for_gpu=False,
            title="Test",
            standalone=Standalone(build, dtype="fp16", batch_size=7),
        ),
    )
    ENGINE_KINDS.register(
        "test-trainer-only",
        EngineKind("tests.none:Engine", "A test engine kind without a standalone form.", _never, _never, _never),
    )
    try:
        yield built
    finally:
        ENGINE_KINDS._items.pop("test-standalone")
        ENGINE_KINDS._items.pop("test-trainer-only")


def test_a_registered_kind_is_an_engine_choice_built_from_its_standalone(registered, capsys):
    ev = _load_eval_tool()
    args = ev.parse_args(
        [
            "--model",
            "/m",
            "--data",
            "/d",
            "--engine",
            "test-standalone",
            "--seed",
            "3",
            "--tp",
            "2",
            "--mem-fraction",
            "0.5",
        ]
    )
    assert ev.build_engine(args, "/model-dir", "tok") == ("test-standalone", "engine-object")
    assert registered == [("/model-dir", "tok", StandaloneOptions(dtype="fp16", seed=3, tp=2, mem_fraction=0.5))]
    assert ev.default_batch_size("test-standalone") == 7
    args = ev.parse_args(["--model", "/m", "--data", "/d", "--engine", "test-standalone", "--dtype", "bf16"])
    ev.build_engine(args, "/model-dir", None)
    assert registered[-1][2] == StandaloneOptions(dtype="bf16")
    with pytest.raises(SystemExit):
        ev.parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "test-standalone: A test engine kind;" in help_text
    assert "7 with test-standalone" in help_text and "fp16 for test-standalone" in help_text
    assert "test-trainer-only:" not in help_text  # listed as a choice, not described as an evaluator


def test_a_kind_without_standalone_is_refused_naming_the_flag(registered):
    ev = _load_eval_tool()
    args = ev.parse_args(["--model", "/m", "--data", "/d", "--engine", "test-trainer-only"])
    with pytest.raises(ConfigError, match="--engine test-trainer-only: .*cannot serve a checkpoint.*test-standalone"):
        ev.build_engine(args, "/model-dir", None)
    assert registered == []


def test_the_shipped_kinds_keep_their_evaluation_defaults():
    """hf: fp32, 32 samples per generate call; sglang: bf16, everything at once (as before the registry)."""
    ev = _load_eval_tool()
    assert (ENGINE_KINDS.get("hf").standalone.dtype, ev.default_batch_size("hf")) == ("fp32", 32)
    assert (ENGINE_KINDS.get("sglang").standalone.dtype, ev.default_batch_size("sglang")) == ("bf16", None)


def test_tools_eval_names_no_engine_kind():
    ev = _load_eval_tool()
    for fn in (ev.build_engine, ev.default_batch_size, ev._main):
        src = inspect.getsource(fn)
        for name in ENGINE_KINDS.names():
            assert f'"{name}"' not in src and f"'{name}'" not in src, f"{fn.__name__} names the kind {name!r}"


def test_the_sglang_standalone_gets_the_arguments_tools_eval_gave_it(monkeypatch):
    """On the CPU: the SGLang class replaced by a recorder (the arguments tools/eval.py passed before the registry)."""
    import megatron_dapo.rollout.sglang_engine as se

    calls = []
    monkeypatch.setattr(se, "SGLangEngine", lambda *a, **k: calls.append((a, k)) or "sglang-engine")
    ev = _load_eval_tool()
    args = ev.parse_args(
        ["--model", "/m", "--data", "/d", "--engine", "sglang", "--seed", "5", "--tp", "4", "--mem-fraction", "0.6"]
    )
    assert ev.build_engine(args, "/model-dir", "tok") == ("sglang", "sglang-engine")
    assert calls == [
        (
            ("/model-dir",),
            dict(
                tp_size=4,
                mem_fraction_static=0.6,
                enable_memory_saver=False,
                dtype="bfloat16",
                random_seed=5,
                load_format="auto",
            ),
        )
    ]
