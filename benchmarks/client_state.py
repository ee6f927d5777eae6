"""Memory of the per-client state of a personalized method: one run (its rounds, default
one) of ``--method`` with every client keeping its part, and what that part takes for all
clients against the process's peak resident memory.

    python benchmarks/client_state.py --preset quick --method lg-fedavg \\
        --set partition.num_clients=1000 partition.num_groups=2 partition.disjoint=false

Run one method per process: the peak is the process's.
"""
from __future__ import annotations

import resource
import sys
from collections.abc import Sequence

from cpcfl_tf.errors import UserError, run_cli
from cpcfl_tf.running.cli import print_metrics
from cpcfl_tf.running.script import Script

SCRIPT = Script(__file__, __doc__, default_preset="quick", distribute=False, runs=False)


def _peak_bytes() -> int:
    """The process's peak resident memory so far (Linux: ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(argv: Sequence[str] | None = None) -> None:
    from cpcfl_tf.methods.federated import METHODS

    kept_methods = [name for name, m in METHODS.items() if m.keeps]
    parser = SCRIPT.parser()
    parser.add_argument("--method", default=kept_methods[0], choices=kept_methods)
    parser.add_argument("--rounds", type=int, default=1, help="rounds of the run (default 1)")
    parser.add_argument("--max-clients-per-step", type=int, metavar="N",
                        help="train at most N clients in one step (default: all)")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        raise UserError(f"--rounds must be at least 1, got {args.rounds}")
    session = SCRIPT.session(args)
    config = session.config.with_overrides(
        federated={"method": args.method, "pretraining": "none", "rounds": args.rounds,
                   "head_rounds": 0})

    from cpcfl_tf.clustered.algorithm import kept_arrays
    from cpcfl_tf.clustered.clients import clients_for
    from cpcfl_tf.clustered.pool import template_for
    from cpcfl_tf.clustered.simulator import run_federated
    from cpcfl_tf.plan.context import RunContext
    from cpcfl_tf.plan.resolve import resolve
    from cpcfl_tf.records.environment import environment
    from cpcfl_tf.records.files import write_json

    run = resolve(config)
    clients = clients_for(config)
    template = template_for(run, clients.train.images.shape[2:], clients.num_classes)
    weights = template.get_weights()
    encoder = len(template.get_layer("encoder").weights)
    kept_bytes = clients.train.num_clients * sum(  # what ClientParts holds, not allocated here
        weights[i].nbytes for i in kept_arrays(run, encoder, len(weights)))
    before = _peak_bytes()
    record, _ = run_federated(run, clients, context=RunContext(
        verbose=0, max_clients=args.max_clients_per_step))
    out = {
        "experiment": "client_state", "preset": config.preset, "method": args.method,
        "clients": clients.train.num_clients, "rounds": args.rounds,
        "max_clients_per_step": args.max_clients_per_step,
        "kept_bytes": kept_bytes,
        "model_bytes": int(sum(w.nbytes for w in weights)),
        "peak_bytes_before_run": before, "peak_bytes": _peak_bytes(),
        "seconds_per_round": record.timing["seconds_per_round"],
        "environment": environment(),
    }
    print_metrics(out, ("clients", "kept_bytes", "model_bytes", "peak_bytes_before_run",
                        "peak_bytes", "seconds_per_round"), digits=2)
    path = write_json(session.out / f"{args.method}-{out['clients']}.json", out)
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    run_cli(main)
