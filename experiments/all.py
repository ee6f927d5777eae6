"""The whole paper in one command: every table script of a preset in turn, then one report.

Runs table2, clusters, encoder_training, datasets, heads, supervised, clients, trials,
resnet, linear_eval, pretraining_cost and heterogeneity (finished runs are skipped,
interrupted ones resumed) and writes ``results/<preset>/report.md``: every table with the
paper's numbers beside ours (each script's own report), every figure, the generated
claims table (``results/<preset>/claims.md``, ``experiments/claims.py``), and the compute
time each script's runs recorded (the time each script takes now is printed).
"""
from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from cpcfl_tf.errors import run_cli
from cpcfl_tf.running.cli import name_list
from cpcfl_tf.running.report import markdown_table
from cpcfl_tf.running.script import Script, load_script

SCRIPTS = ("table2", "clusters", "encoder_training", "datasets", "heads", "supervised",
           "clients", "trials", "resnet", "linear_eval", "pretraining_cost", "heterogeneity")
"""In the order of the paper's tables, then what goes beyond the paper; each is
``experiments/<name>.py``."""
OTHER_RUNS = ("claims", "cfl_families", "personalization")
"""Folders of run records that other scripts write under the preset's (``claims.py
--run``, ``cfl_families.py``, ``personalization.py``): their compute time is in the
report's table too."""
SCRIPT = Script(__file__, __doc__, default_preset="quick", runs=False)
"""Its options are every script's (``--out`` is the preset's folder, default
``results/<preset>``)."""


def _options(parser) -> None:
    parser.add_argument("--scripts", type=name_list(SCRIPTS), default=list(SCRIPTS),
                        metavar="NAME[,NAME...]",
                        help="a subset of " + ",".join(SCRIPTS) + " (default: all; the report "
                             "still shows every script whose folder has a report)")


def load(name: str) -> ModuleType:
    """``experiments/<name>.py`` as a module."""
    return load_script(Path(__file__).with_name(f"{name}.py"))


def _records(folder: Path) -> list[dict]:
    """The JSON objects in ``folder`` (run records, evaluations), unreadable ones skipped."""
    out = []
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text())
        except ValueError:
            continue
        if isinstance(data, dict):
            out.append(data)
    return out


def recorded(folder: Path) -> tuple[float, list[int]]:
    """Seconds of compute the run records in ``folder`` say they took, and the seeds
    (partition and training) of its records, from one read of the folder."""
    records = _records(folder)
    seconds = sum(d["timing"].get("seconds") or 0.0 for d in records
                  if isinstance(d.get("timing"), dict))
    seeds = sorted({d["seeds"]["data"] for d in records
                    if isinstance(d.get("seeds"), dict) and "data" in d["seeds"]})
    return seconds, seeds


def _seed_list(seeds: list[int]) -> str:
    return ", ".join(map(str, seeds)) or "-"


def claims(root: Path) -> list[str]:
    """The generated claims table of the preset (``<root>/claims.md``, written by
    ``experiments/claims.py``), one heading level down, if there is one."""
    path = root / "claims.md"
    if not path.exists():
        return []
    return ["#" + line if line.startswith("#") else line
            for line in path.read_text().rstrip().splitlines()]


def main(argv: Sequence[str] | None = None) -> None:
    parser = SCRIPT.parser()
    _options(parser)
    args = parser.parse_args(argv)
    from cpcfl_tf.records.files import prepare_out_dir, write_text
    from cpcfl_tf.running.cli import resolve_config
    from cpcfl_tf.running.script import run_context

    run_context(args)  # bad input stops here, before any script starts
    config = resolve_config(args)
    root = prepare_out_dir(args.out or Path("results") / config.preset)
    common = ["--preset", args.preset, "--seed", str(args.seed), "--resume",
              *(["--force"] if args.force else []),
              *(["--nondeterministic"] if args.nondeterministic else []),
              *(["--data-dir", args.data_dir] if args.data_dir else []),
              *(["--manual-dir", args.manual_dir] if args.manual_dir else []),
              *(["--set", *args.set] if args.set else [])]
    pretraining = ["--distribute", args.distribute,  # what pre-trains and how
                   *(["--knn-every", str(args.knn_every)] if args.knn_every else []),
                   *(["--knn-proxy", args.knn_proxy] if args.knn_proxy else []),
                   *(["--encoders-from", args.encoders_from] if args.encoders_from else [])]
    took = {}
    for name in args.scripts:
        print(f"== {name}", flush=True)
        started = time.perf_counter()
        module = load(name)
        # A script that times one device (pretraining_cost) takes none of the pre-training's
        # placement options.
        own = pretraining if module.SCRIPT.distribute else []
        module.main([*common, *own, "--out", str(root / name)])
        took[name] = time.perf_counter() - started
        print(f"== {name}: {took[name]:.0f} s", flush=True)

    lines = [f"# The paper's tables and figures, preset `{args.preset}`", "",
             "Each section is a script's own report (`results/<preset>/<script>/<script>.md`), "
             "the paper's numbers beside ours; then its figures.", ""]
    rows = []
    for name in SCRIPTS:
        folder = root / name
        report = folder / f"{name}.md"
        if not report.exists():
            continue
        # One level down: the report's title becomes a section of this one.
        section = ["#" + line if line.startswith("#") else line
                   for line in report.read_text().rstrip().splitlines()]
        seconds, seeds = recorded(folder)
        if len(seeds) == 1:  # say it under the title: one draw of every source of chance
            section[1:1] = ["", f"*One seed ({seeds[0]}): one partition, initialisation and "
                                "pre-training. An illustration; the claims are judged over "
                                "seeds (last section).*"]
        lines += section + [""]
        lines += [f"![{png.stem}]({name}/{png.name})" for png in sorted(folder.glob("*.png"))]
        lines.append("")
        rows.append([f"`{name}`", _seed_list(seeds), f"{seconds / 60:.1f}"])
    for name in OTHER_RUNS:  # runs of scripts beyond the paper's tables, if made here
        seconds, seeds = recorded(root / name)
        if seconds:
            rows.append([f"`{name}`", _seed_list(seeds), f"{seconds / 60:.1f}"])
    # The runs' own timings, so the report is the same however often it is rebuilt.
    lines += ["## Seeds and time per script", "",
              "The seeds of each script's records, and the minutes of compute its run records "
              "say their runs took (federated and centralized runs; pre-training is timed in "
              "the cache's `pretrain.json`).", ""]
    lines += markdown_table(["script", "seeds", "runs (min)"], rows) + [""]
    lines += [""] + claims(root)
    write_text(root / "report.md", "\n".join(lines).rstrip() + "\n")
    print(f"wrote {root / 'report.md'}")


if __name__ == "__main__":
    run_cli(main)
