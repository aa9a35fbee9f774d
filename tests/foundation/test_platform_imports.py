"""megatron_dapo/platform_imports.py: importing megatron-core after ``import megatron_dapo`` leaves
its torch.compile decorators uncompiled (no dynamo, no inductor) until a decorated function runs,
and a decorated function computes what the undecorated one does."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROBE = """
import json, sys
import megatron_dapo
import torch
real = torch.compile
import megatron.core, megatron.core.models.gpt, megatron.core.optimizer, megatron.core.dist_checkpointing
from megatron.core import jit
from megatron.core.fusions import fused_bias_swiglu
import inspect
print(json.dumps({
    "inductor": "torch._inductor.compile_fx" in sys.modules,
    "dynamo": "torch._dynamo" in sys.modules,
    "compile_restored": torch.compile is real,
    "jit_fuser": jit.jit_fuser.__name__,
    "swiglu_lazy": hasattr(fused_bias_swiglu.swiglu, "lazy_compile_of"),
    "source": "def swiglu" in inspect.getsource(fused_bias_swiglu.swiglu),
    "wandb_usable": callable(__import__("wandb").init),  # loaded lazily (0.19) or at once: usable
}))
"""


def _probe(**env):
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, **env}
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_megatron_core_imports_without_dynamo_and_torch_compile_is_put_back():
    got = _probe(MEGATRON_DAPO_EAGER_JIT="0")
    assert got == {
        "inductor": False,
        "dynamo": False,
        "compile_restored": True,
        "jit_fuser": "lazy_compile",
        "swiglu_lazy": True,
        "source": True,
        "wandb_usable": True,
    }, got


def test_without_the_hook_megatron_core_imports_inductor():
    """What the hook saves (about 3.5 s of CPU per process): megatron-core's own import path."""
    got = _probe(MEGATRON_DAPO_EAGER_JIT="1")
    assert got["inductor"] and got["jit_fuser"] == "compile" and not got["swiglu_lazy"], got


def test_a_lazily_compiled_function_computes_what_it_wraps():
    from megatron_dapo.platform_imports import lazy_compile

    def f(x, y):
        return torch.nn.functional.silu(x) * y

    g = lazy_compile(f, backend="eager")
    h = lazy_compile(backend="eager")(f)  # the decorator form, @torch.compile(...)
    x, y = torch.randn(3, 5), torch.randn(3, 5)
    assert g.lazy_compile_of is f and g.__name__ == "f"
    torch.testing.assert_close(g(x, y), f(x, y), rtol=0, atol=0)  # same ops, same order
    torch.testing.assert_close(h(x, y), f(x, y), rtol=0, atol=0)
    mod = torch.nn.Linear(2, 2)
    assert not hasattr(lazy_compile(mod, backend="eager"), "lazy_compile_of")  # a module: compiled at once


SENDER = """
import pickle, sys
import megatron_dapo
import megatron.core
import torch
sys.stdout.buffer.write(pickle.dumps({"rng": torch.get_rng_state(), "w": torch.arange(6.0).reshape(2, 3)}))
"""

RECEIVER = """
import json, pickle, sys
d = pickle.loads(sys.stdin.buffer.read())
print(json.dumps({"megatron_core": "megatron.core" in sys.modules, "w": d["w"].tolist(), "rng": len(d["rng"])}))
"""


def test_a_tensor_pickled_after_megatron_core_unpickles_without_it():
    """megatron-core 0.19 names its own ``safe_load_from_bytes`` in every pickled tensor (it replaces
    ``torch.storage._load_from_bytes``), so the receiver of a trainer rank's tensor imported all of
    megatron-core; with the hook it names ``megatron_dapo.platform_imports.load_storage_bytes`` (on
    0.16.1, torch's own)."""
    env = {**os.environ, "MEGATRON_DAPO_EAGER_JIT": "0"}
    sent = subprocess.run([sys.executable, "-c", SENDER], cwd=ROOT, capture_output=True, timeout=300, env=env)
    assert sent.returncode == 0, sent.stderr.decode()[-3000:]
    assert b"megatron.core" not in sent.stdout
    got = subprocess.run(
        [sys.executable, "-c", RECEIVER], cwd=ROOT, input=sent.stdout, capture_output=True, timeout=300, env=env
    )
    assert got.returncode == 0, got.stderr.decode()[-3000:]
    out = json.loads(got.stdout.decode().strip().splitlines()[-1])
    assert out == {"megatron_core": False, "w": [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], "rng": len(torch.get_rng_state())}


def test_the_storage_loader_keeps_weights_only():
    """What megatron-core's replacement is for: a storage's bytes that name any other global are
    refused, not run."""
    import pickle

    import pytest

    from megatron_dapo.platform_imports import load_storage_bytes

    class Evil:
        def __reduce__(self):
            return (os.getcwd, ())

    with pytest.raises(pickle.UnpicklingError):
        load_storage_bytes(pickle.dumps(Evil(), protocol=2))
    t = torch.arange(4.0)
    import io

    buf = io.BytesIO()
    torch.save(t.untyped_storage(), buf)
    assert torch.equal(torch.frombuffer(bytearray(load_storage_bytes(buf.getvalue())), dtype=torch.float32), t)
