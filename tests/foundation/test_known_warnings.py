"""Known-harmless library warnings are filtered at the entry points, by message, and nothing else
(issue 38, item 8): the real libraries' own warnings in a fresh process."""

from __future__ import annotations

import os
import subprocess
import sys

from megatron_dapo import known_warnings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# a fresh interpreter: import what a trainer rank imports (megatron-core's optimizer, its GPT layer
# spec), then warn as megatron-core would about something else, and as this package would
_PROBE = r"""
import sys, warnings
warnings.simplefilter("default")
import megatron_dapo  # its import hook, as in every entry point (megatron-core's optional CUDA kernels)
if sys.argv[1] == "quiet":
    from megatron_dapo.known_warnings import quiet_known_warnings
    quiet_known_warnings()
import megatron.core.optimizer  # "Transformer Engine and Apex are not installed ..."
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
get_gpt_layer_local_spec()  # "Apex is not installed. Falling back to Torch Norm"
warnings.warn_explicit("a new megatron-core warning", UserWarning, "x.py", 1, module="megatron.core.x")
warnings.warn_explicit("Apex is not installed, said by another library", UserWarning, "y.py", 1, module="other")
warnings.warn("a warning of megatron_dapo's own", UserWarning)
"""


def _probe(mode: str, **env) -> str:
    e = {k: v for k, v in os.environ.items() if k != known_warnings.SHOW_ENV}
    e.update(PYTHONPATH=ROOT, OMP_NUM_THREADS="1", **env)
    p = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], cwd=ROOT, env=e, capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stderr


def test_only_the_known_warnings_are_filtered_and_the_switch_shows_them_again():
    loud = _probe("loud")
    assert "Apex are not installed" in loud and "Falling back to Torch Norm" in loud, loud  # the libraries do warn
    quiet = _probe("quiet")
    assert "Apex are not installed" not in quiet and "Falling back to Torch Norm" not in quiet, quiet
    for other in ("a new megatron-core warning", "said by another library", "a warning of megatron_dapo's own"):
        assert other in quiet, (other, quiet)  # the same library's other warnings, and ours, still print
    shown = _probe("quiet", **{known_warnings.SHOW_ENV: "1"})
    assert "Apex are not installed" in shown and "Falling back to Torch Norm" in shown, shown


def test_every_known_warning_says_why_and_names_its_library():
    for k in known_warnings.KNOWN:
        assert issubclass(k.category, Warning) and k.message and len(k.why) > 20, k
        assert k.module is None or k.module.startswith(("megatron", "torch")), k
    # a warning with no module named is matched by its whole distinctive message alone
    assert all(len(k.message) > 40 for k in known_warnings.KNOWN if k.module is None)
