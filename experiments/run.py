"""One run of any registered method from any start, on the preset's clients.

``--method`` is a clustered federated method (the kit's or a plugin's, e.g.
``cp-cfl``), ``--pretraining`` the start it runs from (a self-supervised method,
``none``, or ``fedavg``: FedAvg's encoder); either defaults to the preset's, which
``--set federated.method=...`` changes. The run is the tables' run of the same config:
the same checks, record (``<method>-<pretraining>-seed<seed>.json``), resume and
``--dry-run``, taken from the committed tree where this machine would make it bit for
bit, and compared with the committed run of its config where one exists.
"""
from __future__ import annotations

from typing import Sequence

from cpcfl_tf.errors import ArgumentParser, run_cli
from cpcfl_tf.records.record import RunRecord
from cpcfl_tf.running.runner import RunSpec
from cpcfl_tf.running.script import Script

SCRIPT = Script(__file__, __doc__, compares_in_tree=True)


def options(parser: ArgumentParser) -> None:
    parser.add_argument("--method", help="the clustered federated method (default: the "
                        "preset's federated.method, or --set's)")
    parser.add_argument("--pretraining", help="the start: an SSL method, none, or fedavg "
                        "(default: the preset's federated.pretraining, or --set's)")


def spec_of(config) -> RunSpec:
    """The one run asked for: the config's method and start."""
    fl = config.federated
    return RunSpec(f"{fl.method}-{fl.pretraining}-seed{config.seed}", fl.method,
                   fl.pretraining)


def report(name: str, record: RunRecord) -> str:
    """The run's short report: accuracy at the quarters, the final scores and cost."""
    fl, final = record.config.federated, record.final
    marks = fl.quarters
    lines = [f"# {name} (preset `{record.config.preset}`), {len(record.clients)} clients, "
             f"T = {fl.rounds}", "",
             "| " + " | ".join(f"T={t}" for t in marks) + " | ARI | restarts |",
             "|" + "---|" * (len(marks) + 2),
             "| " + " | ".join(f"{100 * record.accuracy_at(t):.2f}" for t in marks)
             + f" | {final.ari:.3f} | {final.restarts} |", "",
             f"Accuracy (%): mean of the clients' local test accuracies. Bytes over the run: "
             f"{final.bytes_down:,} down, {final.bytes_up:,} up."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = SCRIPT.parser()
    options(parser)
    args = parser.parse_args(argv)
    # --method and --pretraining are the config's settings, checked with the rest before
    # any folder is made (an unknown name: one line naming the registered ones)
    args.set = [*args.set, *(f"federated.{key}={value}" for key, value in
                             (("method", args.method), ("pretraining", args.pretraining))
                             if value is not None)]
    session = SCRIPT.session(args)
    spec = spec_of(session.config)
    session.reuse_committed()
    record = session.run_all([spec])[spec.name]
    session.finish(report(spec.name, record))


if __name__ == "__main__":
    run_cli(main)
