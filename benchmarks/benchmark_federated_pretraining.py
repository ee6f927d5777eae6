"""Speed of a federated pre-training epoch against a server epoch over the same images.

In one process, on the same unlabeled images of the preset: the server's pre-training
(:func:`cpcfl_tf.pretraining.pretrain.pretrain`, the preset's batch) and a federated one
(:func:`cpcfl_tf.pretraining.federated_pretrain.federated_pretrain`, the images dealt
``iid`` to ``--clients`` clients, one local epoch per round, the start's own batch), each
for ``--epochs`` passes; the first pass of each includes tracing, so the ratio is taken
over the later ones (median seconds per pass). Goal: a federated pass at most 1.5x a
server pass. Nothing is cached: both train into a temporary folder.
"""
from __future__ import annotations

import statistics
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from cpcfl_tf.errors import UserError, run_cli
from cpcfl_tf.methods.federated import FEDERATED_PRETRAININGS
from cpcfl_tf.records.environment import environment
from cpcfl_tf.running.cli import print_metrics
from cpcfl_tf.running.script import Script

SCRIPT = Script(__file__, __doc__, distribute=False, runs=False)


def main(argv: Sequence[str] | None = None) -> None:
    parser = SCRIPT.parser()
    parser.add_argument("--start", default="fed-simclr", choices=FEDERATED_PRETRAININGS)
    parser.add_argument("--clients", type=int, help="default: the preset's")
    parser.add_argument("--images", type=int, default=0,
                        help="the first this many pre-training images (default: all)")
    parser.add_argument("--epochs", type=int, default=3,
                        help="passes of each kind; the first is left out (default 3)")
    args = parser.parse_args(argv)
    if args.epochs < 2:
        raise UserError("--epochs must be at least 2 (the first pass traces the step)")
    if args.images < 0 or (args.clients is not None and args.clients < 1):
        raise UserError("--images must be >= 0 and --clients >= 1")
    session = SCRIPT.session(args)
    base, out = session.config, session.out
    clients = args.clients or base.partition.num_clients
    algorithm = args.start.split("-")[0]
    config = base.with_overrides(
        federated={"pretraining": args.start},
        partition={"unlabeled": "iid", "num_clients": clients,
                   "num_groups": 1 if clients % base.partition.num_groups else
                   base.partition.num_groups},
        pretrain={"epochs": args.epochs,
                  "options": {algorithm: {"rounds": args.epochs, "local_epochs": 1}}})

    from cpcfl_tf.data.unlabeled import deal_unlabeled
    from cpcfl_tf.plan.resolve import pretraining_of
    from cpcfl_tf.pretraining.federated_pretrain import federated_pretrain
    from cpcfl_tf.pretraining.pretrain import load_pretrain_images, pretrain
    from cpcfl_tf.records.files import write_json

    images = load_pretrain_images(config.data)
    if args.images:
        images = images[:args.images]
    pretraining = pretraining_of(config)
    assert pretraining is not None and pretraining.ssl is not None, args.start  # a fed-<ssl>
    assert pretraining.federated is not None, args.start
    batch, method = pretraining.federated.settings["batch_size"], pretraining.ssl.name
    rows = deal_unlabeled("iid", len(images), clients, seed=config.seed, batch_size=batch)
    with tempfile.TemporaryDirectory() as tmp:
        server = pretrain(config.pretrain, images, Path(tmp) / "server", method=pretraining.ssl,
                          seed=config.seed, verbose=1)
        federated = federated_pretrain(pretraining, [images[r] for r in rows],
                                       Path(tmp) / "federated", verbose=1)
    server_s = statistics.median(h["seconds"] for h in server.history[1:])
    fed_s = statistics.median(h["seconds"] for h in federated.history[1:])
    record = {"experiment": "benchmark_federated_pretraining", "preset": config.preset,
              "start": args.start, "method": method, "images": len(images),
              "clients": clients, "server_batch": config.pretrain.batch_size,
              "client_batch": batch, "passes": args.epochs,
              "server_seconds_per_pass": server_s, "federated_seconds_per_pass": fed_s,
              "ratio": fed_s / server_s,
              "server_passes": [h["seconds"] for h in server.history],
              "federated_passes": [h["seconds"] for h in federated.history],
              "environment": environment()}
    print_metrics(record, ("server_seconds_per_pass", "federated_seconds_per_pass", "ratio"))
    path = write_json(out / f"{args.start}-{clients}clients-{len(images)}images.json", record)
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    run_cli(main)
