"""The record store: where a run's record is found, in its own folder or elsewhere in a
results tree.

* :class:`RecordIndex` finds the run records of a results tree by the config that made
  them, wherever a script wrote them (a run is the same whatever script asks for it),
  and the runs of one seed together (one encoder per pre-training, one kind of CPU);
* :class:`RecordStore` is what one output folder can give the runner: its own records,
  those a run may take from the rest of the tree (:attr:`RecordStore.reuse`), those its
  ``taken.json`` names, and which were taken and why.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from cpcfl_tf.errors import UserError
from cpcfl_tf.plan.config import Config
from cpcfl_tf.plan.identity import config_key, config_record
from cpcfl_tf.plan.resolve import RunPlan
from cpcfl_tf.records.environment import environment, machine, reproduces
from cpcfl_tf.records.record import RunRecord, read_record


@dataclasses.dataclass(frozen=True)
class Found:
    """A record of the index, with where it is."""

    path: Path
    record: RunRecord


class RecordIndex:
    """Every run record under ``root``, by :func:`config_key`.

    Where several records have one config (the same run asked for by two scripts, or made
    on two machines), :meth:`get` prefers one from the machine most of the tree's records
    name (:func:`~cpcfl_tf.records.environment.machine`: so a run remade on another machine for
    one pairing does not replace the record the rest of its seed is judged with; only
    the records of ``electing`` configs count where it is given), then
    one under ``prefer`` (a folder), then one that names its CPU (newer records), then
    the first path in sorted order. Records under ``exclude`` (a folder) are left out.
    ``linear_evals`` holds every ``linear_eval.json`` of the tree
    (``experiments/linear_eval.py``), read once.
    """

    def __init__(
        self,
        root: str | Path,
        prefer: str | Path | None = None,
        electing: Iterable[Config] | None = None,
        exclude: str | Path | None = None,
    ):
        self.root = Path(root)
        self.prefer = Path(prefer) if prefer else None
        self._by_key: dict[str, list[Found]] = {}
        self.linear_evals: list[tuple[Path, dict]] = []
        left_out = Path(exclude).resolve() if exclude is not None else None
        for path in sorted(self.root.rglob("*.json")):
            if left_out is not None and left_out in path.resolve().parents:
                continue  # a folder compared with the rest of the tree
            if path.name == "linear_eval.json":
                try:
                    self.linear_evals.append((path, json.loads(path.read_text())))
                except (OSError, ValueError):
                    pass  # a damaged evaluation counts as missing
                continue
            record = run_record_in(path)
            if record is not None:
                self._by_key.setdefault(config_key(record.requested), []).append(
                    Found(path, record)
                )
        voters = (
            self._by_key.values()
            if electing is None
            else [self._by_key.get(key, []) for key in {config_key(c) for c in electing}]
        )
        cpus = Counter(machine(f.record.environment) for found in voters for f in found)
        cpus.pop(None, None)
        self._most = cpus.most_common(1)[0][0] if cpus else None
        for found in self._by_key.values():
            found.sort(key=self._rank)

    def _rank(self, found: Found) -> tuple:
        preferred = self.prefer is not None and self.prefer in found.path.parents
        cpu = machine(found.record.environment)
        return (cpu != self._most, not preferred, cpu is None, str(found.path))

    def get(self, config: Config) -> Found | None:
        found = self.every(config)
        return found[0] if found else None

    def every(self, config: Config) -> list[Found]:
        """Every record of ``config``, the preferred first."""
        return list(self._by_key.get(config_key(config), []))

    def together(self, configs: Sequence[Config]) -> list[Found] | None:
        """One record of each config (None: one has none), chosen so that they are one
        sample of chance: runs of one pre-training start from one encoder
        (``environment.starting_encoder``) and, where the tree allows, ran on one
        machine. Among equals, the preferred (:meth:`every`'s order)."""
        return together([self.every(config) for config in configs])

    def add(self, path: Path, record: RunRecord) -> None:
        """Index a record written after the tree was read."""
        found = self._by_key.setdefault(config_key(record.requested), [])
        found.append(Found(Path(path), record))
        found.sort(key=self._rank)

    def __iter__(self) -> Iterator[Found]:
        """Every record of the tree, in path order."""
        return iter(
            sorted((f for found in self._by_key.values() for f in found), key=lambda f: str(f.path))
        )

    def preferred(self) -> Iterable[Found]:
        """The preferred record of every config in the tree."""
        return (found[0] for found in self._by_key.values())


def together(options: Sequence[Sequence[Found]]) -> list[Found] | None:
    """One of each list of ``options`` (each in preference order; None: one is empty),
    chosen so that they are one sample of chance (:meth:`RecordIndex.together`)."""
    if not all(options):
        return None
    # min keeps the first of the best, and product order is the preference order
    return list(
        min(itertools.product(*options), key=lambda chosen: mismatch([f.record for f in chosen]))
    )


def mismatch(records: Sequence[RunRecord]) -> tuple[bool, bool]:
    """(runs of one pre-training started from different encoders, the runs ran on more
    than one machine, :func:`~cpcfl_tf.records.environment.machine`): what keeps runs of one
    seed from being one sample of chance (:attr:`~cpcfl_tf.records.record.RunRecord.pretraining_key`
    says which runs share one)."""
    encoders: dict[tuple, set] = {}
    for r in records:
        if r.pretraining_key is not None:
            encoders.setdefault(r.pretraining_key, set()).add(r.environment.get("starting_encoder"))
    return (
        any(len(seen) > 1 for seen in encoders.values()),
        len({machine(r.environment) for r in records}) > 1,
    )


def run_record_in(path: Path) -> RunRecord | None:
    """The run record in ``path``, or None for other JSON files (reports, partitions,
    benchmarks). A damaged run record is a one-line error naming it."""
    try:
        data = json.loads(path.read_text())
    except ValueError:
        raise UserError(
            f"{path} is not valid JSON; restore it (git checkout) or delete it"
        ) from None
    if not (isinstance(data, dict) and {"config", "rounds", "final", "seeds"} <= set(data)):
        return None
    return read_record(path)


def same_config(record: RunRecord, run: RunPlan) -> bool:
    """Whether ``record`` is one of ``run``: as requested and, for federated runs, as
    it resolved (what a method implies can change, e.g. FedAvg (SimCLR)'s Tc phase)."""
    if config_record(record.requested) != config_record(run.requested):
        return False
    return not run.method.federated or record.config.federated == run.federated


class RecordStore:
    """The records one output folder can give its runs, and which it took.

    Its own (:attr:`folder`); those made elsewhere in the tree (:attr:`reuse`, when a
    script sets it), taken where this machine would make them bit for bit; and those the
    folder's :attr:`TAKEN` names, taken on any machine."""

    TAKEN = "taken.json"
    """The file in the output folder naming, per run, the record taken for it from
    :attr:`reuse` (:meth:`keep_taken`, called with the report:
    :meth:`~cpcfl_tf.running.script.Session.finish`)."""

    def __init__(self, out: Path, force: bool = False):
        self.out, self.force = Path(out), force
        self.reuse: RecordIndex | None = None
        """Records made elsewhere (e.g. by other scripts of the results tree): a run this
        machine would make bit for bit the same (same config, starting encoder and
        :data:`~cpcfl_tf.records.environment.REPRODUCING` fields) is taken from there instead of
        being run again, and not copied."""
        self.reused: dict[str, Path] = {}
        """Run name -> the record taken from :attr:`reuse` for it."""
        self.paired: set[str] = set()
        """Of :attr:`reused`, runs of a method with a base method taken because they start
        from the encoder the folder's base run started from (:meth:`twin`)."""
        self.named: set[str] = set()
        """Of :attr:`reused`, the runs taken because the folder's :attr:`TAKEN` names
        them, not because this machine would make them bit for bit."""
        self.stood_in: dict[str, tuple[str, Path]] = {}
        """Run name -> its method and the record taken for it: the run of the method its
        method is until its restart rule fires, in which the rule never fired."""

    @functools.cached_property
    def folder(self) -> RecordIndex:
        """The records of the output folder, by config (kept current by :meth:`add`)."""
        return RecordIndex(self.out)

    def add(self, path: Path, record: RunRecord) -> None:
        """A record just written into the output folder."""
        if self.reuse is not None:
            self.reuse.add(path, record)
        if "folder" in self.__dict__:
            self.folder.add(path, record)

    @functools.cached_property
    def _taken_file(self) -> dict[str, str]:
        """The folder's :attr:`TAKEN` as it was when first read (empty if there is none);
        a one-line error if it is damaged."""
        from cpcfl_tf.records.files import read_file

        def load(path: Path) -> dict[str, str]:
            taken = json.loads(path.read_text())
            if not isinstance(taken, dict):
                raise ValueError("not a map of run names to records")
            return taken

        path = self.out / self.TAKEN
        return (
            read_file(path, load, fix="restore it (git checkout) or delete it")
            if path.exists()
            else {}
        )

    def keep_taken(self) -> None:
        """Add the runs taken from :attr:`reuse` to the folder's :attr:`TAKEN`, so that a
        report elsewhere finds them."""
        from cpcfl_tf.records.files import write_json

        merged = {**self._taken_file, **{name: str(p) for name, p in self.reused.items()}}
        if merged != self._taken_file:
            write_json(self.out / self.TAKEN, dict(sorted(merged.items())))
            self._taken_file = merged

    def named_in_taken(self, name: str, run: RunPlan) -> Found | None:
        """The record the folder's :attr:`TAKEN` names for run ``name`` (noted in
        :attr:`reused` and :attr:`named`, or :attr:`paired` for a restart variant's run
        taken as its base run's twin), if it is there and is one of ``run``."""
        path = None if self.force else self._taken_file.get(name)
        if not path or not Path(path).is_file():
            return None
        record = read_record(Path(path))
        if not same_config(record, run):
            return None
        self.reused[name] = Path(path)
        restart_twin = bool(run.method.restarts_of)  # the record's: same_config
        (self.paired if restart_twin else self.named).add(name)
        return Found(Path(path), record)

    def base_run(self, base: RunPlan) -> Found | None:
        """The run of ``base`` this folder has: its own, or one taken from :attr:`reuse`."""
        taken = (
            []
            if self.reuse is None
            else [f for f in self.reuse.every(base.requested) if f.path in self.reused.values()]
        )
        return next(
            (
                f
                for f in [*self.folder.every(base.requested), *taken]
                if same_config(f.record, base)
            ),
            None,
        )

    def has_base(self, base: RunPlan) -> bool:
        """Whether a run of ``base`` is here or in :attr:`reuse`."""
        taken = [] if self.reuse is None else self.reuse.every(base.requested)
        return any(
            same_config(f.record, base) for f in [*self.folder.every(base.requested), *taken]
        )

    def twin(self, name: str, run: RunPlan, base: RunPlan) -> Found | None:
        """The record of ``run`` in :attr:`reuse` that starts from the encoder this
        folder's run of ``base`` started from, from any machine (noted in :attr:`reused`
        and :attr:`paired`): the restart run of that base run's sample of chance."""
        if self.reuse is None:
            return None
        made = next(
            (f for f in self.folder.every(base.requested) if same_config(f.record, base)), None
        )
        encoder = made and made.record.environment.get("starting_encoder")
        found = next(
            (
                f
                for f in self.reuse.every(run.requested)
                if encoder
                and f.record.environment.get("starting_encoder") == encoder
                and same_config(f.record, run)
            ),
            None,
        )
        if found is not None:
            self.reused[name] = found.path
            self.paired.add(name)
        return found

    def candidates(self, run: RunPlan, own: Path) -> list[Found]:
        """Records of ``run`` in :attr:`reuse` (other than ``own``) that this machine
        would make bit for bit if they start from its encoder."""
        if self.reuse is None or self.force:
            return []
        return [
            f
            for f in self.reuse.every(run.requested)
            if f.path != own
            and reproduces(f.record.environment, self._here)
            and same_config(f.record, run)
        ]

    @functools.cached_property
    def _here(self) -> dict:
        """This machine's :func:`~cpcfl_tf.records.environment.environment`, read once, and only
        where there is a record to compare it with (it imports TensorFlow)."""
        return environment()

    def take(self, name: str, candidates: list[Found], starting: str | None) -> Found | None:
        """The one of ``candidates`` that starts from the encoder of fingerprint
        ``starting``, noted in :attr:`reused`."""
        found = next(
            (f for f in candidates if f.record.environment.get("starting_encoder") == starting),
            None,
        )
        if found is not None:
            self.reused[name] = found.path
        return found

    def stand_in(self, name: str, method: str, found: Found) -> RunRecord:
        """Note that run ``name`` of ``method`` is ``found``'s run (:attr:`stood_in`)."""
        self.stood_in[name] = (method, found.path)
        return found.record
