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
imports a lazy loader. ``MEGATRON_DAPO_EAGER_JIT=1`` leaves megatron-core's imports as they are.

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
import os
import sys

PACKAGE = "megatron.core"
#: Optional packages megatron-core imports at its top only to know they are there (``try: import
#: wandb``, its timers and inference context): imported by a megatron.core module, they are
#: ``importlib.util.LazyLoader`` modules, run at their first attribute use (0.7 s of CPU).
LAZY_OPTIONAL = ("wandb",)
_real_compile = None  # torch.compile, kept while a megatron.core module imports


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
        global _real_compile
        import torch

        outer = _real_compile is None
        if outer:
            _real_compile = torch.compile
            torch.compile = lazy_compile  # type: ignore[assignment]
        try:
            self.inner.exec_module(module)
        finally:
            if outer:
                torch.compile = _real_compile  # type: ignore[assignment]
                _real_compile = None
        if module.__name__ == PACKAGE:
            _keep_storage_pickles_light()


class _MegatronCoreFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
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


def install() -> bool:
    """Put the finder first on ``sys.meta_path`` (once). False where it cannot act: asked off,
    or megatron-core already imported in this process."""
    if os.environ.get("MEGATRON_DAPO_EAGER_JIT") == "1" or PACKAGE in sys.modules:
        return False
    if not any(isinstance(f, _MegatronCoreFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MegatronCoreFinder())
    return True
