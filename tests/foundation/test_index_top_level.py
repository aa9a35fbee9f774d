"""scripts/index_top_level.py: the top_level.txt files setup writes answer exactly what the
standard library would infer, and pip can still remove them."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("index_top_level", ROOT / "scripts" / "index_top_level.py")
index_top_level = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(index_top_level)


def _fake_dist(site: Path, name: str, top_level=None) -> Path:
    """A wheel-like install: a package, a top-level module, a script outside site-packages, and a
    RECORD (without a final newline) that also lists a file that is gone."""
    (site / f"{name}_pkg").mkdir(parents=True)
    (site / f"{name}_pkg" / "__init__.py").write_text("")
    (site / f"{name}_mod.py").write_text("")
    info = site / f"{name}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    lines = [
        f"{name}_pkg/__init__.py,,",
        f"{name}_mod.py,,",
        f"{name}_gone/x.py,,",
        "../../bin/tool,,",
        f"{info.name}/METADATA,,",
        f"{info.name}/RECORD,,",
    ]
    if top_level is not None:
        (info / "top_level.txt").write_text(top_level)
        lines.append(f"{info.name}/top_level.txt,,")
    (info / "RECORD").write_text("\n".join(lines))
    return info


def test_the_written_names_are_the_inferred_ones_and_pip_can_remove_the_file(tmp_path):
    info = _fake_dist(tmp_path, "fakedist")
    kept = _fake_dist(tmp_path, "declared", top_level="something_else\n")
    (dist,) = [d for d in md.distributions(path=[str(tmp_path)]) if d.metadata["Name"] == "fakedist"]
    inferred = index_top_level.inferred_names(dist)
    # the standard library's own rule (Python 3.12 also drops files that are gone; 3.11 does not)
    assert {"fakedist_pkg", "fakedist_mod"} <= set(inferred), inferred

    assert index_top_level.index([str(tmp_path)]) == ["fakedist"]
    assert (info / "top_level.txt").read_text().split() == inferred
    # what packages_distributions() reads first now, for this distribution: the same names
    (dist,) = [d for d in md.distributions(path=[str(tmp_path)]) if d.metadata["Name"] == "fakedist"]
    assert sorted(dist.read_text("top_level.txt").split()) == inferred
    record = (info / "RECORD").read_text().splitlines()
    assert record[-2] == f"{info.name}/RECORD,," and record[-1] == f"{info.name}/top_level.txt,,", record
    assert f"{info.name}/top_level.txt" in [str(f) for f in dist.files]  # pip uninstall removes it
    assert (kept / "top_level.txt").read_text() == "something_else\n"  # a declared file is never touched
    assert index_top_level.index([str(tmp_path)]) == []  # idempotent


def test_setup_indexed_this_environment():
    """scripts/setup_env.sh ran it: no distribution of this environment is left for the slow inference."""
    site = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    left = [
        d.metadata["Name"]
        for d in md.distributions(path=site)
        if d.read_text("top_level.txt") is None and index_top_level.inferred_names(d)
    ]
    assert left == [], f"run: python scripts/index_top_level.py ({len(left)} left: {left[:5]})"
