"""Beyond the paper: the clustered-FL families beside IFCA, each from random weights and from
the seed's own SimCLR encoder, and whether the encoder helps each of them.

The paper shows one family, clients that pick a model by their own loss (IFCA), failing
to form clusters from random weights, and a contrastive encoder fixing that (CP-CFL).
Here the families that cluster on the server run in the same protocol: by the clients'
models (FeSEM), by their updates once (FL+HC; FedGroup, by their decomposed cosine
similarity) or recursively (CFL), by their data before training (PACFL), with the two
references of clustered FL, each client alone (local) and FedAvg within the true groups
(oracle). Every seed k (``--seed`` + k) draws
its own partition, initial weights, batch order and pre-trained encoder. For each family
the paired difference "from SimCLR minus from random" is judged by the claims' rule
(``cpcfl_tf.evidence.judge.RULE``).
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from cpcfl_tf.errors import UserError, run_cli
from cpcfl_tf.evidence.judge import (
    HOLDS,
    NOT_SHOWN,
    OPPOSITE,
    RULE,
    final_accuracy,
    paired,
    verdict,
)
from cpcfl_tf.methods.federated import run_label
from cpcfl_tf.records.record import RunRecord
from cpcfl_tf.running.cli import positive_int
from cpcfl_tf.running.report import markdown_table, mean_sd_cell
from cpcfl_tf.running.runner import RunSpec
from cpcfl_tf.running.script import Script

FAMILIES = ("local", "oracle", "fedavg", "fesem", "cfl", "fl-hc", "pacfl", "fedgroup")
"""Each from random weights and from SimCLR."""
ROWS = {f"{m}-{pre}": (m, pre) for m in FAMILIES for pre in ("none", "simclr")}
ROWS.update({"ifca-none": ("ifca", "none"), "ifca-fedavg": ("ifca", "fedavg"),
             "cp-cfl-simclr": ("cp-cfl", "simclr")})
PAIRS = {run_label(m, "simclr").split(" (")[0]: (f"{m}-simclr", f"{m}-none")
         for m in FAMILIES}
PAIRS["IFCA (CP-CFL)"] = ("cp-cfl-simclr", "ifca-none")
"""Family -> (from SimCLR, from random). IFCA's family from SimCLR is CP-CFL."""
EFFECT = {HOLDS: "helps", OPPOSITE: "hurts", NOT_SHOWN: "no difference shown"}

SCRIPT = Script(__file__, __doc__, default_preset="quick", rows=tuple(ROWS))


def specs(seeds: Sequence[int]) -> list[RunSpec]:
    return [RunSpec(f"seed{seed}-{name}", method, pre, seed=seed, row=name)
            for seed in seeds for name, (method, pre) in ROWS.items()]


def _ari(record: RunRecord) -> float | None:
    return None if record.config.federated.num_clusters == 1 else record.final.ari


def _known_ari(record: RunRecord) -> float:
    """The ARI of a run :func:`_ari` gives one (the only runs it is paired over)."""
    ari = _ari(record)
    assert ari is not None, record.experiment
    return ari


def _options(parser) -> None:
    parser.add_argument("--trials", type=positive_int, default=5,
                        help="seeds --seed .. --seed + trials - 1 (default 5)")
    parser.add_argument("--report", action="store_true",
                        help="make no run: write the report from the runs finished in the "
                             "output folder, and name the missing ones with the command "
                             "that makes them")
    parser.add_argument("--reuse", metavar="TREE",
                        help="a results tree whose runs of the same config this machine would "
                             "make bit for bit (e.g. the trials' IFCA and CP-CFL runs) are "
                             "used instead of run again (default: results/<preset> when "
                             "writing into it; --force runs everything)")


def main(argv: Sequence[str] | None = None) -> None:
    session = SCRIPT.start(argv, _options)
    config, args = session.config, session.args
    seeds = list(range(args.seed, args.seed + args.trials))
    if args.reuse and not Path(args.reuse).is_dir():
        raise UserError(f"--reuse {args.reuse}: no such folder; pass a results tree the "
                        "scripts wrote")
    session.reuse_committed(Path(args.reuse) if args.reuse else None)
    runs: dict[str, dict[int, RunRecord]] = {name: {} for name in ROWS if session.wanted(name)}
    done, missing = session.run_or_read(specs(seeds), args.report)
    for spec, record in done:
        runs[spec.key][spec.seed_or(args.seed)] = record
    runs = {name: by_seed for name, by_seed in runs.items() if by_seed}

    table = []
    for name, by_seed in runs.items():
        records = list(by_seed.values())
        table.append([run_label(*ROWS[name]), len(records),
                      mean_sd_cell([final_accuracy(r) for r in records]),
                      mean_sd_cell([_ari(r) for r in records], "{:.3f}"),
                      mean_sd_cell([r.last_cluster_change() for r in records
                                    if _ari(r) is not None], "{:.1f}"),
                      mean_sd_cell([(r.final.bytes_down + r.final.bytes_up) / 1e6 for r in records],
                            "{:.0f}")])
    effects = []
    for family, (pre, none) in PAIRS.items():
        if pre not in runs or none not in runs:
            continue
        acc = verdict(paired(runs[pre], runs[none], final_accuracy))
        ari = paired({s: r for s, r in runs[pre].items() if _ari(r) is not None},
                     {s: r for s, r in runs[none].items() if _ari(r) is not None},
                     _known_ari)
        interval = acc.interval
        effects.append([
            family, acc.n, f"{acc.mean:+.2f}" if acc.n else "-",
            f"{min(acc.values):+.2f} .. {max(acc.values):+.2f}" if acc.n else "-",
            f"[{interval[0]:+.2f}, {interval[1]:+.2f}]" if interval else "-",
            EFFECT.get(acc.verdict, acc.verdict),
            f"{sum(ari.values()) / len(ari):+.3f}" if ari else "-"])

    planned = len(missing) + sum(map(len, runs.values()))
    lines = [f"# Clustered-FL families (preset `{config.preset}`): "
             f"{config.partition.num_clients} clients in {config.partition.num_groups} groups, "
             f"N = {config.federated.num_clusters}, T = {config.federated.rounds}, seeds "
             f"{seeds[0]}..{seeds[-1]}" + (f" (partial: {planned - len(missing)} of {planned} "
                                           "runs)" if missing else ""), ""]
    if missing:
        lines += [f"**Partial.** This folder holds {planned - len(missing)} of the {planned} "
                  f"runs of the table; every mean, verdict and figure below is over those alone. "
                  f"Missing ({len(missing)}): {_missing(missing, len(ROWS), args.seed)}. "
                  f"`{session.resume_command()}` makes them.", ""]
    lines += [
             "Mean ± SD over the seeds (ddof = 0). ARI of the final cluster ids against the "
             "true groups (one-model runs have none); *settled*: the round after which no "
             "client changed cluster again; *MB*: bytes sent down and up in the whole run.", ""]
    lines += markdown_table(["run", "seeds", "accuracy (%)", "ARI", "settled after round",
                             "MB sent"], table)
    lines += ["", "## Does the SimCLR encoder help each family?", "",
              "Per seed: accuracy (points) from the seed's SimCLR encoder minus from random "
              "weights, same partition. IFCA's family from SimCLR is CP-CFL. The verdict "
              "follows the claims' rule: *helps* when the 95 % interval lies above zero, "
              "*hurts* when below, *no difference shown* when it contains zero.", ""]
    effect_table = markdown_table(["family", "n", "mean", "min .. max", "95 % interval",
                                   "SimCLR", "ARI change"], effects)
    lines += effect_table + ["", "<details><summary>The rule</summary>", "", RULE, "</details>"]
    rows = [{"run": name, "method": ROWS[name][0], "pretraining": ROWS[name][1], "seed": seed,
             "accuracy": r.final.accuracy, "ari": _ari(r),
             "last_cluster_change": r.last_cluster_change(), "restarts": r.final.restarts,
             "bytes_down": r.final.bytes_down, "bytes_up": r.final.bytes_up,
             "bytes_other": r.final.bytes_other}
            for name, by_seed in runs.items() for seed, r in by_seed.items()]
    _figures(runs, session.out, config.preset)
    session.finish("\n".join(lines) + "\n", rows)
    if len(runs) == len(ROWS) and not missing:
        session.update_readme("families", effect_table, "families table")


def _missing(specs: Sequence[RunSpec], rows: int, seed: int) -> str:
    """The missing runs by seed, e.g. ``seed 0: cfl-simclr, ifca-none; seeds 1-4: all``."""
    by_seed: dict[int, list[str]] = {}
    for spec in specs:
        by_seed.setdefault(spec.seed_or(seed), []).append(spec.key)
    whole = [seed for seed, keys in by_seed.items() if len(keys) == rows]
    parts = [f"seed {seed}: {', '.join(keys)}" for seed, keys in by_seed.items()
             if len(keys) < rows]
    if whole:
        parts.append(f"seed{'s' if len(whole) > 1 else ''} "
                     f"{', '.join(map(str, whole))}: every run")
    return "; ".join(parts)


def _figures(runs: dict, out: Path, preset: str) -> None:
    from cpcfl_tf.evidence.plots import plot_paired_bars

    families = [f for f, (a, b) in PAIRS.items() if a in runs and b in runs]
    for name, stat in (("accuracy", final_accuracy), ("ari", _ari)):
        bars = {}
        for start, side in (("random weights", 1), ("SimCLR", 0)):
            bars[start] = [[v for v in map(stat, runs[PAIRS[f][side]].values()) if v is not None]
                           for f in families]
        plot_paired_bars(families, bars, out / f"{name}.png",
                         ylabel="final accuracy (%)" if name == "accuracy" else "final ARI",
                         title=f"Clustered-FL families from random weights and from SimCLR "
                               f"(preset {preset})")


if __name__ == "__main__":
    run_cli(main)
