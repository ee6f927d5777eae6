"""Writing results safely: check the output folder first, write files atomically.

A run that fails on bad input must leave existing results as they were, so scripts call
:func:`prepare_out_dir` before any work and write every file with :func:`write_atomic`
(a temporary file in the same folder, then ``os.replace``).
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from cpcfl_tf.errors import UserError


def prepare_out_dir(path: str | os.PathLike) -> Path:
    """Create ``path`` if needed and check that files can be written there."""
    out = Path(path).expanduser()
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".probe-"):
            pass
    except OSError as err:
        raise UserError(f"cannot write to {out} ({err.strerror or err}); pass --out DIR "
                        "with a writable folder") from None
    return out


def write_atomic(path: str | os.PathLike, write: Callable[[str], None]) -> Path:
    """Call ``write(tmp_path)`` on a temporary file next to ``path``, then rename it."""
    path = Path(path)
    # Keep every suffix: Keras insists on names ending in ".keras" or ".weights.h5".
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.",
                               suffix="".join(path.suffixes))
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def write_json(path: str | os.PathLike, record: Any) -> Path:
    """Write ``record`` as indented JSON, atomically."""
    def dump(tmp: str) -> None:
        with open(tmp, "w") as fh:
            json.dump(record, fh, indent=1, sort_keys=False)
            fh.write("\n")

    return write_atomic(path, dump)


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (e.g. a markdown table), atomically."""
    def dump(tmp: str) -> None:
        with open(tmp, "w") as fh:
            fh.write(text)

    return write_atomic(path, dump)


def write_csv(path: str | os.PathLike, rows: list[dict]) -> Path:
    """Write ``rows`` (dicts with the same keys) as CSV with a header, atomically."""
    import csv
    import io

    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return write_text(path, buffer.getvalue())
