"""Beyond the paper: clustering or personalization? CP-CFL (SimCLR) against personalized
FL from the same encoder.

With a good shared encoder, do per-client models already do what clustering does? Each
personalized method runs from the seed's own SimCLR encoder (the one CP-CFL starts from)
and from random weights: FedAvg+FT (FedAvg, each client scored after fine-tuning the
global model), FedPer (personal heads), FedRep (personal heads trained first on the
frozen encoder), LG-FedAvg (personal encoders, a global head) and Ditto (a personal
model pulled towards FedAvg's). Two heterogeneities: the paper's label-skew groups, and
rotated groups (every client holds every class; a group's images are turned by its own
quarter turn: the groups differ in their inputs, not their labels). Every seed k
(``--seed`` + k) draws its own partition, initial weights, batch order and encoder.

Per partition, each link is CP-CFL (SimCLR) minus a rival's final accuracy, per seed,
judged by the claims' rule (``cpcfl_tf.evidence.judge.RULE``) with the bounds and the
seeds that would decide it, as the claims page gives them; beside it, what each method
sends and what its clients keep. Every rival runs at smoke and quick; the standard and
paper presets run the quick study's two strongest (:data:`STANDARD_RIVALS`), which the
quick report names (:func:`strongest`); ``--rivals`` picks others. Once every run of the
preset's rivals is in, the verdicts go to ``results/README.md`` (the kit's own folder only).
"""

from __future__ import annotations

from collections.abc import Sequence

from cpcfl_tf.errors import run_cli
from cpcfl_tf.evidence.judge import (
    HOLDS,
    NOT_SHOWN,
    OPPOSITE,
    RULE,
    bounds,
    final_accuracy,
    paired,
    verdict,
)
from cpcfl_tf.methods.federated import get_method, run_label
from cpcfl_tf.records.record import RunRecord
from cpcfl_tf.running.cli import name_list, positive_int
from cpcfl_tf.running.report import markdown_table, mean_sd_cell
from cpcfl_tf.running.runner import RunSpec
from cpcfl_tf.running.script import Script

RIVALS = ("fedavg-ft", "fedper", "fedrep", "lg-fedavg", "ditto")
"""The personalized methods, each from SimCLR and from random weights."""
STANDARD_RIVALS = ("fedper", "ditto")
"""What the standard and paper presets run without ``--rivals``: the two strongest rivals
of the kit's quick study (:func:`strongest`; its report names them, and a test holds this
to the committed quick records)."""
STARTS = ("simclr", "none")
OURS = "cp-cfl-simclr"
PARTITIONS = {"label-skew": {}, "rotated": {"kind": "rotated"}}
"""The heterogeneities and their ``partition`` overrides (label skew: the preset's own)."""
WINNER = {HOLDS: "clustering", OPPOSITE: "personalization", NOT_SHOWN: "not told apart"}


def rows(rivals: Sequence[str] = RIVALS) -> dict[str, tuple[str, str]]:
    """Row name -> (method, pretraining): CP-CFL (SimCLR), then each rival from each start."""
    out = {OURS: ("cp-cfl", "simclr")}
    out.update({f"{m}-{pre}": (m, pre) for m in rivals for pre in STARTS})
    return out


SCRIPT = Script(__file__, __doc__, default_preset="quick")


def specs(seeds: Sequence[int], rivals: Sequence[str], partitions: Sequence[str]) -> list[RunSpec]:
    return [
        RunSpec(
            f"seed{seed}-{part}-{name}",
            method,
            pre,
            partition=PARTITIONS[part],
            seed=seed,
            row=f"{part}/{name}",
        )
        for seed in seeds
        for part in partitions
        for name, (method, pre) in rows(rivals).items()
    ]


def _options(parser) -> None:
    parser.add_argument(
        "--trials", type=positive_int, default=5,
        help="seeds --seed .. --seed + trials - 1 (default 5)",
    )
    parser.add_argument(
        "--rivals",
        type=name_list(RIVALS),
        metavar="NAME[,NAME...]",
        help="the personalized methods to run: " + ",".join(RIVALS) + " (default: all at "
        "smoke and quick; at standard and paper " + ",".join(STANDARD_RIVALS) + ", the two "
        "strongest at quick)",
    )
    parser.add_argument(
        "--partitions",
        type=name_list(tuple(PARTITIONS)),
        default=list(PARTITIONS),
        metavar="NAME[,NAME...]",
        help="the heterogeneities: " + ",".join(PARTITIONS) + " (default: both)",
    )
    parser.add_argument(
        "--report",
        action="store_true",
        help="make no run: write the report from the runs finished in the output folder, "
        "and name the missing ones with the command that makes them",
    )


def default_rivals(preset: str) -> list[str]:
    """``--rivals`` when not given: every rival at smoke and quick, the quick study's two
    strongest (:data:`STANDARD_RIVALS`) at the larger presets."""
    return list(RIVALS if preset in ("smoke", "quick") else STANDARD_RIVALS)


def links(runs: dict[str, dict[int, RunRecord]], part: str, rivals: Sequence[str]) -> list[dict]:
    """Per rival run of ``part``: CP-CFL (SimCLR) minus it, per seed, and the verdict."""
    ours = runs.get(f"{part}/{OURS}", {})
    out = []
    for name in rows(rivals):
        theirs = runs.get(f"{part}/{name}")
        if name == OURS or not theirs or not ours:
            continue
        summary = verdict(paired(ours, theirs, final_accuracy))
        out.append({"rival": name, "summary": summary})
    return out


def strongest(
    runs: dict[str, dict[int, RunRecord]],
    rivals: Sequence[str],
    partitions: Sequence[str],
    k: int = 2,
) -> list[str]:
    """The ``k`` rival methods closest to CP-CFL (SimCLR): the smallest mean of their links'
    means (CP-CFL minus the rival, per seed) over every partition and start they have, each
    link weighted alike; a method with no link is left out."""
    means: dict[str, list[float]] = {}
    for part in partitions:
        for link in links(runs, part, rivals):
            if link["summary"].n:
                means.setdefault(rows(rivals)[link["rival"]][0], []).append(link["summary"].mean)
    return sorted(means, key=lambda m: (sum(means[m]) / len(means[m]), rivals.index(m)))[:k]


def strongest_line(runs, config, args) -> list[str]:
    """Which two rivals the standard preset runs, named from these records."""
    two = strongest(runs, args.rivals, args.partitions)
    if config.preset == "standard" or len(two) < 2:
        return []
    def label(methods: Sequence[str]) -> str:
        return " and ".join(get_method(m).label for m in methods)

    command = "python experiments/personalization.py --preset standard"
    if tuple(two) == STANDARD_RIVALS:
        then = f"At standard, its default: `{command} --resume`."
    else:  # the committed quick study ranks them otherwise: STANDARD_RIVALS is behind
        then = (f"At standard: `{command} --rivals {','.join(two)} --resume` (its default, "
                f"`STANDARD_RIVALS`, is {label(STANDARD_RIVALS)}).")
    return [
        f"The two strongest rivals here (the smallest mean of CP-CFL (SimCLR) − rival over "
        f"both partitions and starts): {label(two)}. {then}"
    ]


def report_lines(
    runs: dict[str, dict[int, RunRecord]], config, seeds: Sequence[int], args, missing: int
) -> tuple[list[str], dict[str, list[str]]]:
    """The report's lines, and per partition the verdicts' table (what README shows)."""
    lines = [
        f"# Clustering or personalization (preset `{config.preset}`): "
        f"{config.partition.num_clients} clients in {config.partition.num_groups} groups, "
        f"N = {config.federated.num_clusters}, T = {config.federated.rounds}, seeds "
        f"{seeds[0]}..{seeds[-1]}" + (f" (partial: {missing} runs missing)" if missing else ""),
        "",
        "Mean ± SD over the seeds (ddof = 0). *MB sent*: bytes down and up in the whole "
        "run; *MB kept*: what all clients keep of their own between rounds, never sent.",
    ]
    tables: dict[str, list[str]] = {}
    for part in args.partitions:
        table = []
        for name, (method, pre) in rows(args.rivals).items():
            by_seed = runs.get(f"{part}/{name}")
            if not by_seed:
                continue
            records = list(by_seed.values())
            table.append(
                [
                    run_label(method, pre),
                    len(records),
                    mean_sd_cell([final_accuracy(r) for r in records]),
                    mean_sd_cell(
                        [(r.final.bytes_down + r.final.bytes_up) / 1e6 for r in records], "{:.1f}"
                    ),
                    mean_sd_cell([r.final.bytes_kept / 1e6 for r in records], "{:.1f}"),
                ]
            )
        verdicts = []
        for link in links(runs, part, args.rivals):
            summary = link["summary"]
            method, pre = rows(args.rivals)[link["rival"]]
            values = summary.values
            verdicts.append(
                [
                    f"CP-CFL (SimCLR) − {run_label(method, pre)}",
                    summary.n,
                    f"{summary.mean:+.2f}" if summary.n else "-",
                    f"{values.min():+.2f} .. {values.max():+.2f}" if summary.n else "-",
                    bounds(summary),
                    WINNER.get(summary.verdict, summary.verdict),
                    summary.seeds_needed if summary.seeds_needed is not None else "-",
                ]
            )
        tables[part] = markdown_table(
            ["link", "n", "mean", "min .. max", "95 % interval", "wins", "seeds to decide"],
            verdicts,
        )
        lines += ["", f"## {part}", ""]
        lines += markdown_table(["run", "seeds", "accuracy (%)", "MB sent", "MB kept"], table)
        lines += ["", "Per seed: CP-CFL (SimCLR)'s accuracy minus the rival's (points).", ""]
        lines += tables[part]
    named = strongest_line(runs, config, args)
    lines += ["", *named] if named else []
    lines += ["", "<details><summary>The rule</summary>", "", RULE, "</details>"]
    return lines, tables


def summary_sentences(runs: dict[str, dict[int, RunRecord]], args) -> list[str]:
    """Where clustering wins, where personalization does, where they cannot be told
    apart: one sentence per partition, from the verdicts."""
    out = []
    for part in args.partitions:
        found: dict[str, list[str]] = {}
        for link in links(runs, part, args.rivals):
            method, pre = rows(args.rivals)[link["rival"]]
            word = WINNER.get(link["summary"].verdict, "not yet judged")
            found.setdefault(word, []).append(run_label(method, pre))
        said = [
            f"{word} against {', '.join(names)}"
            if word != "not told apart"
            else f"not told apart from {', '.join(names)}"
            for word, names in found.items()
        ]
        if found and "personalization" not in found:
            said.append("personalization wins against none")
        out.append(f"- {part}: CP-CFL (SimCLR) — " + "; ".join(said) + ".")
    return out


def main(argv: Sequence[str] | None = None) -> None:
    session = SCRIPT.start(argv, _options)
    config, args = session.config, session.args
    seeds = list(range(args.seed, args.seed + args.trials))
    if args.rivals is None:
        args.rivals = default_rivals(config.preset)
    session.reuse_committed()
    runs: dict[str, dict[int, RunRecord]] = {}
    done, missing = session.run_or_read(specs(seeds, args.rivals, args.partitions), args.report)
    for spec, record in done:
        runs.setdefault(spec.key, {})[spec.seed_or(args.seed)] = record
    lines, tables = report_lines(runs, config, seeds, args, len(missing))
    if missing:
        lines[1:1] = [
            "",
            f"**Partial.** {len(missing)} runs are missing; every mean and verdict below is "
            f"over the runs there. `{session.resume_command()}` makes them.",
        ]
    csv_rows = [
        {
            "partition": key.split("/")[0],
            "run": key.split("/")[1],
            "seed": seed,
            "accuracy": r.final.accuracy,
            "bytes_down": r.final.bytes_down,
            "bytes_up": r.final.bytes_up,
            "bytes_kept": r.final.bytes_kept,
            "seconds_per_round": r.timing.get("seconds_per_round"),
        }
        for key, by_seed in runs.items()
        for seed, r in sorted(by_seed.items())
    ]
    session.finish("\n".join(lines) + "\n", csv_rows)
    if not missing and sorted(args.rivals) == sorted(default_rivals(config.preset)):
        named = strongest_line(runs, config, args)
        block = summary_sentences(runs, args) + (["", *named] if named else [])
        for part, table in tables.items():
            block += ["", f"{part}:", "", *table]
        session.update_readme("personalization", block, "personalization verdicts")


if __name__ == "__main__":
    run_cli(main)
