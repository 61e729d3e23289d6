"""Where the course keeps what it builds once per machine: the converted embedded model
(models.py) and the compiled kernels of the fast backend (backend.py)."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The cache root (override with the SPECDECODE_CACHE variable)."""
    root = os.environ.get("SPECDECODE_CACHE") or Path.home() / ".cache" / "specdecode"
    return Path(root)


__all__ = ["cache_dir"]
