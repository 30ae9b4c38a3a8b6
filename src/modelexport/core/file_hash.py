"""sha256 of a large file, remembered by (path, size, mtime) so a 100 MB GGUF is hashed once.

Cache keys of LLM artifacts are content addresses (the weights' sha256 plus options); hashing a
GGUF on every `generate` would cost a noticeable fraction of a second, so the digest is kept
in the cache folder under a key made of the file's identity. Touching or replacing the file
changes its mtime or size and forces a new hash.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .cache import cache_root


def _memo_dir() -> Path:
    return cache_root() / "file-sha256"


def file_sha256(path: str | Path, chunk: int = 1 << 22) -> str:
    p = Path(path).resolve()
    st = p.stat()
    ident = hashlib.sha256(f"{p}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()
    memo = _memo_dir() / f"{ident}.json"
    try:
        return json.loads(memo.read_text())["sha256"]
    except (OSError, ValueError, KeyError):
        pass
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    digest = h.hexdigest()
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"path": str(p), "size": st.st_size, "sha256": digest}))
        os.replace(tmp, memo)
    except OSError:
        pass  # a read-only cache only costs a re-hash next time
    return digest
