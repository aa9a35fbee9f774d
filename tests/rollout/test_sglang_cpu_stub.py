"""The CPU stub of the CUDA driver library (rollout/sglang_cpu.py, rollout/cuda_driver_stub.c):
built once per environment, loaded into a CPU engine's process and the processes it starts, never
where a real driver library loads. Each case runs in a fresh interpreter (what a process loads
cannot be undone)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from megatron_dapo.rollout import sglang_cpu

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.sglang


def _python(code: str, env_extra=None, timeout=180) -> dict:
    """Run ``code`` in a fresh interpreter with a clean library path; it prints one JSON line last."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", sglang_cpu.CPU_ENGINE_ENV)}
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", **(env_extra or {}))
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _loaded(path_part: str) -> str:
    return f"any({path_part!r} in line for line in open('/proc/self/maps'))"


def test_without_a_driver_sglangs_kernels_load_only_in_a_prepared_process_and_its_children(tmp_path):
    got = _python(
        f"""
        import json, os, subprocess, sys
        from megatron_dapo.rollout import sglang_cpu
        before = None
        try:
            import sgl_kernel  # noqa: F401
        except ImportError as e:
            before = str(e)
        info = sglang_cpu.prepare_cpu_engine_process(prefix={str(tmp_path)!r})
        for m in [m for m in sys.modules if m.startswith("sgl_kernel")]:
            del sys.modules[m]
        import sgl_kernel  # noqa: F401,F811
        # a process started from here (SGLang's schedulers are spawned) inherits the library path
        spawned = subprocess.run([sys.executable, "-c", "import sgl_kernel"], capture_output=True, text=True)
        print(json.dumps(dict(before=before, info=info, spawned=spawned.returncode, err=spawned.stderr[-500:],
                              env=os.environ[sglang_cpu.CPU_ENGINE_ENV], path=os.environ["LD_LIBRARY_PATH"].split(":")[0],
                              loaded={_loaded(str(tmp_path))})))
        """
    )
    assert got["before"] and "libcuda.so.1" in got["before"], got  # this machine has no driver library
    assert got["info"] == {"driver": "stub", "path": str(tmp_path / "lib" / "megatron-dapo-cuda-stub" / "libcuda.so.1")}
    assert got["loaded"] and got["spawned"] == 0, got  # a scheduler process finds it too
    assert got["env"] == "1" and got["path"] == str(tmp_path / "lib" / "megatron-dapo-cuda-stub")


def test_a_real_driver_library_is_used_as_it_is(tmp_path):
    """A libcuda.so.1 that is not the stub (here a one-function library standing for the real
    driver) on the library path: nothing is built, loaded or put on the path."""
    drv = tmp_path / "driver"
    drv.mkdir()
    src = drv / "driver.c"
    src.write_text("int cuInit(unsigned int flags) { (void)flags; return 0; }\n")
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(drv / "libcuda.so.1"), str(src)], check=True
    )
    prefix = tmp_path / "env"
    got = _python(
        f"""
        import json, os
        from megatron_dapo.rollout import sglang_cpu
        info = sglang_cpu.prepare_cpu_engine_process(prefix={str(prefix)!r})
        print(json.dumps(dict(info=info, path=os.environ["LD_LIBRARY_PATH"], stub={_loaded("megatron-dapo-cuda-stub")})))
        """,
        env_extra={"LD_LIBRARY_PATH": str(drv)},
    )
    assert got == {"info": {"driver": "real"}, "path": str(drv), "stub": False}, got
    assert not (prefix / "lib").exists()  # not even built


def test_the_stub_is_built_once_per_source_and_a_missing_compiler_is_one_line(tmp_path, monkeypatch):
    path = sglang_cpu.build_stub(prefix=str(tmp_path))
    stamp = path.stat().st_mtime_ns
    assert sglang_cpu.build_stub(prefix=str(tmp_path), cc="/nonexistent/cc") == path  # up to date: not rebuilt
    assert path.stat().st_mtime_ns == stamp
    (path.parent / "libcuda.so.1.sha256").write_text("another source\n")
    with pytest.raises(sglang_cpu.StubError, match="failed"):
        sglang_cpu.build_stub(prefix=str(tmp_path), cc="/bin/false")
    assert path.is_file() and path.stat().st_mtime_ns == stamp  # the failed rebuild left the old one (atomic)
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(".")] == []  # no temporary left
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(sglang_cpu.shutil, "which", lambda name: None)
    with pytest.raises(sglang_cpu.StubError) as e:
        sglang_cpu.build_stub(prefix=str(tmp_path / "other"))
    assert "needs a C compiler" in str(e.value) and "\n" not in str(e.value)
