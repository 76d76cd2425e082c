"""Where things live: the repository root, the offline data sets, the decoded-data cache.

- Data sets are read from ``$THINWIRE_DATA`` if set, else ``<repo>/../shared/data``.
- Decoded arrays are cached under ``$THINWIRE_CACHE`` if set, else ``<repo>/.cache`` (git-ignored);
  never beside the source data, which may be read-only.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def data_root() -> Path:
    env = os.environ.get("THINWIRE_DATA")
    return Path(env).expanduser().resolve() if env else (REPO_ROOT.parent / "shared" / "data").resolve()


def cache_root() -> Path:
    env = os.environ.get("THINWIRE_CACHE")
    root = Path(env).expanduser().resolve() if env else REPO_ROOT / ".cache"
    root.mkdir(parents=True, exist_ok=True)
    return root
