"""Source-file checks: presence, and sha256 against the table in ``../shared/data/README.md``.

A file's digest is computed once and remembered under ``cache_root()/sha256/``, keyed by its path,
size and mtime, so a load with a warm cache does not re-read the source data.
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

from ..fileio import atomic_write_text
from ..paths import cache_root
from .base import DataError

log = logging.getLogger(__name__)

SKIP_CHECKSUM_ENV = "THINWIRE_SKIP_CHECKSUM"

# From ../shared/data/README.md; keys are paths relative to the data root.
KNOWN_SHA256: dict[str, str] = {
    "cifar10/cifar10_jpg.tar.xz": "07566ca646092632b050b784f207dbcc923052a7ace42a53fc6d8441c2b9b47b",
    "fashion-mnist/t10k-images-idx3-ubyte.gz": "55ec2dd7358c56fba81678bf2cd00a44de07bae64c342921600298a2b5eb517d",
    "fashion-mnist/t10k-labels-idx1-ubyte.gz": "bad34aa92450454a281e4959ab5a22f03213e21212f4261dadf52e42fa6cd580",
    "fashion-mnist/train-images-idx3-ubyte.gz": "f46450982819e161325683178a5324fc64e606fb3758c65c6ca7dcc91aa489fd",
    "fashion-mnist/train-labels-idx1-ubyte.gz": "bee2410e017aef275ad0716cfa389481fe80dd89f974536e863d982da161f14c",
    "mnist/t10k-images-idx3-ubyte.gz": "1a1a05eab793c14bb050b398624a11b0ffd1a2953baed553b1b9bd079e2a20be",
    "mnist/t10k-labels-idx1-ubyte.gz": "b91679a0acfe4ba0e50a2437a903084cba1f5f92592b016a25a7dfd00455798b",
    "mnist/train-images-idx3-ubyte.gz": "0b367032e93c5d0cea0925647cfdb18614af8ee15f83e6f2fc2ad904a6835971",
    "mnist/train-labels-idx1-ubyte.gz": "1787548bbe0bff1ec2ecdc0ef292b02df999e2d1a6002d27500982c652b17203",
    "text/ptb.test.txt": "dd65dff31e70846b2a6030a87482edcd5d199130cdcfa1f3dccbb033728deee0",
    "text/ptb.train.txt": "fcea919f6cf83f35d4d00c6cbf08040d13d4155226340912e2fef9c9c4102cbf",
    "text/ptb.valid.txt": "c9fe6985fe0d4ccb578183407d7668fc6066c20700cb4cf87d8ff1cc34df1bf2",
    "text/tinyshakespeare.txt": "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed",
}


def skip_checksum() -> bool:
    return os.environ.get(SKIP_CHECKSUM_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def _hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def file_sha256(path: Path) -> str:
    """sha256 of ``path``, computed once per (path, size, mtime) and remembered in the cache folder."""
    path = path.resolve()
    stat = path.stat()
    path_key = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    memo = cache_root() / "sha256" / f"{path.name}.{stat.st_size}.{stat.st_mtime_ns}.{path_key}"
    try:
        remembered = memo.read_text().strip()
        if len(remembered) == 64 and all(c in "0123456789abcdef" for c in remembered):
            return remembered
    except OSError:
        pass
    digest = _hash_file(path)
    atomic_write_text(memo, digest + "\n")
    return digest


def check_sources(name: str, root: Path, folder: str, files: tuple[str, ...]) -> list[str]:
    """Check that ``root/folder/files`` exist and match their known sha256; return their digests.

    Raises ``DataError`` naming the folder, the expected files and ``THINWIRE_DATA`` when a file is
    missing, and the path, both digests and ``THINWIRE_SKIP_CHECKSUM`` on a digest mismatch.
    """
    where = root / folder
    expected = ", ".join(files)
    fix = (
        f"Set THINWIRE_DATA to the folder that holds '{folder}/' (now {root}), or pass root= to load_dataset."
    )
    if not where.is_dir():
        raise DataError(
            f"data set {name!r}: folder {where} does not exist; expected these files there: {expected}. {fix}"
        )
    missing = [f for f in files if not (where / f).is_file()]
    if missing:
        raise DataError(
            f"data set {name!r}: missing {', '.join(missing)} in {where}; expected these files there: "
            f"{expected}. {fix}"
        )
    digests = []
    for file in files:
        path = where / file
        actual = file_sha256(path)
        known = KNOWN_SHA256.get(f"{folder}/{file}")
        if known is not None and actual != known:
            if not skip_checksum():
                raise DataError(
                    f"data set {name!r}: sha256 mismatch for {path}: expected {known}, got {actual}. "
                    "The file is corrupt or a different copy: restore it from ../shared/data, or set "
                    f"{SKIP_CHECKSUM_ENV}=1 to accept a different but valid copy (its structure is still "
                    "checked)."
                )
            log.warning(
                "sha256 of %s is %s, not the known %s; accepted because %s is set",
                path,
                actual,
                known,
                SKIP_CHECKSUM_ENV,
            )
        digests.append(actual)
    return digests
