"""Carry the starting encoders of a results tree from one machine to another.

Pre-training is deterministic on one kind of CPU but not across kinds, so a new machine
that pre-trains again starts its runs from other bits (docs/experiments.md, "Bit for
bit"). Every run record names the encoder it started from (``environment.starting_encoder``,
a fingerprint of its weights). This tool finds those encoders in the cache
(``$CPCFL_CACHE``), packs them into one archive, and puts them into another machine's
cache, where every script finds them and pre-trains nothing::

    python tools/encoders.py status --results results/standard   # needed, and cached here?
    python tools/encoders.py pack --results results/standard --out encoders.tar
    python tools/encoders.py unpack encoders.tar                 # on the other machine

``unpack`` checks each encoder's fingerprint before it goes into the cache and refuses
to replace a cached encoder that has other bits (``--force`` replaces it).
"""
from __future__ import annotations

import collections
import contextlib
import io
import json
import os
import shutil
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

from cpcfl_tf.errors import ArgumentParser, UserError, run_cli
from cpcfl_tf.records.files import PARTIAL, cache_root, prepare_out_dir, write_atomic

MANIFEST = "manifest.json"


def needed(results: Path) -> dict[str, dict]:
    """The starting encoders the run records under ``results`` name: fingerprint ->
    ``{"records": [paths], "pretraining": [...], "cpu": [the CPUs the runs ran on]}``."""
    from cpcfl_tf.records.environment import machine
    from cpcfl_tf.records.store import RecordIndex

    out: dict[str, dict] = collections.defaultdict(
        lambda: {"records": [], "pretraining": set(), "cpu": set()})
    for found in RecordIndex(results):
        fingerprint = found.record.environment.get("starting_encoder")
        if fingerprint:
            entry = out[fingerprint]
            entry["records"].append(str(found.path))
            entry["pretraining"].add(found.record.requested.federated.pretraining)
            entry["cpu"].add(machine(found.record.environment) or "CPU not recorded")
    return {k: {**v, "pretraining": sorted(v["pretraining"]), "cpu": sorted(v["cpu"])}
            for k, v in sorted(out.items())}


LEFT_OUT = ("checkpoint.npz", "encoder.weights.h5")
"""Files of a cache entry an archive leaves out: a resumable pre-training's checkpoint
(not an encoder yet) and the weights-only copy of ``encoder.keras`` (nothing reads it back;
it would double the archive)."""


def _files(entry: Path) -> list[Path]:
    """What a cache entry is made of, as an archive carries it."""
    if entry.is_file():
        return [entry]
    return sorted(p for p in entry.iterdir()
                  if p.is_file() and p.name not in LEFT_OUT and not p.name.startswith("."))


def _is_entry(entry: Path) -> bool:
    """Whether ``entry`` names a place in the cache where an encoder lives, and nothing
    outside it."""
    return (len(entry.parts) == 2 and ".." not in entry.parts and not entry.is_absolute()
            and (entry.parts[0] == "pretrained"
                 or (entry.parts[0] == "fedavg" and entry.suffix == ".npz")))


def _tree(results: str) -> Path:
    path = Path(results)
    if not path.is_dir():
        raise UserError(f"--results {path} is not a folder; pass a folder of run records "
                        "(e.g. results/standard)")
    return path


def status(args) -> None:
    from cpcfl_tf.clustered.starting import cache_entries

    wanted, cached = needed(_tree(args.results)), cache_entries()
    if not wanted:
        print(f"no record under {args.results} starts from a trained encoder")
        return
    for fingerprint, entry in wanted.items():
        where = (f"cached: {cached[fingerprint]}" if fingerprint in cached
                 else "not in this cache (a run here makes it again: "
                      + ("from its FedAvg (None) run)" if entry["pretraining"] == ["fedavg"]
                         else "other bits on another kind of CPU)"))
        print(f"{fingerprint}  {'/'.join(entry['pretraining'])}, {len(entry['records'])} "
              f"records (runs on {', '.join(entry['cpu'])}); {where}")
    have = sum(f in cached for f in wanted)
    print(f"{have} of {len(wanted)} starting encoders in {cache_root()}")


def pack(args) -> None:
    from cpcfl_tf.clustered.starting import cache_entries

    wanted, cached = needed(_tree(args.results)), cache_entries()
    packed = {f: cached[f] for f in wanted if f in cached
              and (args.only is None or cached[f].relative_to(cache_root()).parts[0] == args.only)}
    if not packed:
        raise UserError(f"none of the {len(wanted)} starting encoders the records under "
                        f"{args.results} name is in {cache_root()}; run the scripts that "
                        "made them here first, or set CPCFL_CACHE")
    out = Path(args.out)
    prepare_out_dir(out.parent, fix="pass --out in a writable folder")
    root = cache_root()
    manifest = {"encoders": [{"fingerprint": f, "entry": str(path.relative_to(root)),
                              "pretraining": wanted[f]["pretraining"],
                              "runs_on": wanted[f]["cpu"], "records": wanted[f]["records"]}
                             for f, path in packed.items()]}

    def write(tmp: str) -> None:
        with tarfile.open(tmp, "w") as tar:
            data = json.dumps(manifest, indent=1).encode()
            info = tarfile.TarInfo(MANIFEST)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            for path in packed.values():
                for file in _files(path):
                    tar.add(file, arcname=str(file.relative_to(root)))

    write_atomic(out, write)
    missing = [f for f in wanted if f not in cached]
    left = [f for f in wanted if f in cached and f not in packed]
    size = out.stat().st_size / 2 ** 20
    print(f"wrote {out} ({size:.1f} MB): {len(packed)} of {len(wanted)} starting encoders"
          + (f"; not in this cache: {', '.join(missing)}" if missing else "")
          + (f"; left out by --only {args.only}: {', '.join(left)}" if left else ""))


def unpack(args) -> None:
    from cpcfl_tf.clustered.starting import entry_weights
    from cpcfl_tf.records.files import weights_fingerprint

    archive = Path(args.archive)
    try:
        tar = tarfile.open(archive)
        member = tar.extractfile(MANIFEST)
        if member is None:  # a folder of that name
            raise KeyError(MANIFEST)
        manifest = json.load(member)["encoders"]
    except (OSError, tarfile.TarError, KeyError, TypeError, ValueError) as err:
        raise UserError(f"{archive} is not an archive of tools/encoders.py pack "
                        f"({type(err).__name__}); pack it again") from None
    root = cache_root()
    prepare_out_dir(root, fix="set CPCFL_CACHE to a writable folder")  # removes a killed
    # unpack's folder (its name carries its pid, as write_atomic's partial files do)
    with tar, tempfile.TemporaryDirectory(dir=root,
                                          prefix=f".unpack{PARTIAL}{os.getpid()}-") as tmp:
        try:
            tar.extractall(tmp, filter="data")  # no path outside tmp, no links out
        except (OSError, tarfile.TarError) as err:
            raise UserError(f"{archive} cannot be unpacked ({err}); pack it again") from None
        # Every entry is checked before any goes into the cache.
        moves = []
        for item in manifest:
            entry, fingerprint = Path(item["entry"]), item["fingerprint"]
            if not _is_entry(entry):
                raise UserError(f"{archive}: {entry} is not a cache entry (pretrained/<name> "
                                "or fedavg/<name>.npz); pack it again")
            with contextlib.redirect_stderr(io.StringIO()):  # said below, in one line
                weights = entry_weights(Path(tmp) / entry)
            if weights is None:
                raise UserError(f"{archive}: {entry} is damaged (it does not load); pack it "
                                "again (a shipped archive: git checkout it)")
            got = weights_fingerprint(weights)
            if got != fingerprint:
                raise UserError(f"{archive}: {entry} holds encoder {got}, not {fingerprint} "
                                "as its manifest says; pack it again (a shipped archive: "
                                "git checkout it)")
            here = root / entry
            if here.exists():
                cached = weights_fingerprint(entry_weights(here))
                if cached == fingerprint:
                    print(f"{entry}: already cached ({fingerprint})")
                    continue
                if not args.force:
                    raise UserError(f"{here} holds another encoder ({cached}, not "
                                    f"{fingerprint}); pass --force to replace it")
            moves.append((Path(tmp) / entry, here, fingerprint))
        for source, here, fingerprint in moves:
            if here.is_dir():
                shutil.rmtree(here)
            elif here.exists():
                here.unlink()
            here.parent.mkdir(parents=True, exist_ok=True)
            source.rename(here)  # within one file system: whole or not at all
            print(f"{here.relative_to(root)}: unpacked ({fingerprint})")
    print(f"{len(moves)} of {len(manifest)} encoders unpacked into {root}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = ArgumentParser(prog="python tools/encoders.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, helps in (("status", "which starting encoders the records name; cached here?"),
                        ("pack", "write them into one archive")):
        sub = commands.add_parser(name, help=helps)
        sub.add_argument("--results", default="results",
                         help="a folder of run records (default results)")
        sub.set_defaults(run=status if name == "status" else pack)
    commands.choices["pack"].add_argument("--out", required=True, help="the archive (.tar)")
    commands.choices["pack"].add_argument(
        "--only", choices=["pretrained", "fedavg"],
        help="only the server's pre-trainings, or only FedAvg encoders (default: both)")
    sub = commands.add_parser("unpack", help="put an archive's encoders into $CPCFL_CACHE")
    sub.add_argument("archive")
    sub.add_argument("--force", action="store_true",
                     help="replace cached encoders that have other bits")
    sub.set_defaults(run=unpack)
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    run_cli(main)
