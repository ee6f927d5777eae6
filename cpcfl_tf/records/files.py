"""Writing and reading back results safely.

A run that fails on bad input must leave existing results as they were, so scripts call
:func:`prepare_out_dir` before any work and write every file with :func:`write_atomic`
(a temporary file in the same folder, then ``os.replace``; the file gets the permissions
the user's umask gives). Every file the kit reads back (results, cache entries,
checkpoints) goes through :func:`read_file`, which turns damage (a truncated file, not
JSON, not an archive) into :class:`DamagedFile`: one line that names the file and the fix.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from cpcfl_tf.errors import UserError

T = TypeVar("T")


PARTIAL = ".partial-"
"""Marks the temporary files of :func:`write_atomic`: ``.<name>.partial-<pid>-...``."""


def prepare_out_dir(
    path: str | os.PathLike, *, fix: str = "pass --out DIR with a writable folder"
) -> Path:
    """Create ``path`` if needed, check that files can be written there, and remove what
    killed writers left behind (:func:`remove_stale_partials`). ``fix`` ends the error
    when it cannot be written: it names the setting at fault."""
    out = Path(path).expanduser()
    if out.exists() and not out.is_dir():
        raise UserError(f"cannot write to {out} (a file, not a folder); {fix}")
    try:
        out.mkdir(parents=True, exist_ok=True)
        remove_stale_partials(out)
        with tempfile.NamedTemporaryFile(dir=out, prefix=f".probe{PARTIAL}{os.getpid()}-"):
            pass
    except OSError as err:
        raise UserError(f"cannot write to {out} ({err.strerror or err}); {fix}") from None
    return out


class DamagedFile(UserError):
    """A file the kit wrote cannot be read back."""

    def __init__(self, path: Path, reason: str, fix: str):
        super().__init__(f"{path} is damaged ({reason}); {fix}")
        self.path, self.reason = path, reason


def read_file(path: str | os.PathLike, load: Callable[[Path], T], *, fix: str) -> T:
    """``load(path)``, with any failure to read or parse turned into :class:`DamagedFile`
    (``fix`` says what to do, e.g. "delete it to rerun the run")."""
    path = Path(path)
    try:
        return load(path)
    except UserError:
        raise
    except Exception as err:  # truncated, not JSON, not a zip archive, missing keys, ...
        reason = type(err).__name__ + (
            f": {err}" if isinstance(err, (json.JSONDecodeError, UnicodeDecodeError)) else ""
        )
        raise DamagedFile(path, reason.splitlines()[0][:120], fix) from None


def read_cache_entry(
    path: str | os.PathLike, load: Callable[[Path], T], *, rebuild: str
) -> T | None:
    """A cache file read with ``load``; damage is not fatal there: it is said in one
    warning line (``rebuild`` says how it is redone) and ``None`` is returned."""
    try:
        return read_file(path, load, fix=rebuild)
    except DamagedFile as err:
        print(f"warning: {err}", file=sys.stderr, flush=True)
        return None


def read_json(path: str | os.PathLike, *, fix: str) -> Any:
    """A JSON file the kit wrote (see :func:`read_file`)."""
    return read_file(path, lambda p: json.loads(p.read_text()), fix=fix)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def remove_stale_partials(folder: Path, name: str = "*") -> list[Path]:
    """Delete the temporary files (or folders) a killed writer left in ``folder`` (of
    files called ``name``): those whose writing process no longer runs. Returns what was
    deleted."""
    removed = []
    for partial in folder.glob(f".{name}{PARTIAL}*"):
        pid = partial.name.split(PARTIAL, 1)[1].split("-", 1)[0]
        if pid.isdigit() and not _running(int(pid)):
            if partial.is_dir():
                shutil.rmtree(partial, ignore_errors=True)
            else:
                partial.unlink(missing_ok=True)
            removed.append(partial)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_atomic(path: str | os.PathLike, write: Callable[[str], None]) -> Path:
    """Call ``write(tmp_path)`` on a temporary file next to ``path``, then rename it. A
    process killed meanwhile leaves ``path`` as it was and a partial file that the next
    write of ``path`` (or :func:`prepare_out_dir`) removes."""
    path = Path(path)
    remove_stale_partials(path.parent, path.name)
    # Keep every suffix: Keras insists on names ending in ".keras" or ".weights.h5".
    fd, tmp = tempfile.mkstemp(
        dir=path.parent,
        prefix=f".{path.name}{PARTIAL}{os.getpid()}-",
        suffix="".join(path.suffixes),
    )
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give what open() would
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


CACHE_FIX = "set CPCFL_CACHE to a writable folder"
"""What to do when the cache cannot be written (the end of the error)."""


def cache_root() -> Path:
    """Where built encoders are kept for reuse by any script: ``$CPCFL_CACHE`` or
    ``./cache``."""
    return Path(os.environ.get("CPCFL_CACHE", "cache")).expanduser()


@contextlib.contextmanager
def building(entry: str | os.PathLike, *, say: Callable[[str], None] | None = None):
    """Build the cache entry ``entry`` (a folder or a file) in one process at a time: a
    process that needs an entry another one is building waits here until that one is
    done, then reads what it built (or resumes what it left, had it been killed), instead
    of building it again beside it. Several processes of a study share one cache, and
    each starts by asking for the same encoders. The lock is an exclusive ``flock`` on
    ``.<name>.lock`` beside the entry, which the kernel releases when its holder ends,
    killed or not; ``say`` hears one line when the wait begins. Where the cache cannot be
    written the lock is skipped: the entry's own writes then say why, in one line."""
    entry = Path(entry)
    try:
        import fcntl

        handle = open(entry.parent / f".{entry.name}.lock", "a")
    except (ImportError, OSError):  # no flock (Windows), or a read-only cache
        yield
        return
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if say:
                say(f"waiting for another process to finish building {entry}")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def cache_at(folder: str | os.PathLike):
    """:func:`cache_root` is ``folder`` inside the block; ``$CPCFL_CACHE`` is what it
    was afterwards (a script run in a notebook or a test leaves the caller's cache)."""
    before = os.environ.get("CPCFL_CACHE")
    os.environ["CPCFL_CACHE"] = str(folder)
    try:
        yield Path(folder)
    finally:
        if before is None:
            os.environ.pop("CPCFL_CACHE", None)
        else:
            os.environ["CPCFL_CACHE"] = before


def write_weights(path: str | os.PathLike, weights: list, *, key: str | None = None) -> Path:
    """Save a list of arrays (an encoder's weights) as ``.npz``, atomically; ``key`` (what
    built them) is stored beside them and checked by :func:`read_weights`."""
    import numpy as np

    arrays = {f"w{i}": w for i, w in enumerate(weights)}
    if key is not None:
        arrays = {"__key__": np.array(key), **arrays}

    def save(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return write_atomic(path, save)


def read_weights(path: str | os.PathLike, *, key: str | None = None, rebuild: str) -> list | None:
    """The arrays :func:`write_weights` saved, or ``None`` when there are none, they are
    damaged (one warning line, ``rebuild`` says what happens instead) or belong to
    another ``key``."""
    import numpy as np

    path = Path(path)
    if not path.exists():
        return None

    def load(p: Path) -> list:
        with np.load(p) as stored:
            if key is not None and str(stored["__key__"]) != key:
                raise KeyError("built from other settings")
            count = len([f for f in stored.files if f.startswith("w")])
            return [stored[f"w{i}"] for i in range(count)]

    return read_cache_entry(path, load, rebuild=rebuild)


def weights_fingerprint(weights: list | None) -> str | None:
    """First 16 hex digits of a SHA-256 over the arrays' dtypes, shapes and bytes, or
    ``None`` for no weights: names the exact starting encoder a record came from (a cache
    entry pre-trained on another machine has other bits, docs/experiments.md, "Bit for bit")."""
    if weights is None:
        return None
    import hashlib

    import numpy as np

    digest = hashlib.sha256()
    for w in weights:
        w = np.ascontiguousarray(w)
        digest.update(f"{w.dtype.str}{w.shape}".encode())
        digest.update(w.tobytes())
    return digest.hexdigest()[:16]


def write_csv(path: str | os.PathLike, rows: list[dict]) -> Path:
    """Write ``rows`` as CSV with a header, atomically: the columns are every key of the
    rows in the order first seen; a row without one leaves its cell empty."""
    import csv
    import io

    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(dict.fromkeys(k for r in rows for k in r)))
    writer.writeheader()
    writer.writerows(rows)
    return write_text(path, buffer.getvalue())
