"""A reproducer's runs against the committed ones (``experiments/compare.py``, and the
comparison a script prints after its runs:
:meth:`~cpcfl_tf.running.script.Session.compare_with_reference`): the same outcome bit for
bit, or where a final accuracy lies against the spread of the reference's seeds of the
same settings."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from cpcfl_tf.plan.config import Config
from cpcfl_tf.plan.identity import config_key, config_record
from cpcfl_tf.records.environment import machine
from cpcfl_tf.records.record import RunRecord
from cpcfl_tf.records.store import Found, RecordIndex, run_record_in

SAME, WITHIN, OUTSIDE, DIFFERS, NO_REFERENCE = (
    "bit for bit",
    "within the seed-to-seed spread",
    "outside the seed-to-seed spread",
    "differs (one committed seed: no spread to compare)",
    "no reference",
)


def _without_seed(config: Config) -> str:
    record = config_record(config)
    record.pop("seed")
    return json.dumps(record, sort_keys=True)


def _outcome(record: RunRecord) -> dict:
    """What a run found: every round and the final result (not where or how fast)."""
    return {
        "rounds": [r.to_json() for r in record.rounds],
        "final": record.final.to_json(),
        "clients": record.clients,
    }


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One run of a reproducer against the reference."""

    path: Path
    verdict: str
    accuracy: float
    reference: float | None = None
    spread: tuple[float, float] | None = None
    """Final accuracy (%) of the reference's seeds of the same settings: (min, max)."""
    reference_path: Path | None = None
    note: str = ""
    machines: tuple[str | None, str | None] | None = None
    """(this run's machine, the reference record's) where they differ."""


def compare_runs(ours: str | Path, reference: str | Path) -> list[Comparison]:
    """Each run record under ``ours`` against ``reference``'s record of the same config:
    the same outcome bit for bit (every round's accuracy and cluster ids, the final
    metrics); otherwise whether its final accuracy lies within the range of the
    reference's seeds of the same settings (the seed-to-seed spread), or outside it.
    Where ``ours`` lies inside ``reference`` (``experiments/run.py``'s folder in the
    kit's tree), the rest of the tree is the reference."""
    ours, reference = Path(ours), Path(reference)
    inside = reference.resolve() in ours.resolve().parents
    theirs = RecordIndex(reference, exclude=ours if inside else None)
    by_settings: dict[str, list[float]] = {}
    for found in theirs.preferred():
        by_settings.setdefault(_without_seed(found.record.requested), []).append(
            100 * found.record.final_accuracy
        )
    out = []
    for path in sorted(ours.rglob("*.json")):
        if not inside and (
            reference.resolve() in path.resolve().parents or path.resolve() == reference.resolve()
        ):
            continue
        record = run_record_in(path)
        if record is None:
            continue
        accuracy = 100 * record.final_accuracy
        match = _same_place(reference, path, record) or _closest(
            theirs.every(record.requested), record
        )
        seeds = by_settings.get(_without_seed(record.requested), [])
        spread = (min(seeds), max(seeds)) if len(seeds) >= 2 else None
        if match is None:
            out.append(
                Comparison(
                    path,
                    NO_REFERENCE,
                    accuracy,
                    spread=spread,
                    note="no committed run of this config",
                )
            )
            continue
        ref = 100 * match.record.final_accuracy
        if _outcome(record) == _outcome(match.record):
            verdict_ = SAME
        elif spread is None:
            verdict_ = DIFFERS
        else:
            verdict_ = WITHIN if spread[0] <= accuracy <= spread[1] else OUTSIDE
        machines = (machine(record.environment), machine(match.record.environment))
        note = ""
        if record.environment.get("starting_encoder") != match.record.environment.get(
            "starting_encoder"
        ):
            note = ANOTHER_ENCODER
        elif machines[0] != machines[1]:
            note = "another CPU"
        out.append(
            Comparison(
                path,
                verdict_,
                accuracy,
                ref,
                spread,
                match.path,
                note,
                machines if machines[0] != machines[1] else None,
            )
        )
    return out


def _closest(found: list[Found], record: RunRecord) -> Found | None:
    """Of the reference's records of ``record``'s config (in the tree's preference order),
    the one that could be its bits: from the same starting encoder on the same kind of
    machine, else from the same encoder, else on the same machine, else the preferred."""
    encoder, cpu = record.environment.get("starting_encoder"), machine(record.environment)
    return min(
        found,
        default=None,
        key=lambda f: (
            f.record.environment.get("starting_encoder") != encoder,
            machine(f.record.environment) != cpu,
        ),
    )


def _same_place(reference: Path, path: Path, record: RunRecord) -> Found | None:
    """The reference's record written by the same script under the same name, if it has
    the same config (where the tree holds several runs of one config, this is the one
    the reproducer re-made)."""
    candidate = reference / record.experiment / path.name
    if record.experiment and candidate.exists():
        found = run_record_in(candidate)
        if found is not None and config_key(found.requested) == config_key(record.requested):
            return Found(candidate, found)
    return None


ANOTHER_ENCODER = "another starting encoder"


def _served(record: RunRecord) -> dict:
    """What a Flower run's record holds of its outcome, and the simulator's has too: each
    round's cluster ids and accuracy, the final accuracy and the bytes (the server never
    sees the clients' data: no F1, AUROC or ARI)."""
    final = record.final
    return {
        "rounds": [(r.cluster_ids, r.accuracy) for r in record.rounds],
        "final": (final.accuracy, final.bytes_down, final.bytes_up, final.model_bytes),
    }


def against_record(record: RunRecord, stored: RunRecord) -> str:
    """``record`` (a run re-made from ``stored``'s config) against ``stored``, in one line:
    bit for bit, or why it could not be (another starting encoder, another kind of CPU),
    or that it differs where it should not (same encoder and CPU kind). A Flower run's
    record is held to what it records (:func:`_served`)."""
    outcome = _served if "flower" in (record.experiment, stored.experiment) else _outcome
    if outcome(record) == outcome(stored):
        return f"{SAME}: every round and the final result equal the record's" + (
            " (what a Flower record holds)" if outcome is _served else ""
        )
    ours, theirs = machine(record.environment), machine(stored.environment)
    accuracy = (
        f"final accuracy {100 * record.final_accuracy:.2f} against the record's "
        f"{100 * stored.final_accuracy:.2f}"
    )
    encoders = (
        record.environment.get("starting_encoder"),
        stored.environment.get("starting_encoder"),
    )
    if encoders[0] != encoders[1]:
        return (
            f"not bit for bit, as expected: {ANOTHER_ENCODER} ({encoders[0]} against "
            f"{encoders[1]}; tools/encoders.py carries encoders between machines); "
            f"{accuracy}"
        )
    if ours != theirs:
        return (
            f"not bit for bit, as expected: another CPU ({ours or 'not recorded'} against "
            f"{theirs or 'not recorded'}: the float sums' last bits differ); {accuracy}"
        )
    return (
        f"differs although the CPU kind and the starting encoder are the record's: "
        f"{accuracy}; please report it"
    )


def comparison_lines(comparisons: list[Comparison]) -> list[str]:
    """A reproducer's summary: the machines once (where they differ), then one short line
    per run saying only what differs for it."""
    lines = [
        f"These runs ran on {ours or 'an unrecorded CPU'}; the committed ones on "
        f"{theirs or 'an unrecorded CPU'}."
        for ours, theirs in dict.fromkeys(c.machines for c in comparisons if c.machines)
    ]
    if any(c.note == ANOTHER_ENCODER for c in comparisons):
        lines.append(
            f'Runs marked "{ANOTHER_ENCODER}" started from other encoder bits '
            "(pre-trained on another kind of machine?); tools/encoders.py carries "
            "encoders between machines."
        )
    for c in comparisons:
        ref = "" if c.reference is None else f" against {c.reference:.2f}"
        spread = "" if c.spread is None else f" (seeds {c.spread[0]:.2f}-{c.spread[1]:.2f})"
        note = f"; {c.note}" if c.note else ""
        lines.append(f"{c.path.name}: {c.accuracy:.2f} %{ref}{spread}: {c.verdict}{note}")
    return lines
