"""Command line and YAML for the config tree; validation before any process group exists.

* Flags come from the dataclass fields of :mod:`megatron_dapo.config.schema` (Megatron-LM's
  kebab-case names for model, parallelism and optimizer).
* ``--config FILE.yaml`` holds sections (``optim: {lr: 1e-6}``) or flat keys (``lr: 1e-6``,
  ``eps-clip-high: 0.28``); flags on the command line win over the file.
* Booleans: ``--flag`` (true), ``--flag false``, ``--no-flag``. Optionals: ``none``.
* The ``--algorithm`` preset fills every DAPO control not given explicitly.

Why plain argparse rather than a dataclass-CLI library: Megatron-style scripts need exact
flag names such as ``--tensor-model-parallel-size`` on a nested tree without section
prefixes, and store-true booleans; tyro/simple-parsing prefix nested fields or differ in
boolean syntax, so ~150 lines of argparse generated from field metadata fit better
(docs/design.md).
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any, Optional

from ..algo.config import apply_preset
from ..errors import ConfigError, OneLineArgumentParser
from .schema import SECTIONS, DAPOConfig, flag_of

#: Flags that existed once and were removed: giving one (flag or YAML key) is an error that
#: says what to do instead, rather than "unrecognized arguments".
REMOVED_FLAGS = {
    "--normalize-adv-std": "use --advantage-estimator group-norm (std-normalised, the default; was true) or "
    "group-mean (mean-centring only; was false)",
    "--min-lr": "the learning rate is constant after warm-up, so a minimum learning rate was never used; drop the flag",
}


def _removed_message(flag: str) -> str:
    return f"{flag} was removed: {REMOVED_FLAGS[flag]}"


class _RemovedFlag(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(_removed_message(option_string))


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _base_type(tp):
    """(python type, optional?) of a field annotation (strings under PEP 563)."""
    if isinstance(tp, str):
        tp = eval(tp, {"Optional": Optional, "typing": typing, "list": list, "dict": dict, "Any": Any})
    origin = typing.get_origin(tp)
    if origin is typing.Union:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], True
    return tp, False


def _parse_bool(flag: str):
    def conv(s):
        v = str(s).strip().lower()
        if v in _TRUE:
            return True
        if v in _FALSE:
            return False
        raise argparse.ArgumentTypeError(f"{flag} expects true/false, got {s!r}")

    return conv


def _converter(flag: str, tp, optional: bool):
    if tp is bool:
        return _parse_bool(flag)

    def conv(s):
        if optional and str(s).strip().lower() in ("none", "null", ""):
            return None
        try:
            return tp(s) if tp in (int, float, str) else s
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} expects {tp.__name__}, got {s!r}") from None

    return conv


def _fields():
    """(section, field, flag, type, optional) for every leaf of the tree."""
    out = []
    for sec in dataclasses.fields(DAPOConfig):
        cls = sec.default_factory
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            tp, opt = _base_type(hints[f.name])
            out.append((sec.name, f, flag_of(f), tp, opt))
    return out


def build_parser() -> argparse.ArgumentParser:
    p = OneLineArgumentParser(
        prog="python -m megatron_dapo.train",
        description="DAPO training on megatron-core (flags: Megatron-LM names for model/parallel/optimizer).",
        argument_default=argparse.SUPPRESS,
    )
    p.add_argument("--config", help="YAML file of settings (sections or flat keys); flags win over it.")
    groups = {s: p.add_argument_group(s) for s in SECTIONS}
    for sec, f, flag, tp, opt in _fields():
        g = groups[sec]
        dest = f"{sec}.{f.name}"
        helptext = f.metadata.get("help", "")
        if tp is bool:
            g.add_argument(
                flag,
                dest=dest,
                nargs="?",
                const=True,
                type=_parse_bool(flag),
                help=helptext + f" (default {f.default})",
            )
            g.add_argument("--no-" + flag[2:], dest=dest, action="store_false", help=argparse.SUPPRESS)
        elif tp is list or typing.get_origin(tp) is list:
            g.add_argument(flag, dest=dest, nargs="*", help=helptext)
        else:
            choices = f.metadata.get("choices")
            kw: dict[str, Any] = {}
            if choices:
                kw["choices"] = [c for c in choices if c is not None] + (["none"] if None in choices else [])
            conv = _converter(flag, tp, opt)
            g.add_argument(
                flag, dest=dest, type=conv if not choices else str, help=helptext + f" (default {f.default})", **kw
            )
    for flag in REMOVED_FLAGS:
        p.add_argument(flag, nargs="?", action=_RemovedFlag, help=argparse.SUPPRESS)
    return p


def _index():
    by_key = {}
    for sec, f, flag, tp, opt in _fields():
        for key in (f.name, flag[2:], flag[2:].replace("-", "_"), f"{sec}.{f.name}"):
            by_key[key] = (sec, f, flag, tp, opt)
    return by_key


def _coerce(value, flag, tp, opt):
    if value is None:
        if opt:
            return None
        raise ConfigError(f"{flag} may not be null")
    if tp is bool:
        if isinstance(value, bool):
            return value
        return _parse_bool(flag)(value)
    if tp is list or typing.get_origin(tp) is list:
        return list(value) if isinstance(value, (list, tuple)) else [value]
    if tp in (int, float):
        if isinstance(value, bool) or (tp is int and isinstance(value, float) and not value.is_integer()):
            raise ConfigError(f"{flag} expects {tp.__name__}, got {value!r}") from None
        try:
            return tp(value)
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(f"{flag} expects {tp.__name__}, got {value!r}") from None
    if isinstance(value, str) and opt and value.lower() == "none":
        return None
    return value


def load_yaml(path: str) -> dict:
    """Flatten a YAML config into {section.field: value}; unknown keys are an error naming them."""
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            raw = yaml.safe_load(fh)
    except FileNotFoundError:
        raise ConfigError(f"--config: file not found: {path}") from None
    except (IsADirectoryError, PermissionError) as e:
        raise ConfigError(f"--config {path}: cannot read it ({e.strerror}); give a YAML file") from e
    except UnicodeDecodeError as e:
        raise ConfigError(f"--config {path}: not UTF-8 text (byte {e.start}); give a YAML file") from e
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or getattr(e, "context", None) or str(e)
        raise ConfigError(f"--config {path}: invalid YAML{where}: {problem}; fix the file") from e
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(
            f"--config {path}: expected a mapping of settings (key: value, or sections such as "
            f"'optim: {{lr: 1.0e-6}}'), got a {type(raw).__name__}"
        )
    idx = _index()
    out = {}

    removed = {k: flag for flag in REMOVED_FLAGS for k in (flag[2:], flag[2:].replace("-", "_"))}

    def put(key, value):
        key = str(key)
        if key.rsplit(".", 1)[-1] in removed:
            raise ConfigError(f"--config {path}: {key!r}: {_removed_message(removed[key.rsplit('.', 1)[-1]])}")
        if key not in idx:
            raise ConfigError(f"--config {path}: unknown setting {key!r}")
        sec, f, flag, tp, opt = idx[key]
        v = _coerce(value, flag, tp, opt)
        choices = f.metadata.get("choices")
        if choices and v not in choices and not (v is None and opt):
            shown = ", ".join("none" if c is None else str(c) for c in choices)
            raise ConfigError(f"--config {path}: {key!r} ({flag}) must be one of {shown}, got {value!r}")
        out[f"{sec}.{f.name}"] = v

    for k, v in raw.items():
        if k in SECTIONS and isinstance(v, dict):
            for k2, v2 in v.items():
                put(f"{k}.{k2}" if f"{k}.{k2}" in idx else k2, v2)
        else:
            put(k, v)
    return out


def decode_escapes(flag: str, values: list) -> list:
    """Backslash escapes (``\\n``, ``\\t``, ``\\u2028``) of string flags such as ``--rollout-stop``
    turned into the characters; any other character (non-ASCII included) is kept as given. A bad
    escape is a ConfigError naming the flag and the value."""
    out = []
    for s in values:
        s = str(s)
        try:
            out.append(s.encode("latin-1", "backslashreplace").decode("unicode_escape"))
        except UnicodeDecodeError as e:
            raise ConfigError(
                f"{flag} {s!r}: bad escape ({e.reason}); write a backslash as \\\\, a newline as \\n"
            ) from e
    return out


def parse_args(argv=None) -> DAPOConfig:
    """Parse flags (and ``--config``) into a DAPOConfig; the ``--algorithm`` preset fills the
    controls that were not given explicitly."""
    ns = vars(build_parser().parse_args(argv))
    values = {}
    if "config" in ns:
        values.update(load_yaml(ns.pop("config")))
    idx = _index()
    for k, v in ns.items():
        sec, f, flag, tp, opt = idx[k]
        if f.metadata.get("choices") and isinstance(v, str) and v == "none" and "none" not in f.metadata["choices"]:
            v = None  # "none" of an Optional choice; a choice named "none" (e.g. --tis-mode) stays a string
        values[k] = _coerce(v, flag, tp, opt) if v is not None or opt else v
    cfg = DAPOConfig()
    for key, v in values.items():
        sec, name = key.split(".", 1)
        setattr(getattr(cfg, sec), name, v)
    explicit = {k.split(".", 1)[1] for k in values if k.startswith("algo.")}
    cfg.algo = apply_preset(cfg.algo, cfg.algo.algorithm, explicit)
    return cfg
