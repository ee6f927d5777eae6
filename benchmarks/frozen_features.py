"""federated.frozen_features against the default: the accuracy it costs over seeds.

``federated.frozen_features`` trains the head of a local epoch that freezes the encoder
(the Tc phase; the epochs after ``encoder_epochs``) on features computed once per round
instead of in every step: faster, and other last bits (a feature's bits depend on its
batch). This makes CP-CFL (SimCLR) runs of the preset with and without it for
``--seeds`` seeds (``--seed`` and the ones after: each its own clients, batches and pool,
all from the preset's encoder, pre-trained with ``--seed``) and reports each seed's final
accuracy side by side, the paired differences' mean and 95 % interval, and whether the
option's accuracy is within the seeds' spread: equivalent within plus or minus the
default runs' seed-to-seed standard deviation by two one-sided t-tests at 5 %
(``cpcfl_tf.evidence.judge.equivalent``), the margin fixed by the default runs before
the differences are looked at. Its speed is measured apart, alone
(``benchmarks/round_stages.py --set federated.frozen_features=true``; docs/performance.md),
not from these runs' records, which may have shared the cores.
"""
from __future__ import annotations

import argparse
from collections.abc import Sequence

import numpy as np

from cpcfl_tf.errors import run_cli
from cpcfl_tf.evidence.judge import ALPHA, equivalent, t_interval
from cpcfl_tf.running.report import markdown_table
from cpcfl_tf.running.runner import RunSpec
from cpcfl_tf.running.script import Script

SCRIPT = Script(__file__, __doc__, default_preset="quick")


def specs(seed: int, seeds: int) -> list[RunSpec]:
    """Per seed the default run and the option's, all from the encoder of ``seed``."""
    return [RunSpec(f"cp-cfl-simclr{suffix}-seed{s}", "cp-cfl", "simclr", federated=federated,
                    seed=s, pretrain={"seed": seed})
            for s in range(seed, seed + seeds)
            for suffix, federated in (("", {}), ("-frozen", {"frozen_features": True}))]


def summary(default: Sequence[float], frozen: Sequence[float]) -> dict:
    """The paired comparison of two lists of per-seed accuracies (the same seeds)."""
    base, fixed = np.asarray(default, float), np.asarray(frozen, float)
    differences = fixed - base
    margin = float(base.std(ddof=1))
    low, high = t_interval(differences)
    p = equivalent(differences, margin)
    return {"default_mean": float(base.mean()), "default_sd": margin,
            "frozen_mean": float(fixed.mean()), "frozen_sd": float(fixed.std(ddof=1)),
            "difference_mean": float(differences.mean()), "difference_interval": [low, high],
            "margin": margin, "equivalence_p": p, "within_spread": p < ALPHA}


def _p(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"= {p:.3f}"


def at_least_two(text: str) -> int:
    """An argparse ``type``: an integer >= 2 (an interval needs two seeds)."""
    if not text.isdigit() or int(text) < 2:
        raise argparse.ArgumentTypeError(f"takes an integer >= 2 (an interval needs two "
                                         f"seeds), got {text!r}")
    return int(text)


def main(argv: Sequence[str] | None = None) -> None:
    def options(parser):
        parser.add_argument("--seeds", type=at_least_two, default=5,
                            help="seeds per setting, at least 2 (default 5)")

    session = SCRIPT.start(argv, options)
    config, count = session.config, session.args.seeds
    records = session.run_all(specs(config.seed, count))
    seeds = range(config.seed, config.seed + count)
    default = [records[f"cp-cfl-simclr-seed{s}"].final_accuracy for s in seeds]
    frozen = [records[f"cp-cfl-simclr-frozen-seed{s}"].final_accuracy for s in seeds]
    result = summary(default, frozen)
    pairs = list(zip(seeds, default, frozen))
    rows = [{"seed": s, "frozen_features": flag, "accuracy": accuracy}
            for s, d, f in pairs for flag, accuracy in ((False, d), (True, f))]
    low, high = result["difference_interval"]
    verdict = ("within the seeds' spread" if result["within_spread"] else
               "not shown to be within the seeds' spread")
    lines = [f"# federated.frozen_features against the default (preset `{config.preset}`), "
             f"CP-CFL (SimCLR), T = {config.federated.rounds}, "
             f"Tc = {config.federated.head_rounds}", "",
             "Final accuracy (%) per seed; each seed's two runs share clients, batches, pool "
             "and encoder.", "",
             *markdown_table(["seed", "default", "frozen_features", "difference"],
                             [[str(s), f"{100 * d:.2f}", f"{100 * f:.2f}", f"{100 * (f - d):+.2f}"]
                              for s, d, f in pairs]), "",
             f"Default {100 * result['default_mean']:.2f} ± {100 * result['default_sd']:.2f}, "
             f"frozen_features {100 * result['frozen_mean']:.2f} ± "
             f"{100 * result['frozen_sd']:.2f} (mean ± standard deviation over {count} seeds). "
             f"Paired difference {100 * result['difference_mean']:+.2f} points, 95 % interval "
             f"[{100 * low:+.2f}, {100 * high:+.2f}]; against a margin of ± the default's "
             f"seed-to-seed standard deviation ({100 * result['margin']:.2f} points), two "
             f"one-sided t-tests give p {_p(result['equivalence_p'])}: {verdict}."]
    session.finish("\n".join(lines) + "\n", rows)


if __name__ == "__main__":
    run_cli(main)
