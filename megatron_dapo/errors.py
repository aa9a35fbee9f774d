"""Mistakes a user can make, and how an entry point reports them: one line, no traceback.

Each kind of mistake has its error type, raised where it is found:

| kind       | type                                        | e.g.                                        |
|------------|---------------------------------------------|---------------------------------------------|
| config     | ``ConfigError`` (``config`` re-exports it)  | a flag out of range, flags that conflict, broken YAML in ``--config`` |
| data       | ``DataError`` (``data``)                    | a prompt file that is empty or lacks a column |
| checkpoint | ``CheckpointError`` (``checkpoint.dist_ckpt``) | a missing ``.metadata``, a non-empty ``--save`` |
| model      | ``ModelConfigError`` (``models.hf_config``) | an unsupported architecture in config.json, a tokenizer that does not load |
| reward     | ``RewardConfigError`` (``reward.api``)      | an unknown reward mode, a ``--reward-fn`` that does not import |
| file       | ``OSError`` that names a file               | a path that cannot be created or read (``/proc/run``) |
| disk       | :class:`DiskFullError` (this module)        | a checkpoint, export, rollout dump or metrics line the device refuses (ENOSPC, EDQUOT) |
| machine    | :class:`StartupError` (this module)         | the local Ray node does not come up on a machine too busy for it |
| run        | :class:`RunStoppedError` (this module)      | dynamic sampling finds no mixed group within its budget; non-finite gradients step after step |

:func:`exit_on_user_error` wraps a command's body: such an error ends the command with
``<command>: error: <message>`` (one line) on stderr and exit code 2 (:data:`EXIT_USER_ERROR`);
``MEGATRON_DAPO_DEBUG=1`` in the environment shows the traceback instead. Any other exception
is a bug and keeps its traceback. :func:`report_user_error` is the same for a ``main`` that
returns its exit code, and :class:`OneLineArgumentParser` makes argparse's own errors (an
unknown flag, a bad value) one line too, instead of a usage text of a hundred lines.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import errno
import os
import re
import shutil
import sys
from typing import Optional

DEBUG_ENV = "MEGATRON_DAPO_DEBUG"
EXIT_USER_ERROR = 2


class ConfigError(ValueError):
    """An invalid configuration; the message names the flags and values involved."""


class DataError(ValueError):
    """A data file or row that cannot be used; names the file, row and field."""


class CheckpointError(ValueError):
    """A checkpoint that does not match the model it is loaded into (never a partial load)."""


class ModelConfigError(ValueError):
    """An HF config that megatron-dapo cannot build faithfully."""


class RewardConfigError(ValueError):
    """A reward setting that cannot work (an unknown mode, a ``--reward-fn`` / ``--reward-source``
    spec that does not import or is malformed, a bad remote URL); the message names the flag."""


class StartupError(RuntimeError):
    """A service the run needs (the local Ray node) could not be started on this machine; the
    message names the cause and what to try. Not a bug of the program: reported in one line."""


class RunStoppedError(RuntimeError):
    """The run cannot go on for a reason of its data or settings that the message names, with
    what to change (``RolloutStallError``, the trainer's ``TrainingError``); the last checkpoint
    is kept. One line, like a mistake in the input: it is not a bug of the program."""


def out_of_memory_stop(exc: BaseException) -> Optional[RunStoppedError]:
    """Ray's ``OutOfMemoryError`` (its memory monitor killed a worker: the node's memory crossed
    its threshold) as a one-line stop naming the memory and what to change; None for any other
    exception. Matched by name, so this layer imports no Ray."""
    t = type(exc)
    if t.__name__ != "OutOfMemoryError" or not t.__module__.startswith("ray"):
        return None
    m = re.search(r"was ([\d.]+\s*GB) used / ([\d.]+\s*GB) limit", str(exc))
    used = f" ({m.group(1)} used of {m.group(2)})" if m else ""
    return RunStoppedError(
        f"the node ran out of memory{used} and Ray killed a worker of the run: other processes on the node took "
        "part of it, or the run needs less (lower --rollout-batch-size, --micro-batch-size or --max-tokens-per-gpu); "
        "the last checkpoint is kept: rerun the same command with --load to continue from it"
    )


class DiskFullError(OSError):
    """A write refused by the device (ENOSPC, EDQUOT, or torch's writer failing on a full disk):
    one line naming the path, what was being written, the bytes needed and free there."""


#: errno values of a full device or an exceeded quota
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
#: how a full device reads when the errno is lost (torch's zip writer, a remote traceback)
_DISK_FULL_TEXT = (
    "No space left on device",
    "Disk quota exceeded",
    "unexpected pos",
    "file write failed",
    "iostream error",
)


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it, also across a Ray task) is a write the device refused."""
    exc: Optional[BaseException] = error
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS:
            return True
        if any(t in str(exc) for t in _DISK_FULL_TEXT):
            return True
        exc = getattr(exc, "cause", None) or exc.__cause__ or exc.__context__
    return False


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def disk_full_error(path: str, what: str, need_bytes: Optional[float] = None, kept: str = "") -> DiskFullError:
    """The one-line error of a write to ``path`` that the device refused."""
    probe = path
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe)
    try:
        free = f"{_human(shutil.disk_usage(probe or '.').free)} free there"
    except OSError:
        free = "free space unknown"
    need = f"about {_human(need_bytes)} needed, " if need_bytes else ""
    msg = (
        f"{what}: the device of {path} refused the write (no space left or quota exceeded; {need}{free}): free space "
        f"or choose another directory{'; ' + kept if kept else ''}"
    )
    err = DiskFullError(errno.ENOSPC, msg)
    return err


@contextlib.contextmanager
def writing(path: str, what: str, need_bytes: Optional[float] = None, kept: str = ""):
    """Inside: a write the device refuses becomes :class:`DiskFullError` (one line)."""
    try:
        yield
    except DiskFullError:
        raise
    except Exception as e:
        if is_disk_full(e):
            raise disk_full_error(path, what, need_bytes, kept) from None
        raise


def user_error_types() -> tuple:
    """Every kind of mistake of the user's (the table above); all defined here, at the bottom of
    the package's layers, and re-exported where they are raised."""
    return (
        ConfigError,
        DataError,
        CheckpointError,
        ModelConfigError,
        RewardConfigError,
        StartupError,
        DiskFullError,
        RunStoppedError,
    )


def is_user_error(exc: BaseException) -> bool:
    """A mistake of the user's (:func:`user_error_types`, or an OSError that names its file:
    a path from the command line that cannot be created, read or written)."""
    if isinstance(exc, user_error_types()):
        return True
    return isinstance(exc, OSError) and getattr(exc, "filename", None) is not None


def debug() -> bool:
    """Whether ``MEGATRON_DAPO_DEBUG`` asks for tracebacks (any value but empty / 0 / false)."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() not in ("", "0", "false", "no", "off")


def _names_a_file(exc: BaseException) -> bool:
    return (
        isinstance(exc, OSError)
        and getattr(exc, "filename", None) is not None
        and not isinstance(exc, user_error_types())
    )


def one_line(exc: BaseException) -> str:
    """The message of ``exc`` on one line (an OSError that names a file: ``FILE: what``)."""
    if isinstance(exc, DiskFullError):
        return " ".join(str(exc.strerror).split())
    if isinstance(exc, OSError) and _names_a_file(exc):
        where = f"{exc.filename}" + (f" -> {exc.filename2}" if exc.filename2 else "")
        return f"{where}: {exc.strerror or type(exc).__name__}"
    return " ".join(str(exc).split()) or type(exc).__name__


def report_user_error(command: str, exc: BaseException) -> int:
    """Print ``<command>: error: <one line>`` on stderr and return :data:`EXIT_USER_ERROR`; re-raise
    (inside an ``except``) when ``exc`` is no user error or ``MEGATRON_DAPO_DEBUG`` is set."""
    if not is_user_error(exc) or debug():
        raise exc
    hint = (
        f" (check the path given on the command line; {DEBUG_ENV}=1 shows where it was opened)"
        if _names_a_file(exc)
        else ""
    )
    print(f"{command}: error: {one_line(exc)}{hint}", file=sys.stderr, flush=True)
    return EXIT_USER_ERROR


@contextlib.contextmanager
def exit_on_user_error(command: str):
    """Inside: a user error (:func:`is_user_error`) exits 2 with one line on stderr."""
    try:
        yield
    except SystemExit as e:  # ``raise SystemExit("message")``: a script's own one-line refusal
        if not isinstance(e.code, str) or debug():
            raise
        print(f"{command}: error: {' '.join(e.code.split())}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_USER_ERROR) from None
    except Exception as e:
        if not is_user_error(e) or debug():
            raise
        raise SystemExit(report_user_error(command, e)) from None


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse whose errors are one line: ``<prog>: error: <message>`` (with the closest flag for
    an unknown one) and exit code 2, where argparse prints its whole usage first."""

    def error(self, message: str):
        if message.startswith("unrecognized arguments:"):
            known = [s for a in self._actions for s in a.option_strings if s.startswith("--")]
            hints = []
            for arg in message.split(":", 1)[1].split():
                if arg.startswith("--"):
                    close = difflib.get_close_matches(arg.split("=", 1)[0], known, n=1, cutoff=0.8)
                    if close:
                        hints.append(f"{arg}: did you mean {close[0]}?")
            if hints:
                message += " (" + "; ".join(hints) + ")"
        if debug():
            self.print_usage(sys.stderr)
        self.exit(EXIT_USER_ERROR, f"{self.prog}: error: {' '.join(message.split())} (--help lists the flags)\n")
