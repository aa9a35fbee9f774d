"""Write the missing ``top_level.txt`` of every distribution installed in a virtualenv, so that
``importlib.metadata.packages_distributions()`` reads one small file per distribution instead of
checking that every file its RECORD lists exists.

Why: transformers calls ``packages_distributions()`` when it is imported, in every process that
imports it (the driver, every trainer and engine actor, SGLang's scheduler and detokenizer).
Wheels built by backends other than setuptools (hatchling, flit, maturin, ...) carry no
``top_level.txt``, and for them the standard library infers the names from the RECORD, one
``stat`` per file listed: in this project's primary environment 107 of 266 distributions,
about 50,000 files, 1.1-2.4 s of CPU per process (docs/benchmarks-log.md, "Suite time: the
metadata index").

The file written holds exactly the names the standard library infers (its own function, on the
same RECORD, over the files that exist), so ``packages_distributions()`` answers the same; its
line is added to the RECORD, so that ``pip uninstall`` removes it with the rest. Idempotent;
a distribution that already has the file, or whose inferred names are empty, is left alone.

    python scripts/index_top_level.py [SITE_PACKAGES ...]   (default: this interpreter's)
"""

from __future__ import annotations

import importlib.metadata as md
import os
import sys
import sysconfig

TOP_LEVEL = "top_level.txt"


def inferred_names(dist: md.Distribution):
    """The top-level names this Python's ``packages_distributions()`` infers for ``dist`` (its own
    private rule, which differs between versions: 3.11 counts ``.py`` files only), sorted; None
    where this Python has no such rule (nothing is written then)."""
    rule = getattr(md, "_top_level_inferred", None)
    return None if rule is None else sorted(set(rule(dist)))


def _dist_info_dir(dist: md.Distribution):
    """The distribution's metadata directory (``*.dist-info``) on disk, or None."""
    for f in dist.files or ():
        if len(f.parts) == 2 and f.parts[0].endswith(".dist-info") and f.parts[1] == "RECORD":
            return os.path.dirname(str(dist.locate_file(f)))
    return None


def index(paths) -> list:
    """Write the missing files under ``paths`` (site-packages directories); the names of the
    distributions given one."""
    done = []
    for dist in md.distributions(path=list(paths)):
        if dist.read_text(TOP_LEVEL) is not None:
            continue
        info = _dist_info_dir(dist)
        names = inferred_names(dist)
        if info is None or not names:
            continue
        tmp = os.path.join(info, TOP_LEVEL + ".tmp")
        with open(tmp, "w") as f:
            f.write("".join(n + "\n" for n in names))
        os.replace(tmp, os.path.join(info, TOP_LEVEL))
        record = os.path.join(info, "RECORD")
        with open(record, "rb") as f:
            ends_line = f.read().endswith(b"\n")
        with open(record, "a") as f:
            f.write(("" if ends_line else "\n") + f"{os.path.basename(info)}/{TOP_LEVEL},,\n")
        done.append(dist.metadata["Name"])
    return done


def main(argv=None) -> int:
    default = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    paths = (argv if argv is not None else sys.argv[1:]) or default
    done = index(paths)
    print(f"[setup] top_level.txt written for {len(done)} distribution(s) (scripts/index_top_level.py)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
