"""The import-time half of megatron_dapo/platform.py: megatron-core's ``torch.compile`` decorators
compile when first called, not when megatron-core is imported.

megatron-core decorates functions with ``torch.compile`` as its modules are imported:
``megatron/core/jit.py`` sets ``jit_fuser = torch.compile`` for the fusion modules' ``@jit_fuser``,
and 0.19's MoE router decorates a method with ``@torch.compile`` directly. ``torch.compile``
imports dynamo and inductor the first time it is called, decorating included: about 3.5 s of
CPU (torch 2.13 and 2.14 on this machine) in every process that imports megatron-core, for
functions that most runs never call (the fusions are off in ``models/provider.py``'s config).
While a ``megatron.core`` module runs its import, ``torch.compile`` is :func:`lazy_compile`,
which defers both the import and the compilation to the function's first call. ``torch.compile``
itself compiles at the first call too, so a decorated function that runs (on a GPU) is compiled
with the same arguments; only its dynamo import moves. Outside those imports ``torch.compile``
is untouched.

The hook must be in place before megatron-core is imported; ruff's import order puts
``megatron.core`` before this package's own modules in every file, so ``import megatron_dapo``
installs it (:func:`install`). Standard library only: importing the package stays cheap.
The same hook gives the optional packages of ``LAZY_OPTIONAL`` that a megatron.core module
imports a lazy loader. ``MEGATRON_DAPO_EAGER_JIT=1`` leaves megatron-core's ``torch.compile`` as it is.

megatron-core 0.19's ``__init__`` also replaces ``torch.storage._load_from_bytes``, the function
every pickled tensor names for its own unpickling, by ``megatron.core.safe_globals.
safe_load_from_bytes`` (the same ``torch.load`` with ``weights_only=True``). From then on each
tensor that a trainer rank pickles (a Ray return value: the RNG states that a checkpoint saves)
names megatron-core, and whichever process unpickles it imports all of megatron-core first:
2.7 CPU-s in the driver at its first checkpoint, which otherwise never imports it. Once
``megatron.core`` has imported, the hook puts :func:`load_storage_bytes` in its place: the
same ``weights_only=True`` load, named by this module, which the receiver imports in
milliseconds.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import logging
import os
import sys

PACKAGE = "megatron.core"
#: Optional packages megatron-core imports at its top only to know they are there (``try: import
#: wandb``, its timers and inference context): imported by a megatron.core module, they are
#: ``importlib.util.LazyLoader`` modules, run at their first attribute use (0.7 s of CPU).
LAZY_OPTIONAL = ("wandb",)
#: CUDA kernel packages megatron-core tries at its top (``try: import flashinfer`` ...
#: ``except ImportError``). SGLang brings them (the primary stack carries it for the CPU test
#: bench), so they are installed on machines without a GPU too, where they cannot run, cost
#: about 2.5 s of CPU per process that imports megatron-core (flashinfer with cutlass, quack:
#: ``python -X importtime``), and flash_mla's import raises OSError (its objects link
#: libcuda.so.1), which megatron-core does not catch. So, imported by a megatron.core module:
#: without CUDA such a package is absent (ModuleNotFoundError, what megatron-core expects of a
#: package that is not there); with CUDA it imports as usual, a package that fails to run there
#: (a shared library that does not load, no driver) becoming an ImportError.
CUDA_KERNEL_OPTIONAL = ("flashinfer", "flash_mla", "flash_attn", "quack", "deep_ep", "tilelang", "nvshmem")
_real_compile = None  # torch.compile, kept while a megatron.core module imports
_depth = 0  # megatron.core modules being imported now (nested)


def _lazy_jit() -> bool:
    return os.environ.get("MEGATRON_DAPO_EAGER_JIT") != "1"


def lazy_compile(model=None, **kwargs):
    """``torch.compile(model, **kwargs)`` made at ``model``'s first call (a plain function); an
    ``nn.Module`` or another callable is compiled at once, as by ``torch.compile``."""
    if model is None:
        return functools.partial(lazy_compile, **kwargs)
    import torch

    real = _real_compile or torch.compile
    if not inspect.isfunction(model):
        return real(model, **kwargs)
    compiled = None

    @functools.wraps(model)
    def call(*args, **kw):
        nonlocal compiled
        if compiled is None:
            compiled = real(model, **kwargs)
        return compiled(*args, **kw)

    call.lazy_compile_of = model  # type: ignore[attr-defined]  # what it wraps (tests)
    return call


def load_storage_bytes(b):
    """A pickled storage's bytes back to the storage, with ``weights_only=True`` as megatron-core
    0.19 loads it (its ``safe_load_from_bytes``), from a module cheap to import."""
    import io

    import torch

    return torch.load(io.BytesIO(b), weights_only=True)


def _keep_storage_pickles_light() -> None:
    """After ``megatron.core`` imported: its ``safe_load_from_bytes`` on ``torch.storage`` gives way
    to :func:`load_storage_bytes` (see the module docstring); torch's own function is kept."""
    import torch.storage

    if getattr(torch.storage._load_from_bytes, "__module__", "") == PACKAGE + ".safe_globals":
        torch.storage._load_from_bytes = load_storage_bytes


class _LazyCompileLoader(importlib.abc.Loader):
    """Runs a ``megatron.core`` module as its own loader would, with ``torch.compile`` being
    :func:`lazy_compile` meanwhile (nested imports keep it; the outermost puts torch's back)."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def __getattr__(self, name):  # get_source, get_filename, is_package, ...: the file loader's
        return getattr(self.inner, name)

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        global _real_compile, _depth
        import torch

        outer = _real_compile is None and _lazy_jit()
        if outer:
            _real_compile = torch.compile
            torch.compile = lazy_compile  # type: ignore[assignment]
        _depth += 1
        try:
            self.inner.exec_module(module)
        finally:
            _depth -= 1
            if outer:
                torch.compile = _real_compile  # type: ignore[assignment]
                _real_compile = None
        if module.__name__ == PACKAGE:
            _keep_storage_pickles_light()


class _UnloadableIsAbsent(importlib.abc.Loader):
    """Runs a package of ``CUDA_KERNEL_OPTIONAL`` as its own loader would; one that fails to run
    here (a shared library that does not load: OSError; no driver: RuntimeError) makes the import
    an ImportError naming it."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:
        try:
            self.inner.exec_module(module)
        except ImportError:
            raise
        except Exception as e:  # noqa: BLE001 - an OSError of a library, a RuntimeError without a driver
            raise ImportError(
                f"{module.__name__} cannot load here ({type(e).__name__}: {e})", name=module.__name__
            ) from e


class _MegatronCoreFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname in CUDA_KERNEL_OPTIONAL and _depth:  # inside a megatron.core import
            import torch

            if not torch.cuda.is_available():
                raise ModuleNotFoundError(f"{fullname}: a CUDA kernel package, absent without CUDA", name=fullname)
            spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _UnloadableIsAbsent(spec.loader)
            return spec
        if fullname in LAZY_OPTIONAL and _real_compile is not None:  # inside a megatron.core import
            spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = importlib.util.LazyLoader(spec.loader)
            return spec
        if fullname != PACKAGE and not fullname.startswith(PACKAGE + "."):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is not None and spec.loader is not None:
            spec.loader = _LazyCompileLoader(spec.loader)
        return spec


class _DropLinesStartingWith(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


def drop_log_lines(logger_name: str, prefix: str) -> None:
    """Filter the lines of the logger ``logger_name`` that start with ``prefix`` (a
    known-harmless line it would print in every process; idempotent). Used for 0.19's GPTModel
    deprecation (``models/provider.py``), its async-save deprecation (``checkpoint/dist_ckpt.py``)
    and :data:`QUIET_LINES`."""
    log = logging.getLogger(logger_name)
    if not any(isinstance(f, _DropLinesStartingWith) and f.prefix == prefix for f in log.filters):
        log.addFilter(_DropLinesStartingWith(prefix))


#: Lines dropped from the start (:func:`install`): megatron-core imports torch's
#: ``cpp_extension`` (``tensor_parallel/random.py``), which on a machine with a CUDA toolkit but
#: no GPU warns that it found no CUDA runtime; the project never builds an extension there.
QUIET_LINES = (("torch.utils.cpp_extension", "No CUDA runtime is found"),)


def install() -> bool:
    """Put the finder first on ``sys.meta_path`` (once). Where megatron-core's package was
    imported before (a script that imports ``megatron.core`` first), the finder still acts on
    the megatron.core modules imported from now on (most of them: models, transformer, optimizer
    are imported when a model is built) and the storage loader is replaced at once; returns
    False then. With ``MEGATRON_DAPO_EAGER_JIT=1`` megatron-core's ``torch.compile`` calls are
    its own (the CUDA kernel packages are still handled)."""
    for name, prefix in QUIET_LINES:
        drop_log_lines(name, prefix)
    if not any(isinstance(f, _MegatronCoreFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MegatronCoreFinder())
    if PACKAGE in sys.modules:
        _keep_storage_pickles_light()
        return False
    return True
