"""megatron_dapo/platform_imports.py: importing megatron-core after ``import megatron_dapo`` leaves
its torch.compile decorators uncompiled (no dynamo, no inductor) until a decorated function runs,
and a decorated function computes what the undecorated one does."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROBE = """
import json, sys
import megatron_dapo
import pytest
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
import pytest
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


KERNELS_PROBE = """
import importlib.util, json, sys
import megatron_dapo
import torch
from megatron.core.transformer import attention
from megatron.core.models.gpt import gpt_layer_specs  # noqa: F401
from megatron_dapo.platform_imports import CUDA_KERNEL_OPTIONAL
print(json.dumps({
    "installed": sorted(n for n in CUDA_KERNEL_OPTIONAL if importlib.util.find_spec(n) is not None),
    "imported": sorted(n for n in CUDA_KERNEL_OPTIONAL if n in sys.modules and sys.modules[n] is not None),
    "have_fmla": attention.HAVE_FMLA,
}))
"""

UNLOADABLE_PROBE = """
import json
import megatron_dapo
import torch
from megatron_dapo import platform_imports
torch.cuda.is_available = lambda: True  # the GPU branch: the package is tried for real
platform_imports._depth = 1  # as while a megatron.core module imports
try:
    import flash_mla  # noqa: F401
    got = "imported"
except ImportError as e:
    got = "ImportError: " + str(e)
except OSError as e:
    got = "OSError: " + str(e)
print(json.dumps(got))
"""


def _run_probe(code: str, *args, **env):
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **env},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(sys.version_info < (3, 12), reason="the compatibility stack carries no SGLang and its kernels")
@pytest.mark.parametrize("eager_jit", ["0", "1"])
def test_sglangs_cuda_kernel_packages_are_absent_for_megatron_core_without_cuda(eager_jit):
    """SGLang installs flashinfer, flash_mla, quack, ... on the primary stack. Without CUDA,
    megatron-core imports none of them (about 2.5 s of CPU per process) and does not die of
    flash_mla's OSError (its objects link libcuda.so.1), with or without the lazy jit."""
    got = _run_probe(KERNELS_PROBE, MEGATRON_DAPO_EAGER_JIT=eager_jit)
    assert {"flashinfer", "flash_mla", "quack"} <= set(got["installed"]), got
    assert got["imported"] == [] and got["have_fmla"] is False, got


@pytest.mark.skipif(sys.version_info < (3, 12), reason="the compatibility stack carries no SGLang and its kernels")
def test_with_cuda_a_kernel_package_whose_library_cannot_load_is_an_import_error():
    """Where CUDA is there the packages are imported as usual; one whose shared library does not
    load (flash_mla on this machine: no driver library) raises ImportError, which megatron-core
    reads as absent, instead of the OSError that ended its import."""
    got = _run_probe(UNLOADABLE_PROBE)
    assert got.startswith("ImportError: flash_mla cannot load here") and "cuda.abi3.so" in got, got
