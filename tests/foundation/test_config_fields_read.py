"""One source of truth per flag: every config field is read by the code it configures.

A flag that nothing reads does nothing while its help text says otherwise. This scans the
Python sources of megatron_dapo/ (except megatron_dapo/config/, which defines, parses and
validates the fields), tools/ and examples/ with ``ast`` for reads ``X.<field>`` where ``X`` is
the field's section: ``cfg.rollout.temperature``, ``self.cfg.algo.kl_coef``, or a name bound to
the section (``r = cfg.rollout``, ``r, a = cfg.rollout, cfg.algo``, a parameter called
``algo``/``reward_cfg`` or annotated ``RewardConfig``, and names assigned from those).
Fields read only by name (``getattr``) or only inside config/ are listed in ``ALLOWED`` with
the reason.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib

from megatron_dapo.config.schema import DAPOConfig

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCANNED = ("megatron_dapo", "tools", "examples")
EXCLUDED = ROOT / "megatron_dapo" / "config"
SECTIONS = {f.name: f.default_factory for f in dataclasses.fields(DAPOConfig)}

#: (section, field) -> why it is not read as ``X.<field>`` outside config/.
ALLOWED = {
    ("algo", "algorithm"): "selects the preset that config/cli.py applies to the other algo fields at parse time",
    ("rollout", "offload_train"): "resolved with its placement-dependent default by config/validate.py's "
    "offload_train_default, which train.py calls",
    ("model", "lora_target_modules"): "normalised by config/validate.py's lora_targets, which training/setup.py "
    "(the adapters) and training/train_checkpoint.py (the checkpoint's record) call",
}


def _chain(node) -> list:
    """``a.b.c`` -> ["a", "b", "c"]; [] when the chain does not start at a name."""
    out = []
    while isinstance(node, ast.Attribute):
        out.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return []
    out.append(node.id)
    return out[::-1]


def _section_of_name(name: str) -> set:
    return {s for s in SECTIONS if name in (s, f"{s}_cfg", f"{s}_config")}


def _aliases(tree: ast.AST) -> dict:
    """name -> sections it is bound to, anywhere in the module (deliberately coarse)."""
    classes = {cls.__name__: s for s, cls in SECTIONS.items()}
    aliases: dict = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.arg):
            secs = _section_of_name(node.arg)
            if node.annotation is not None:
                ann = ast.unparse(node.annotation)
                secs |= {s for c, s in classes.items() if c in ann}
            if secs:
                aliases.setdefault(node.arg, set()).update(secs)
    changed = True
    while changed:
        changed = False
        for node in ast.walk(tree):
            if not isinstance(node, ast.Assign) or len(node.targets) != 1:
                continue
            t, v = node.targets[0], node.value
            pairs = list(zip(t.elts, v.elts)) if isinstance(t, ast.Tuple) and isinstance(v, ast.Tuple) else [(t, v)]
            for tgt, val in pairs:
                if not isinstance(tgt, ast.Name):
                    continue
                chain = _chain(val)
                secs = set()
                if chain and chain[-1] in SECTIONS and len(chain) > 1:
                    secs.add(chain[-1])
                if len(chain) == 1:
                    secs |= aliases.get(chain[0], set()) | _section_of_name(chain[0])
                if secs - aliases.get(tgt.id, set()):
                    aliases.setdefault(tgt.id, set()).update(secs)
                    changed = True
    return aliases


def field_reads() -> dict:
    """section -> {field names read as X.<field> with X that section} over the scanned sources."""
    reads = {s: set() for s in SECTIONS}
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            if EXCLUDED in path.parents:
                continue
            tree = ast.parse(path.read_text(), filename=str(path))
            aliases = _aliases(tree)
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)):
                    continue
                chain = _chain(node.value)
                if not chain:
                    continue
                secs = set()
                if chain[-1] in SECTIONS and len(chain) > 1:
                    secs.add(chain[-1])
                if len(chain) == 1:
                    secs |= aliases.get(chain[0], set()) | _section_of_name(chain[0])
                for s in secs:
                    reads[s].add(node.attr)
    return reads


def test_every_config_field_is_read_outside_config():
    reads = field_reads()
    unread = [
        f"{s}.{f.name} ({f.metadata.get('flag', '--' + f.name.replace('_', '-'))})"
        for s, cls in SECTIONS.items()
        for f in dataclasses.fields(cls)
        if f.name not in reads[s] and (s, f.name) not in ALLOWED
    ]
    assert not unread, (
        "config fields that no code outside megatron_dapo/config/ reads (wire them or remove them; a field "
        f"read only by name goes into ALLOWED with the reason): {', '.join(unread)}"
    )


def test_allowed_entries_are_real_fields_with_reasons():
    for (s, name), why in ALLOWED.items():
        assert name in {f.name for f in dataclasses.fields(SECTIONS[s])}, (s, name)
        assert len(why) > 20


def test_the_scan_sees_a_known_read_and_misses_a_removed_flag():
    reads = field_reads()
    assert "temperature" in reads["rollout"] and "kl_coef" in reads["algo"] and "num_workers" in reads["reward"]
    assert "min_lr" not in reads["optim"]  # no such flag: the schedule is warm-up, then the constant --lr
