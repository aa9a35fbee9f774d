"""Named implementations of one concept (advantage estimators, reward modes, engine kinds, ...),
chosen by a flag.

A :class:`Registry` maps a name to an object. The config schema takes a flag's choices from
``registry.names()``, so registering a new implementation is all it takes to make it
selectable on the command line and in YAML: there is no second, hand-kept list of names.
``megatron_dapo.config.registries`` lists every registry (and prints the docs' table).

This module imports nothing but the standard library, so that light packages (``reward``,
whose scorer workers must not import torch) can hold a registry too.
"""

from __future__ import annotations

from typing import Dict, Generic, Iterator, Optional, Tuple, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """An ordered ``name -> object`` map with a decorator to fill it.

    >>> ESTIMATORS = Registry("advantage estimator", flag="--advantage-estimator")
    >>> @ESTIMATORS.register("mine")
    ... def mine(rewards, group_size, eps): ...
    >>> ESTIMATORS.get("mine") is mine
    True

    Names are unique; an unknown name is a ``ValueError`` that names the flag and lists the
    registered names.
    """

    def __init__(self, kind: str, flag: Optional[str] = None):
        self.kind = kind
        self.flag = flag
        self._items: Dict[str, T] = {}

    def register(self, name: str, obj: Optional[T] = None):
        """Register ``obj`` under ``name``; without ``obj``, a decorator that registers its target."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind}: a name must be a non-empty string, got {name!r}")

        def add(target: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is registered twice")
            self._items[name] = target
            return target

        return add(obj) if obj is not None else add

    def get(self, name: str) -> T:
        try:
            return self._items[name]
        except (KeyError, TypeError):
            where = self.flag or self.kind
            raise ValueError(f"{where}: unknown {self.kind} {name!r}; one of {', '.join(self._items)}") from None

    def names(self) -> Tuple[str, ...]:
        return tuple(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def items(self):
        return self._items.items()

    def doc(self, name: str) -> str:
        """The first line of the entry's docstring (its ``doc`` attribute, or the docstring of
        its function ``fn`` or of the object itself): the docs' table shows it."""
        obj = self.get(name)
        text = getattr(obj, "doc", None)
        if not isinstance(text, str):
            target = getattr(obj, "fn", obj)
            text = getattr(target, "__doc__", None) or ""
        line = " ".join(text.strip().split("\n\n")[0].split())
        return line[:-1] + "." if line.endswith(":") else line
