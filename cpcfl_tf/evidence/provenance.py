"""Where the runs a report judged came from: the machines (CPU kinds) and the starting
encoders behind each paired difference (:func:`machine_notes`, :func:`encoder_notes`),
and the seeds in words (:func:`seed_list`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from cpcfl_tf.evidence.tree import Evidence
from cpcfl_tf.records.environment import machine
from cpcfl_tf.records.record import RunRecord
from cpcfl_tf.records.store import mismatch


def machine_notes(ev: Evidence) -> list[str]:
    """Which claims and seeds ran on another kind of CPU than most runs, and every paired
    difference whose runs do not share one kind of CPU and, per pre-training, one encoder
    (there its last bits are round-off, not chance)."""

    def cpu(record: RunRecord) -> str:
        return machine(record.environment) or "CPU not recorded"

    count = Counter(map(cpu, ev.linked.values()))
    identified = {cpu(r) for r in ev.linked.values() if r.environment.get("cpu_id")}

    def named(kind: str) -> str:  # a kind without an identity is not one machine
        return (
            kind
            if kind in identified or kind == "CPU not recorded"
            else (f"{kind}, CPU identity not recorded")
        )

    kinds: dict[str, dict[str, set[int]]] = {}
    mixed = []
    for claim_id, seed, records in ev.pairs:
        for record in records:
            kinds.setdefault(cpu(record), {}).setdefault(claim_id, set()).add(seed)
        encoders, cpus = mismatch(records)
        what = " and ".join(w for w, bad in (("encoders", encoders), ("CPUs", cpus)) if bad)
        if what and (claim_id, seed, what) not in mixed:
            mixed.append((claim_id, seed, what))
    notes = []
    if len(count) > 1:
        most = max(count, key=lambda kind: (count[kind], kind))
        others = "; ".join(
            f"{named(kind)}: "
            + ", ".join(
                f"{claim_id} {seed_list(sorted(seeds))}" for claim_id, seeds in kinds[kind].items()
            )
            for kind in sorted(count)
            if kind != most
        )
        notes.append(
            f"Note: {count[most]} of the {len(ev.linked)} runs judged here ran on "
            f"{named(most)}; the other {len(ev.linked) - count[most]}, by claim and seed: "
            f"{others}."
        )
    if mixed:
        notes.append(
            "Note: these paired differences compare runs that do not share one "
            "kind of CPU or one encoder per pre-training (what differs): "
            + ", ".join(f"{c} seed {s} ({w})" for c, s, w in mixed)
            + ". Their last bits differ; on the quick preset that moved a result "
            'by about 1.5 points (docs/experiments.md, "Bit for bit").'
        )
    elif len(count) > 1:
        notes[-1] += (
            " Each paired difference compares runs of one kind of CPU that start, "
            "per pre-training, from one encoder."
        )
    return notes


def seed_list(seeds: Sequence[int]) -> str:
    """ "seed 3" or "seeds 3, 4"."""
    return f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"


def encoder_notes(ev: Evidence) -> list[str]:
    """Whether each linear evaluation scored the encoder its seed's CP-CFL run of the same
    pre-training started from (``environment.starting_encoder``)."""
    notes, unnamed = [], sorted({seed for (seed, _), f in ev.scored.items() if f is None})
    for (seed, method), scored in sorted(ev.scored.items()):
        started: set[str] = {
            f.record.environment["starting_encoder"]
            for f in ev.index.every(ev.config_of(f"cp-cfl-{method}", seed))
            if f.record.environment.get("starting_encoder") is not None
        }
        if scored and started and scored not in started:
            notes.append(
                f"Note: seed {seed}'s linear evaluation of {method} scored encoder "
                f"`{scored[:16]}`, its CP-CFL runs started from "
                f"{', '.join(f'`{e[:16]}`' for e in sorted(started))}: the CP-CFL and "
                "linear-evaluation links of C9 rest on different pre-trainings of "
                "that seed."
            )
    if unnamed:
        notes.append(
            f"Note: the linear evaluations of seed(s) {', '.join(map(str, unnamed))} "
            "do not name the encoder they scored (written before linear_eval.json "
            "had `encoder_fingerprint`); `python experiments/linear_eval.py --force` "
            "with the same settings, where the cache holds those encoders, names it."
        )
    return notes
