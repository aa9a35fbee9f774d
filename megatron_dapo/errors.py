"""Mistakes a user can make, and how an entry point reports them: one line, no traceback.

Each kind of mistake has its error type, raised where it is found:

| kind       | type                                        | e.g.                                        |
|------------|---------------------------------------------|---------------------------------------------|
| config     | ``config.ConfigError``                      | a flag out of range, flags that conflict    |
| data       | ``data.DataError``                          | a prompt file that is empty or lacks a column |
| checkpoint | ``checkpoint.dist_ckpt.CheckpointError``    | a missing ``.metadata``, a non-empty ``--save`` |
| model      | ``models.hf_config.ModelConfigError``       | an unsupported architecture in config.json  |

:func:`exit_on_user_error` wraps a command's body: such an error ends the command with
``<command>: error: <message>`` on stderr and exit code 2; ``MEGATRON_DAPO_DEBUG=1`` shows the
traceback instead. Any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import os
import sys

DEBUG_ENV = "MEGATRON_DAPO_DEBUG"


def user_error_types() -> tuple:
    from .checkpoint.dist_ckpt import CheckpointError
    from .config import ConfigError
    from .data import DataError
    from .models.hf_config import ModelConfigError

    return (ConfigError, DataError, CheckpointError, ModelConfigError)


def one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


@contextlib.contextmanager
def exit_on_user_error(command: str):
    """Inside: a user error (:func:`user_error_types`) exits 2 with one line on stderr."""
    try:
        yield
    except user_error_types() as e:
        if os.environ.get(DEBUG_ENV):
            raise
        print(f"{command}: error: {one_line(e)}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
