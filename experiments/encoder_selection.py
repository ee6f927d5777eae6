"""The paper's encoder selection (Sec. "Experimental settings"): for each self-supervised
method, pre-train the candidates of its grid, score each by linear evaluation on the
proxy, keep the best.

The paper tunes the projection head's width (256 or 512) per method and keeps the
encoder with the best proxy accuracy (STL-10 train -> test; here the clients' training
split -> test split, as experiments/linear_eval.py). The grid is each method's own
(:mod:`cpcfl_tf.methods.ssl`); ``--grid SETTING=V1,V2`` takes others. Each seed
(``--seed`` .. ``--seed + --seeds - 1``) pre-trains its own candidates; a candidate at the
paper's value is the encoder every other script starts from (same cache entry).

Writes every candidate's proxy accuracy, kNN accuracy (k = 200) and fingerprint, and the
choice, to encoder_selection.json/.md. Then, per method and seed, CP-CFL from the selected
encoder against CP-CFL from the paper's (the same run where the selection picks the
paper's value): the paired difference by the claims' rule. Other scripts start from the
selected encoders with ``--encoders-from .../encoder_selection.json``.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from cpcfl_tf.errors import UserError, run_cli
from cpcfl_tf.evidence.judge import final_accuracy, verdict
from cpcfl_tf.evidence.selection import choose, label, report, summary_part
from cpcfl_tf.methods.ssl import SSL_METHODS
from cpcfl_tf.plan.config import Config
from cpcfl_tf.records.record import RunRecord
from cpcfl_tf.running.cli import name_list
from cpcfl_tf.running.runner import RunSpec
from cpcfl_tf.running.script import Script

SEEDS = {"smoke": 2, "quick": 5, "standard": 5, "paper": 1}
"""Seeds per preset (the claims' five on the CPU presets)."""

LINEAR_EPOCHS = 100
"""Epochs of each linear evaluation by default (the kit's linear evaluation:
docs/choices.md); the length of every score kept before ``candidates.json`` named it."""

SCRIPT = Script(__file__, __doc__, default_preset="quick", runs=True)


def _options(parser) -> None:
    parser.add_argument("--methods", type=name_list(tuple(SSL_METHODS)),
                        default=list(SSL_METHODS), metavar="METHOD[,METHOD...]",
                        help="a subset of " + ",".join(SSL_METHODS) + " (default: all)")
    parser.add_argument("--grid", action="append", default=[], metavar="SETTING=V1,V2",
                        help="candidates of a setting for every chosen method instead of "
                             "its own grid, e.g. --grid projector_dim=128,256,512 "
                             "(repeatable: the candidates are every combination)")
    parser.add_argument("--seeds", type=int, help="seeds, each with its own candidates "
                                                  "(default: quick, standard 5; smoke 2)")
    parser.add_argument("--linear-epochs", type=int, default=LINEAR_EPOCHS, metavar="E",
                        help="epochs of each linear evaluation (default 100, the kit's "
                             "linear evaluation: docs/choices.md)")
    parser.add_argument("--no-runs", action="store_true",
                        help="select only: no CP-CFL runs from the encoders")


def parse_grid(items: Sequence[str]) -> dict[str, list]:
    """``["projector_dim=256,512"]`` as ``{"projector_dim": [256, 512]}`` (JSON values)."""
    grid: dict[str, list] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not (sep and name and text):
            raise UserError(f"--grid takes SETTING=V1,V2, got {item!r}")
        try:
            grid[name.strip()] = [json.loads(v) for v in text.split(",") if v.strip()]
        except json.JSONDecodeError:
            raise UserError(f"--grid {name} takes numbers, true/false or null, got {text!r}"
                            ) from None
    return grid


def check_grid(method: str, grid: dict[str, list]) -> None:
    """One-line error for a grid setting ``method`` does not have or a value it cannot
    take."""
    spec = SSL_METHODS[method]
    for name, values in grid.items():
        if name not in spec.settings:
            raise UserError(f"--grid {name}: {method} has no setting {name!r}; its settings: "
                            f"{', '.join(spec.settings)}")
        for value in values:
            spec.check({name: value}, where="--grid")


def candidates(config: Config, method: str, grid: dict[str, list]) -> list[dict[str, Any]]:
    """The settings of each candidate of ``method`` (every combination of the grid, the
    method's own when ``grid`` is empty), spelled as configs spell them, each checked."""
    import itertools

    spec = SSL_METHODS[method]
    grid = grid or {k: list(v) for k, v in spec.grid.items()}
    if not grid:
        return [{}]
    names = list(grid)  # checked by check_grid before the session began
    from cpcfl_tf.plan.choices import ENCODER_DIMS

    encoder, dim = config.pretrain.encoder, ENCODER_DIMS[config.pretrain.encoder]
    out = []
    for values in itertools.product(*(grid[n] for n in names)):
        out.append({n: spec.spelled(n, v, encoder, dim) for n, v in zip(names, values)})
    return out


def _with(config: Config, method: str, settings: dict) -> Config:
    """``config`` starting from the server's pre-training with ``method`` and ``settings``."""
    return config.with_overrides(pretrain={"options": {**(config.pretrain.options or {}),
                                                       method: settings}},
                                 federated={"pretraining": method})


def shown(config: Config, method: str, settings: dict) -> dict:
    """``settings`` with each default of None replaced by what it stands for on the
    config's encoder (:attr:`~cpcfl_tf.methods.ssl.Setting.means`)."""
    from cpcfl_tf.plan.choices import ENCODER_DIMS

    spec, encoder = SSL_METHODS[method], config.pretrain.encoder
    out = {}
    for k, v in settings.items():
        means = spec.settings[k].means
        out[k] = means(encoder, ENCODER_DIMS[encoder]) if v is None and means else v
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = SCRIPT.parser()
    _options(parser)
    args = parser.parse_args(argv)
    grid = parse_grid(args.grid)
    for method in args.methods:  # refused before the output folder is made
        check_grid(method, grid)
    session = SCRIPT.session(args)
    config, out = session.config, session.out
    seeds = [config.seed + s for s in range(args.seeds or SEEDS[config.preset])]
    plan = {m: candidates(config, m, grid) for m in args.methods}  # refused before any work
    session.reuse_committed()  # the default encoders' CP-CFL runs are other scripts' too
    specs = [] if args.no_runs else [
        RunSpec(f"seed{seed}-cp-cfl-{m}", "cp-cfl", m, seed=seed, row=m)
        for seed in seeds for m in args.methods]
    specs = session.kept(specs, also=[f"{m} seed {seed}: {label(c)}" for seed in seeds
                                      for m, cs in plan.items() for c in cs])
    rows = score_candidates(session, plan, seeds)
    selected = choose(rows)
    runs = {} if args.no_runs else run_selected(session, specs, selected)
    from cpcfl_tf.records.environment import environment
    from cpcfl_tf.records.files import write_json

    write_json(out / "encoder_selection.json", {
        "experiment": "encoder_selection", "preset": config.preset,
        "config": config.to_dict(), "seeds": seeds, "grid": grid or "each method's own",
        "candidates": rows,
        "selected": {str(s): {m: c for m, c in per.items()} for s, per in selected.items()},
        "cp_cfl": runs, "environment": environment()})
    text = report(config, rows, selected, runs)
    session.finish(text, rows=[
        {k: v for k, v in r.items() if k not in ("settings", "shown")}
        | {"candidate": label(r["shown"])} for r in rows])
    if (list(args.methods) == list(SSL_METHODS) and not grid and runs
            and len(seeds) == SEEDS[config.preset]):
        session.update_readme("selection", summary_part(text), "encoder selection tables")


def score_candidates(session, plan: dict[str, list[dict]], seeds: list[int]) -> list[dict]:
    """Pre-train (or find in the cache) and score every candidate of every seed; the
    scores of a candidate scored before (``candidates.json`` in the output folder) are
    kept, as its cache entry names the same encoder."""
    from cpcfl_tf.plan.resolve import resolve
    from cpcfl_tf.pretraining.knn import proxy_scores
    from cpcfl_tf.records.files import read_json, write_json

    config, runner = session.config, session.runner
    kept_path = session.out / "candidates.json"
    kept = {} if session.args.force or not kept_path.exists() else read_json(
        kept_path, fix="delete it to score the candidates again")
    for entry in kept.values():  # scored before the length was kept: the default's
        entry.setdefault("linear_epochs", LINEAR_EPOCHS)
    proxy = None
    rows = []
    for seed in seeds:
        for method, cands in plan.items():
            for settings in cands:
                run = resolve(_with(config.with_overrides(seed=seed), method, settings))
                folder = runner.encoders.pretrain_folder(run.pretraining).name
                epochs = session.args.linear_epochs
                if kept.get(folder, {}).get("linear_epochs", epochs) != epochs:
                    kept.pop(folder, None)  # scored with another --linear-epochs
                if folder not in kept:
                    proxy = proxy or runner.data.client_splits(config.data)
                    result = runner.encoders.contrastive(run)
                    kept[folder] = {**proxy_scores(result.encoder, *proxy, seed=seed,
                                                   epochs=epochs),
                                    "final_loss": result.history[-1]["loss"]}
                    write_json(kept_path, kept)
                    print(f"seed {seed} {method} {label(settings)}: linear "
                          f"{kept[folder]['linear_accuracy']:.4f}, kNN "
                          f"{kept[folder]['knn_accuracy']:.4f}", flush=True)
                rows.append({"seed": seed, "method": method, "settings": settings,
                             "shown": shown(config, method, settings),
                             "paper": all(v == SSL_METHODS[method].settings[k].default
                                          for k, v in settings.items()),
                             "cache": folder, **kept[folder]})
    return rows


def run_selected(session, specs: list[RunSpec], selected) -> dict[str, dict]:
    """CP-CFL from the paper's encoder and from the selected one, per method and seed;
    the paired difference (selected − paper) by the claims' rule."""
    import dataclasses

    paper: dict[str, dict[int, RunRecord]] = {}
    chosen: dict[str, dict[int, RunRecord]] = {}
    for spec in specs:  # as planned by main
        seed, method = spec.seed_or(session.config.seed), spec.pretraining
        paper.setdefault(method, {})[seed] = session.runner.run(spec)
        pick = selected[seed][method]
        if pick["paper"]:
            chosen.setdefault(method, {})[seed] = paper[method][seed]
        else:
            other = dataclasses.replace(spec, name=f"{spec.name}-selected",
                                        pretrain={"options": {method: pick["settings"]}})
            chosen.setdefault(method, {})[seed] = session.runner.run(other)
    out = {}
    for method in paper:
        diff = {s: final_accuracy(chosen[method][s]) - final_accuracy(paper[method][s])
                for s in paper[method]}
        out[method] = {"paper": {str(s): final_accuracy(r) for s, r in paper[method].items()},
                       "selected": {str(s): final_accuracy(r)
                                    for s, r in chosen[method].items()},
                       "difference": verdict(diff).to_json()}
    return out


if __name__ == "__main__":
    run_cli(main)
