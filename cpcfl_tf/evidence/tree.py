"""A results tree's runs, per claim and seed (:class:`Evidence`): every record of a run,
the preferred first, taken together by seed, and each seed's linear evaluations; what
the claims use of them is noted for their report. Reads the tree; writes nothing."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from cpcfl_tf.errors import UserError
from cpcfl_tf.evidence.claims import base_name, evidence
from cpcfl_tf.evidence.judge import (
    linear_eval_config,
    linear_eval_settings,
)
from cpcfl_tf.plan.config import Config
from cpcfl_tf.plan.resolve import resolve
from cpcfl_tf.records.record import RunRecord
from cpcfl_tf.records.store import Found, RecordIndex, together
from cpcfl_tf.running.runner import RunSpec
from cpcfl_tf.running.taking import base_plan, stands_in


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
