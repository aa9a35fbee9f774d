"""SGLang's engine on a machine without a GPU: the settings, and the driver stub it needs to import.

SGLang 0.5.23 (the pinned wheel, with its CUDA build of torch) generates on a CPU when

- the environment has ``SGLANG_USE_CPU_ENGINE=1`` before SGLang starts its scheduler processes
  (without it the rotary embedding imports vllm and fails);
- the engine is launched with :data:`CPU_SERVER_ARGS`: ``device="cpu"``, the ``torch_native``
  attention backend, no CUDA graphs, no memory saver, a KV pool bounded in tokens;
- ``libcuda.so.1`` loads. The sglang-kernel wheel's shared objects are linked against the CUDA
  driver library, which a machine without a GPU does not have, so they fail to load although
  none of their kernels runs on CPU. ``cuda_driver_stub.c`` (next to this module) exports the
  driver symbols they import, each answering CUDA_ERROR_NO_DEVICE.

:func:`prepare_cpu_engine_process` does all three in the process that is about to start an
engine (``SGLangEngine`` calls it when it runs on the CPU): the stub is built once per
environment (:func:`build_stub`, under ``sys.prefix``; ``scripts/setup_env.sh`` builds it at
set-up), loaded into that process and put first on ``LD_LIBRARY_PATH`` so that the scheduler
processes it spawns find it too. It is never used where a real driver library loads
(:func:`real_driver_loads`), and no other process (trainer ranks, the driver) gets it.

What does not run on CPU (docs/hybrid.md, "SGLang on a CPU"): memory release and resume
(``release_memory_occupation`` synchronizes CUDA in the scheduler), the memory saver, routed
experts capture (pinned host memory), deterministic inference (refused for torch_native).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Optional

from megatron_dapo.rollout.sglang_api import CPU_ENGINE_ENV

#: the C source of the driver stub, shipped with the package
STUB_SOURCE = Path(__file__).with_name("cuda_driver_stub.c")
#: the library name the sglang-kernel objects ask for
DRIVER_SONAME = "libcuda.so.1"
#: a symbol only the stub exports (how a loaded libcuda.so.1 is told to be the stub)
STUB_MARKER = "megatron_dapo_cuda_driver_stub"

#: ``sglang.Engine`` arguments of an engine on the CPU (all in USED_API["server_args"])
CPU_SERVER_ARGS: Dict[str, Any] = {
    "device": "cpu",
    "attention_backend": "torch_native",
    "disable_cuda_graph": True,
    "enable_memory_saver": False,
    # an idle scheduler waits on its sockets instead of spinning: on a CPU machine the spinning
    # loop takes a whole core from the colocated trainer (measured: 90% of a core while it trained)
    "sleep_on_idle": True,
}
#: the CPU engine's KV pool in tokens by default: SGLang sizes a GPU's from its free memory; on a
#: CPU ``max_total_tokens`` bounds it
CPU_MAX_TOTAL_TOKENS = 16384
#: SGLang checks at start that the host memory free after loading the weights exceeds
#: (1 - mem_fraction_static) x the memory free before (kv_cache_configurator
#: ``_profile_available_bytes``). On a shared machine other processes allocate meanwhile: at
#: 0.05 an engine started next to a busy trainer died ("Loaded weights leave no GPU memory for
#: the KV cache ... Raise --mem-fraction-static above 0.066"). The pool itself stays bounded by
#: ``max_total_tokens``, so the fraction only sets how much the free memory may shrink meanwhile.
CPU_MEM_FRACTION_STATIC = 0.5


class StubError(RuntimeError):
    """The driver stub could not be built (no C compiler, a failed compile)."""


def stub_dir(prefix: Optional[str] = None) -> Path:
    """Where the built stub lives: under the environment's prefix, one per virtualenv."""
    return Path(prefix or sys.prefix) / "lib" / "megatron-dapo-cuda-stub"


def stub_path(prefix: Optional[str] = None) -> Path:
    return stub_dir(prefix) / DRIVER_SONAME


def _source_digest() -> str:
    return hashlib.sha256(STUB_SOURCE.read_bytes()).hexdigest()[:16]


def build_stub(prefix: Optional[str] = None, cc: Optional[str] = None) -> Path:
    """Compile ``cuda_driver_stub.c`` into ``stub_path(prefix)`` unless the library there was
    built from the same source (a digest file beside it says so); atomic (a reader never sees a
    half-written library). Raises :class:`StubError` in one line without a C compiler."""
    dest = stub_path(prefix)
    digest_file = dest.parent / (DRIVER_SONAME + ".sha256")
    want = _source_digest()
    if dest.is_file() and digest_file.is_file() and digest_file.read_text().strip() == want:
        return dest
    compiler = cc or os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if not compiler:
        raise StubError(
            f"building the CPU stub of {DRIVER_SONAME} (SGLang's engine on a machine without a GPU) needs a C "
            "compiler: install gcc (or set CC), or run SGLang on a GPU machine"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".libcuda-", suffix=".so", dir=dest.parent)
    os.close(fd)
    try:
        cmd = [compiler, "-shared", "-fPIC", "-O2", f"-Wl,-soname,{DRIVER_SONAME}", "-o", tmp, str(STUB_SOURCE)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise StubError(f"{' '.join(cmd)} failed: {done.stderr.strip().splitlines()[-1:]}")
        os.chmod(tmp, 0o755)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    digest_file.write_text(want + "\n")
    return dest


def real_driver_loads() -> bool:
    """Whether a real CUDA driver library loads in this process (the stub does not count)."""
    try:
        lib = ctypes.CDLL(DRIVER_SONAME)
    except OSError:
        return False
    return not hasattr(lib, STUB_MARKER)


def prepare_cpu_engine_process(prefix: Optional[str] = None) -> Dict[str, str]:
    """Make this process (and the processes it starts from now on) able to run SGLang on the
    CPU: ``SGLANG_USE_CPU_ENGINE=1``; where no real driver library loads, the stub built
    (:func:`build_stub`), loaded here (before SGLang's kernels are imported) and first on
    ``LD_LIBRARY_PATH`` for the scheduler processes. Returns what it did: ``{"driver": "real"}``
    or ``{"driver": "stub", "path": ...}``. Call it only in an engine's own process."""
    os.environ[CPU_ENGINE_ENV] = "1"
    if real_driver_loads():
        return {"driver": "real"}
    path = build_stub(prefix)
    ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)  # satisfies this process's libcuda.so.1 by its soname
    parts = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if p]
    if str(path.parent) not in parts:
        os.environ["LD_LIBRARY_PATH"] = os.pathsep.join([str(path.parent), *parts])
    return {"driver": "stub", "path": str(path)}


def cpu_engine_kwargs(kwargs: Dict[str, Any]) -> Dict[str, Any]:
    """``sglang.Engine`` keyword arguments for the CPU: :data:`CPU_SERVER_ARGS` over ``kwargs``,
    a bounded KV pool unless ``max_total_tokens`` is given, :data:`CPU_MEM_FRACTION_STATIC`
    (refused: deterministic inference, which SGLang refuses for torch_native)."""
    if kwargs.get("enable_deterministic_inference"):
        raise ValueError(
            "SGLang on the CPU: deterministic inference is refused for the torch_native attention backend "
            "(run without --deterministic, or on a GPU)"
        )
    out = dict(kwargs)
    out.update(CPU_SERVER_ARGS)
    out.pop("cuda_graph_backend_prefill", None)  # a CUDA-graph setting (rollout/sglang_launch.py)
    out.setdefault("max_total_tokens", CPU_MAX_TOTAL_TOKENS)
    out["mem_fraction_static"] = CPU_MEM_FRACTION_STATIC
    return out


def main(argv=None) -> int:
    """``python -m megatron_dapo.rollout.sglang_cpu --build-stub``: build the stub (set-up)."""
    import argparse

    p = argparse.ArgumentParser(description="Build the CPU stub of the CUDA driver library for SGLang's CPU engine.")
    p.add_argument("--build-stub", action="store_true", help="build it under this environment's prefix")
    args = p.parse_args(argv)
    if not args.build_stub:
        p.print_help()
        return 2
    try:
        print(build_stub())
    except StubError as e:
        print(f"[sglang-cpu] {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
