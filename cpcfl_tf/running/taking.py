"""Whether a run's record can be taken instead of made, decided once per run: done
before in the folder, interrupted (to resume), a restart variant's base run in which its
rule never fires (a stand-in), a record made elsewhere (its base run's twin, the one the
folder's ``taken.json`` names), or to make; the runner
(:class:`~cpcfl_tf.running.runner.Runner`) then does what it says."""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path

from cpcfl_tf.errors import UserError
from cpcfl_tf.plan.resolve import RunPlan, resolve
from cpcfl_tf.records.record import RunRecord, read_record
from cpcfl_tf.records.store import Found, RecordStore, same_config


class Decision(enum.Enum):
    """What :meth:`Taking.decide` says of a run."""

    DONE = "done"
    """Its record is in the output folder."""
    STAND_IN = "stand-in"
    """Its base method's run, in which its restart rule never fires: that run, bit for bit."""
    TAKEN = "taken"
    """A record made elsewhere: its base run's restart twin, or the one ``taken.json`` names."""
    BASE_FIRST = "base first"
    """Its base method's run is made first (a dry run's answer; a run goes ahead)."""
    RESUME = "to resume"
    RUN = "to run"
    """Made here, unless a record this machine would make bit for bit is found for its
    starting encoder (:attr:`RunDecision.candidates`)."""
    STOPS = "stops"
    """Refused (another config in its place, an interruption without ``--resume``)."""


@dataclasses.dataclass(frozen=True)
class RunDecision:
    """The decision about one run, with what it rests on."""

    decision: Decision
    found: Found | None = None
    """The record taken (done, stand-in, taken)."""
    candidates: tuple[Found, ...] = ()
    """Records this machine would make bit for bit, if they start from its encoder."""
    why: str = ""

    def describe(self) -> str:
        """The dry run's line for it."""
        d, path = self.decision, self.found and self.found.path
        if d is Decision.STAND_IN:
            return f"its restart rule never fires in {path}: that run"
        if d is Decision.TAKEN:
            return f"found: {path} ({self.why})"
        if d is Decision.BASE_FIRST:
            return (
                "to run if its restart rule fires in its base method's run (made "
                "first; else that run)"
            )
        if d is Decision.STOPS:
            return f"stops: {self.why}"
        if self.candidates:
            return f"found: {self.candidates[0].path}"
        return d.value


class Taking:
    """Decides, for each run of one output folder, whether its record is taken or made
    (:class:`Decision`), from the folder, its :class:`~cpcfl_tf.records.store.RecordStore`
    and the options ``--force`` and ``--resume``."""

    def __init__(self, store: RecordStore, *, force: bool = False, resume: bool = False):
        self.store, self.force, self.resume = store, force, resume

    def decide(self, name: str, run: RunPlan, path: Path, checkpoint: Path) -> RunDecision:
        """The one decision about run ``name`` of plan ``run``, whose record goes to
        ``path`` and whose unfinished rounds to ``checkpoint``. Reads, never writes:
        which records it took is noted in :attr:`store`. A one-line :class:`UserError`
        for a run that must not go ahead."""
        if path.exists() and not self.force:
            record = read_record(path)
            if not same_config(record, run):
                raise UserError(
                    f"{path} holds a run with a different config; pass --force to "
                    "redo it or --out another folder"
                )
            return RunDecision(Decision.DONE, Found(path, record))
        if checkpoint.exists() and not self.force:
            if not self.resume:
                raise UserError(
                    f"{name} was interrupted ({checkpoint}); pass --resume to "
                    "continue it or --force to start it over"
                )
            return RunDecision(Decision.RESUME)
        base = None if self.force else base_plan(run)
        if base is not None:
            found = self.store.base_run(base)
            if found is not None and stands_in(found.record, run, base):
                return RunDecision(Decision.STAND_IN, found)
            twin = self.store.twin(name, run, base)
            if twin is not None:
                return RunDecision(Decision.TAKEN, twin, why="from its base method's run's encoder")
        named = self.store.named_in_taken(name, run)
        if named is not None:
            return RunDecision(Decision.TAKEN, named, why="the folder's taken.json names it")
        first = base is not None and not self.store.has_base(base)
        return RunDecision(
            Decision.BASE_FIRST if first else Decision.RUN,
            candidates=tuple(self.store.candidates(run, path)),
        )


def base_plan(run: RunPlan) -> RunPlan | None:
    """The plan of the run ``run`` is until its restart rule fires (its method's
    :attr:`~cpcfl_tf.methods.federated.Method.restarts_of`); None for other methods."""
    base = run.method.restarts_of
    if not base:
        return None
    # the same data as ``run``'s, checked when ``run`` was resolved
    return resolve(run.requested.with_overrides(federated={"method": base}), checked=True)


def stands_in(record: RunRecord, run: RunPlan, base: RunPlan | None) -> bool:
    """Whether ``record`` is the run of ``run`` bit for bit: a run of ``base``, its base
    plan (:func:`base_plan`, made once by the caller), in which ``run``'s restart rule
    never fires (attempt 0 draws what
    the base draws). A property of the record, whatever machine made it."""
    from cpcfl_tf.clustered.restarts import would_restart

    return (
        base is not None
        and same_config(record, base)
        and not would_restart(run, [r.cluster_ids for r in record.rounds])
    )
