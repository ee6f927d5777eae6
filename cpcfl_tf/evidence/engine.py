"""The evidence engine of the claims: the run records of a results tree per claim and
seed (:class:`Evidence`), each claim judged by the rule of :mod:`cpcfl_tf.evidence.judge`
(:class:`Judged`), and the report ``claims.md`` with its sections (headroom, groups
found, which machines and encoders the runs came from) and ``results/README.md``'s
per-link table (:func:`verdict_table`). Reads the tree; writes nothing.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from cpcfl_tf.clustered.metrics import cluster_ari
from cpcfl_tf.clustered.restarts import cluster_sizes, clustering_failed
from cpcfl_tf.errors import UserError
from cpcfl_tf.evidence.catalogue import COMPARISON_LABELS, client_settings
from cpcfl_tf.evidence.claims import Claim, Link, base_name, evidence
from cpcfl_tf.evidence.judge import (
    CANNOT,
    CLAIMS_RULE,
    Summary,
    bounds,
    combined,
    final_accuracy,
    linear_eval_config,
    linear_eval_settings,
    paired,
    verdict,
)
from cpcfl_tf.methods.federated import run_label
from cpcfl_tf.plan.config import Config
from cpcfl_tf.plan.resolve import resolve
from cpcfl_tf.records.environment import machine
from cpcfl_tf.records.record import RunRecord
from cpcfl_tf.records.store import Found, RecordIndex, mismatch, together
from cpcfl_tf.running.report import markdown_table
from cpcfl_tf.running.runner import RunSpec
from cpcfl_tf.running.taking import base_plan, stands_in


# -- judging -------------------------------------------------------------------------
@dataclasses.dataclass
class Judged:
    claim: Claim
    links: list[tuple[Link, Summary, list[str]]]
    """Each link with its summary and what is missing (``seed K: run``)."""

    @property
    def verdict(self) -> str:
        if self.claim.cannot:
            return CANNOT
        return combined(s.verdict for _, s, _ in self.links)


class Evidence:
    """The runs of a results tree, per claim and seed."""

    def __init__(self, config: Config, results: Path, seeds: Sequence[int], own: Path):
        self.config, self.results, self.seeds = config, results, list(seeds)
        self.specs = evidence(config)
        # The machine the runs are preferred from is the one most of the claims' own runs
        # came from: a large study of other runs in the tree (the reliability study) must
        # not sway which records the claims judge.
        self.index = RecordIndex(
            results,
            prefer=own,
            electing=[self.config_of(name, seed) for name in self.specs for seed in self.seeds],
        )
        self.used: dict[str, list[str] | str] = {}
        """Run (``seed K: name``) -> the paths of the records used, for claims.json (one
        unless links paired the run with runs from different encoders or machines); a
        linear evaluation (``seed K: linear evaluation M``) -> its one summary's path."""
        self.linked: dict[int, RunRecord] = {}
        """Every record a link used, by ``id`` (the index holds one object per file): the
        report's provenance note."""
        self.pairs: list[tuple[str, int, list[RunRecord]]] = []
        """(claim id, seed, the records of one link's paired difference): the report's
        note on machines and encoders."""
        self.scored: dict[tuple[int, str], str | None] = {}
        """(seed, pre-training) -> the fingerprint of the encoder its linear evaluation
        scored (None: the row does not name it)."""

    def spec(self, name: str, seed: int) -> RunSpec:
        spec = self.specs[name]
        return dataclasses.replace(spec, name=f"seed{seed}-{spec.name}", seed=seed)

    def config_of(self, name: str, seed: int) -> Config:
        return self.spec(name, seed).config(self.config)

    def every(self, name: str, seed: int) -> list[Found]:
        """Every record of run ``name`` for ``seed``, the preferred first. A fixed run
        (:func:`~cpcfl_tf.evidence.claims.fixed_name`) with no record of its own is its base
        run's record wherever its restart rule never fires there
        (:func:`~cpcfl_tf.running.taking.stands_in`): that run is it, bit for bit."""
        config = self.config_of(name, seed)
        found = self.index.every(config)
        base = base_name(name)
        if found or base is None:
            return found
        run = resolve(config)
        base_run = base_plan(run)  # resolved once, not per record
        return [f for f in self.every(base, seed) if stands_in(f.record, run, base_run)]

    def _use(self, seed: int, name: str, path: Path) -> None:
        paths = self.used.setdefault(f"seed {seed}: {name}", [])
        assert isinstance(paths, list)  # a run's (a linear evaluation's is a path)
        if str(path) not in paths:
            paths.append(str(path))

    def runs(self, name: str) -> dict[int, RunRecord]:
        """The record of ``name`` per seed that has one: the one a link used first, else
        the preferred (a run made on two machines shows the record that was judged)."""
        out = {}
        for seed in self.seeds:
            every = self.every(name, seed)
            judged = self.used.get(f"seed {seed}: {name}", [None])[0]
            found = next((f for f in every if str(f.path) == judged), every[0] if every else None)
            if found is not None:
                out[seed] = found.record
                self._use(seed, name, found.path)
        return out

    def together(self, names: Sequence[str]) -> dict[str, dict[int, RunRecord]]:
        """Per run in ``names``, its record per seed, over the seeds that have all of them,
        each seed's chosen together as one sample of chance (:meth:`RecordIndex.together`)."""
        out: dict[str, dict[int, RunRecord]] = {name: {} for name in names}
        for seed in self.seeds:
            chosen = together([self.every(name, seed) for name in names])
            for name, found in zip(names, chosen or ()):
                self._use(seed, name, found.path)
                out[name][seed] = found.record
        return out

    def linear_eval(self, method: str) -> dict[int, float]:
        """Linear-evaluation accuracy (%) of ``method``'s encoder per seed."""
        wanted = {
            seed: linear_eval_settings(self.config.with_overrides(seed=seed)) for seed in self.seeds
        }
        out = {}
        for path, stored in self.index.linear_evals:
            try:
                settings = linear_eval_settings(linear_eval_config(stored["config"]))
            except (KeyError, TypeError, UserError):
                continue
            for seed, want in wanted.items():
                row = next(
                    (r for r in stored.get("rows", []) if r.get("pretraining") == method), None
                )
                if settings == want and row is not None and seed not in out:
                    out[seed] = 100 * row["accuracy"]
                    self.scored[seed, method] = row.get("encoder_fingerprint")
                    self.used[f"seed {seed}: linear evaluation {method}"] = str(path)
        return out

    def judge(self, claim: Claim) -> Judged:
        judged = []
        for link in claim.links:
            names = [n for n in (link.a, link.b, link.c, link.d) if n is not None]
            if link.linear_eval:  # one evaluation per seed scores all its encoders
                if link.b is None:
                    raise ValueError(f"{link.label}: a linear evaluation link names two methods")
                a, b = self.linear_eval(link.a), self.linear_eval(link.b)
                diffs = {s: a[s] - b[s] for s in sorted(set(a) & set(b))}
                missing = [
                    f"seed {s}: linear evaluation" for s in self.seeds if s not in a or s not in b
                ]
            else:
                runs = self.together(names)
                self.linked.update((id(r), r) for have in runs.values() for r in have.values())
                self.pairs += [
                    (claim.id, seed, [runs[n][seed] for n in names])
                    for seed in self.seeds
                    if all(seed in runs[n] for n in names)
                ]
                diffs = paired(
                    runs[link.a],
                    None if link.b is None else runs[link.b],
                    link.stat,
                    threshold=link.threshold,
                )
                if link.c is not None and link.d is not None:
                    other = paired(runs[link.c], runs[link.d], link.stat)
                    diffs = {s: diffs[s] - other[s] for s in diffs if s in other}
                missing = [
                    f"seed {s}: {name}"
                    for s in self.seeds
                    for name in names
                    if not self.every(name, s)
                ]
            judged.append(
                (
                    link,
                    verdict(
                        diffs,
                        link.margin,
                        missing=len(missing),
                        paper=link.effect,
                        equivalence=link.equivalence,
                    ),
                    missing,
                )
            )
        return Judged(claim, judged)


def _number(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:+.{digits}f}"


def _ours(summary: Summary, long: bool = True) -> str:
    """A link's mean and 95 % interval (``long``: with min and max) and n."""
    if not summary.n:
        return "-"
    interval = summary.interval
    if not long:
        return (
            f"{_number(summary.mean)} [{_number(interval[0])}, {_number(interval[1])}] "
            f"(n = {summary.n})"
            if interval
            else f"{_number(summary.mean)} (n = {summary.n})"
        )
    return (
        f"{_number(summary.mean)} [{_number(interval[0]) if interval else '-'}, "
        f"{_number(interval[1]) if interval else '-'}]; min {_number(min(summary.values))}, "
        f"max {_number(max(summary.values))} (n = {summary.n})"
    )


def _allows(summary: Summary) -> list[str]:
    """What a link's interval allows (:func:`~cpcfl_tf.evidence.judge.bounds`), whether the
    paper's difference is inside it, and the seeds that would decide the link."""
    inside, needed = summary.paper_inside, summary.seeds_needed
    return [
        bounds(summary),
        "-" if inside is None else "yes" if inside else "no",
        "-" if needed is None else str(needed),
    ]


FIXED_NOTE = (
    "*With the restart rule* (beyond the paper): the same link judged by the same "
    "rule with every CP-CFL run replaced by CP-CFL+restart's of the same seed, "
    "partition and settings (IFCA's restart rule added to CP-CFL: "
    "docs/choices.md). Where the rule never fires in a CP-CFL run, that run is "
    "CP-CFL+restart's bit for bit; only the runs where it fires are made. "
    "*same runs*: the link names no CP-CFL run."
)


def _why(j: Judged, link: Link, summary: Summary, missing: list[str], command: str) -> str:
    """A link's verdict as the report says it (with the command for missing runs)."""
    if j.claim.cannot:
        return f"{CANNOT}: {j.claim.cannot}"
    if summary.verdict != CANNOT:
        return summary.verdict
    what = "linear evaluation(s)" if link.linear_eval else "run(s)"
    why = (
        f"{CANNOT}: {len(missing)} {what} missing "
        f"(`{command} --claims {j.claim.id} --run --resume`)"
    )
    return why + (f"; so far (n = {summary.n}): {summary.so_far}" if summary.so_far else "")


def report(
    config: Config,
    results: Path,
    seeds: list[int],
    judged: list[Judged],
    headroom: list[list[str]],
    groups: list[str],
    command: str,
    fixed: list[Judged],
) -> str:
    """``claims.md``: per link the paper's reading (``judged``) and, beside it, the same
    link with CP-CFL's merges fixed (``fixed``, one per claim of ``judged``)."""
    lines = [
        f"# The paper's claims (preset `{config.preset}`)",
        "",
        f"Judged by `python experiments/claims.py --preset {config.preset}` from the run "
        f"records under `{results}`, seeds {', '.join(map(str, seeds))}. The paper's "
        "numbers are STL-10 on a GPU, copied from its tables; ours are points of "
        "accuracy (%) unless the link says otherwise.",
        "",
        CLAIMS_RULE,
        "",
        FIXED_NOTE,
    ]
    rows = []
    for j, f in zip(judged, fixed):
        for k, ((link, summary, missing), (flink, fsummary, fmissing)) in enumerate(
            zip(j.links, f.links)
        ):
            same = flink == link
            rows.append(
                [
                    f"{j.claim.id} {j.claim.text}" if k == 0 else "",
                    link.label,
                    link.paper,
                    " / ".join(_number(v) for v in summary.per_seed.values()) or "-",
                    _ours(summary),
                    _why(j, link, summary, missing, command),
                    "same runs" if same else _ours(fsummary, long=False),
                    "same runs" if same else _why(f, flink, fsummary, fmissing, command),
                ]
            )
    lines += markdown_table(
        [
            "claim",
            "link (ours: per seed, mean [95 % interval])",
            "paper",
            "ours per seed",
            "ours",
            "verdict",
            "with the restart rule: ours",
            "verdict",
        ],
        rows,
    )
    lines += [
        "",
        "## What the intervals allow",
        "",
        "Per link: the paper's difference, the largest effect the interval allows on "
        "the paper's side and on the other (a claim of no difference: its 90 % "
        "interval), whether the paper's difference lies inside the interval, and for "
        "a link not decided the seeds that would decide it at the mean and spread seen "
        "here (the rule above); then the same with the restart rule.",
        "",
    ]
    lines += markdown_table(
        [
            "claim",
            "link",
            "paper's difference",
            "ours allows",
            "paper's inside",
            "seeds to decide",
            "with the restart rule: ours allows",
            "paper's inside",
            "seeds to decide",
        ],
        [
            [
                j.claim.id if k == 0 else "",
                link.label,
                _number(link.effect),
                *_allows(summary),
                *(("same runs", "", "") if flink == link else _allows(fsummary)),
            ]
            for j, f in zip(judged, fixed)
            for k, ((link, summary, _), (flink, fsummary, _)) in enumerate(zip(j.links, f.links))
        ],
    )
    lines += ["", "## Verdict per claim", ""]
    lines += markdown_table(
        ["claim", "source in the paper", "verdict", "with the restart rule (beyond the paper)"],
        [
            [f"{j.claim.id} {j.claim.text}", j.claim.source, j.verdict, f.verdict]
            for j, f in zip(judged, fixed)
        ],
    )
    if headroom:
        lines += [
            "",
            "## Headroom: gap to the centralized by-group bound of the same seed",
            "",
            "Each method's accuracy minus the centralized by-group model's (points): how "
            "much the data left above each method.",
            "",
        ]
        lines += markdown_table(["method", "per seed", "mean (n)"], headroom)
    lines += groups
    return "\n".join(lines) + "\n"


LABELS = {
    **COMPARISON_LABELS,
    **{f"cp-cfl-{pre}": run_label("cp-cfl", pre) for pre in ("byol", "simsiam")},
}
CLUSTERED = ("ifca-none", "ifca-fedavg", "cp-cfl-simclr", "cp-cfl-byol", "cp-cfl-simsiam")


def headroom(ev: Evidence) -> list[list[str]]:
    rows = []
    for name, label in LABELS.items():
        runs = ev.together([name, "centralized-group"])
        gaps = paired(runs[name], runs["centralized-group"], final_accuracy)
        if gaps:
            values = list(gaps.values())
            rows.append(
                [
                    label,
                    " / ".join(f"{v:+.2f}" for v in values),
                    f"{sum(values) / len(values):+.2f} ({len(values)})",
                ]
            )
    return rows


def found_at(record: RunRecord) -> int | None:
    """The first round after which every client was in its true group (None: never)."""
    groups = np.array([c["group"] for c in record.clients])
    return next(
        (r.round for r in record.rounds if cluster_ari(groups, np.array(r.cluster_ids)) == 1.0),
        None,
    )


def _sizes(record: RunRecord) -> str:
    """The final clusters' sizes, e.g. ``16,40,4``."""
    return ",".join(
        map(
            str,
            cluster_sizes(
                np.array(record.rounds[-1].cluster_ids), record.config.federated.num_clusters
            ),
        )
    )


def _flagged(record: RunRecord) -> bool:
    """Whether IFCA's failure test flags the final clusters."""
    fl = record.config.federated
    return clustering_failed(
        np.array(record.rounds[-1].cluster_ids), fl.num_clusters, fl.min_cluster_share
    )


def groups_found(ev: Evidence) -> list[str]:
    """The "Groups found" section: per clustered method and seed, the final clusters'
    ARI and sizes, the round the true groups were first found and IFCA's restarts; and
    whether IFCA's failure test would have caught CP-CFL's runs that end without them."""
    rows, cp_cfl = [], []
    # C7's CP-CFL runs with other numbers of clients (the preset's own is CP-CFL (SimCLR)).
    sized = {
        f"c{n}": f"CP-CFL (SimCLR), {n} clients"
        for n, _ in client_settings(ev.config)
        if n != ev.config.partition.num_clients
    }
    for name in (*CLUSTERED, *sized):
        runs = list(ev.runs(name).values())
        if not runs:
            continue
        if name.startswith("cp-cfl") or name in sized:
            cp_cfl += runs
        found = [found_at(r) for r in runs]
        rows.append(
            [
                sized.get(name) or LABELS[name],
                " / ".join(f"{r.final.ari:.2f}" for r in runs),
                " / ".join(_sizes(r) for r in runs),
                " / ".join("never" if f is None else str(f) for f in found),
                " / ".join(str(r.final.restarts) for r in runs),
                f"{sum(r.final.ari == 1.0 for r in runs)} of {len(runs)}",
            ]
        )
    if not rows:
        return []
    lines = [
        "",
        "## Groups found: the clusters against the true groups",
        "",
        "Per seed: the final clusters' adjusted Rand index against the clients' true "
        "groups (1: every client with its group) and their sizes, the first round after "
        "which every client was in its true group, and IFCA's restarts (the final "
        "attempt's rounds are the record's). A run that ends below 1 kept groups merged "
        "or split; the links that compare clustered methods move with it.",
        "",
    ]
    lines += markdown_table(
        [
            "method",
            "final ARI per seed",
            "final cluster sizes",
            "groups first found (round)",
            "restarts",
            "runs ending with the true groups",
        ],
        rows,
    )
    missed = [r for r in cp_cfl if r.final.ari is not None and r.final.ari < 1.0]
    if missed:
        kept = [r for r in cp_cfl if r.final.ari == 1.0]
        share = missed[0].config.federated.min_cluster_share
        lines += [
            "",
            f"CP-CFL has no restart rule (the paper gives it none). IFCA's failure "
            f"test (one model for every client, or a cluster below {share:g} of its "
            f"fair share: docs/choices.md), applied to CP-CFL's final clusters, "
            f"flags {sum(map(_flagged, missed))} of the {len(missed)} CP-CFL runs "
            f"that end below ARI 1 and {sum(map(_flagged, kept))} of the "
            f"{len(kept)} that end with the true groups.",
        ]
    return lines


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


def verdict_table(judged: list[Judged], fixed: list[Judged]) -> list[str]:
    """One row per link: claim, link, paper, ours (mean [interval], n), verdict, and the
    verdict with CP-CFL's merges fixed (``fixed``, one per claim of ``judged``)."""
    rows = []
    for j, f in zip(judged, fixed):
        for k, ((link, summary, _), (flink, fsummary, _)) in enumerate(zip(j.links, f.links)):
            verdict_ = CANNOT if j.claim.cannot else summary.verdict
            again = (
                "same runs"
                if flink == link
                else f"{CANNOT if f.claim.cannot else fsummary.verdict}: "
                f"{_ours(fsummary, long=False)}"
            )
            rows.append(
                [
                    j.claim.id if k == 0 else "",
                    link.label,
                    link.paper,
                    _ours(summary, long=False),
                    verdict_,
                    again,
                ]
            )
    return markdown_table(
        [
            "claim",
            "link",
            "paper (STL-10)",
            "ours: mean [95 % interval]",
            "verdict",
            "with the restart rule (beyond the paper)",
        ],
        rows,
    )
