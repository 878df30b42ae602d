"""Small files written whole: readers see the old file or the new one, never half of one.

Why one home: run records, checkpoints' side files, telemetry sidecars and the weights directory
are all written by renaming a finished temporary file into place, and each must name its file
when the disk refuses it. An ``OSError`` from ``write()`` or ``close()`` carries no file name
(only ``open()`` sets one), so a full disk surfaced as "no space left on device" with nothing
to say where; :func:`write_atomically` names the file it was writing.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path


def write_atomically(path: str | os.PathLike[str], data: str | bytes, private: bool = False) -> None:
    """Write ``data`` to ``path`` through a temporary file beside it and a rename.

    ``private``: owner-only (0600) rather than 0644, before the umask. A refused write (full disk,
    read-only, no permission) raises ``OSError`` naming ``path`` and leaves no temporary file behind.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.replace(tmp, path)
    except OSError as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # not ours to remove (a read-only folder): nothing was written there either
        if exc.errno is not None and exc.filename in (None, str(tmp)):
            raise OSError(exc.errno, os.strerror(exc.errno), str(path)) from exc
        raise
