"""Small real files the tests use, vendored so that a clone needs nothing beside it.

``DATA`` is this folder (``eval/``, ``train/``, ``verifier/``; provenance and licenses in
README.md). :func:`qwen2_tokenizer_dir` returns a directory that
``AutoTokenizer.from_pretrained`` loads: the real Qwen2 BPE tokenizer, stored here
xz-compressed and unpacked once into the cache (``$MEGATRON_DAPO_CACHE``, default
``~/.cache/megatron_dapo``; several test processes may race: the unpacking is atomic).
"""

from __future__ import annotations

import hashlib
import lzma
import os
import shutil
import tempfile
from pathlib import Path

DATA = Path(__file__).resolve().parent
_TOKENIZER = DATA / "qwen2-tokenizer"


def qwen2_tokenizer_dir() -> str:
    """A directory with the Qwen2 tokenizer (tokenizer.json, tokenizer_config.json, chat template)."""
    packed = _TOKENIZER / "tokenizer.json.xz"
    digest = hashlib.sha256(packed.read_bytes()).hexdigest()[:12]
    cache = Path(os.environ.get("MEGATRON_DAPO_CACHE", Path.home() / ".cache" / "megatron_dapo"))
    target = cache / "test-data" / f"qwen2-tokenizer-{digest}"
    if (target / "tokenizer.json").exists():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".unpack-", dir=target.parent))
    try:
        with lzma.open(packed) as src, open(tmp / "tokenizer.json", "wb") as dst:
            shutil.copyfileobj(src, dst)
        for name in ("tokenizer_config.json", "chat_template.jinja"):
            shutil.copy(_TOKENIZER / name, tmp / name)
        try:
            os.rename(tmp, target)  # atomic; fails if another process got there first
        except OSError:
            if not (target / "tokenizer.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return str(target)
