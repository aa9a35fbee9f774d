"""Where a command may write: never into a directory that holds files it did not write.

The converters (``tools/convert_*.py``) write a checkpoint into ``--save``; a non-empty
directory there is someone's work (a trainer checkpoint, another export), so it is refused
unless the user passes ``--overwrite`` (files of the same names are then replaced; nothing
else is deleted).
"""

from __future__ import annotations

import os

from .dist_ckpt import CheckpointError


def check_output_dir(path: str, flag: str = "--save", overwrite: bool = False) -> None:
    """Raise :class:`CheckpointError` (one line naming ``flag``, the path and the fix) when
    ``path`` is a file, or a directory that is not empty and ``overwrite`` is not set."""
    if os.path.isfile(path):
        raise CheckpointError(f"{flag} {path}: is a file, not a directory; give a directory to write into")
    if not os.path.isdir(path):
        return
    entries = sorted(os.listdir(path))
    if entries and not overwrite:
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise CheckpointError(
            f"{flag} {path}: the directory is not empty ({len(entries)} entries: {shown}); write into a new "
            "directory, or pass --overwrite to write into this one (files of the same names are replaced, "
            "nothing else is deleted)"
        )
