"""fig:client_data_amount: draw a preset's client partition and plot it.

Writes ``partition.json`` (per-client class counts of training and test data, true
groups) and ``client_data_amount.png`` (the paper's fig:client_data_amount) to ``--out``.
"""
from __future__ import annotations

from collections.abc import Sequence

from cpcfl_tf.errors import run_cli
from cpcfl_tf.running.cli import resolve_config
from cpcfl_tf.running.script import Script

SCRIPT = Script(__file__, __doc__, default_preset="quick", distribute=False,
                runs=False)


def main(argv: Sequence[str] | None = None) -> None:
    # The shared options (--resume and --force have nothing to do here: drawing a
    # partition takes seconds); no session, so bad input stops before TF is imported.
    parser = SCRIPT.parser()
    parser.add_argument("--clients", type=int, help="number of clients (default: the preset's)")
    args = parser.parse_args(argv)

    config = resolve_config(args)
    if args.clients is not None:
        config = config.with_overrides(partition={"num_clients": args.clients})

    from cpcfl_tf.plan.resolve import check_client_sources, check_data
    from cpcfl_tf.records.files import prepare_out_dir, write_json

    check_data(config)
    check_client_sources(config)
    out = prepare_out_dir(args.out or f"results/{config.preset}/partition")
    from cpcfl_tf.clustered.clients import load_client_splits, partition_for
    from cpcfl_tf.evidence.plots import plot_client_data_amounts

    train, test = load_client_splits(config.data, resize=False)
    partition = partition_for(config, train, test)
    clients = partition.describe(train.labels, test.labels)
    write_json(out / "partition.json", {
        "preset": config.preset, "seeds": {"data": config.seed},
        "train_source": train.source, "test_source": test.source,
        "config": {"data": config.to_dict()["data"], "partition": config.to_dict()["partition"]},
        "group_classes": [list(g) for g in partition.group_classes],
        "clients": clients})
    plot_client_data_amounts(partition, train.labels, out / "client_data_amount.png",
                             title=f"Client data per class ({train.source}, seed {config.seed})")
    for g, classes in enumerate(partition.group_classes):
        members = [c for c in clients if c["group"] == g]
        images = sum(sum(c["train_class_counts"].values()) for c in members)
        print(f"group {g}: classes {list(classes)}, {len(members)} clients, {images} images")
    print(f"wrote {out / 'partition.json'} and {out / 'client_data_amount.png'}")


if __name__ == "__main__":
    run_cli(main)
