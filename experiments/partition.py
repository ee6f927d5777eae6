"""fig:client_data_amount: draw a preset's client partition and plot it.

Writes ``partition.json`` (per-client class counts of training and test data, true
groups) and ``client_data_amount.png`` (the paper's fig:client_data_amount) to ``--out``.
"""
from __future__ import annotations

from typing import Sequence

from cpcfl_tf.config import PRESETS, get_preset
from cpcfl_tf.errors import ArgumentParser, run_cli


def main(argv: Sequence[str] | None = None) -> None:
    parser = ArgumentParser(prog="python experiments/partition.py",
                            description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="quick", choices=list(PRESETS),
                        help="configuration preset (default: quick)")
    parser.add_argument("--seed", type=int, default=0, help="data seed (default: 0)")
    parser.add_argument("--clients", type=int, help="number of clients (default: the preset's)")
    parser.add_argument("--out", help="output folder (default: results/<preset>/partition)")
    parser.add_argument("--data-dir", help="tfds data dir, or the folder of the IDX files")
    parser.add_argument("--manual-dir", help="tfds manual-download folder (hand-fetched archives)")
    args = parser.parse_args(argv)

    config = get_preset(args.preset)
    overrides = {"seed": args.seed,
                 "data": {"data_dir": args.data_dir, "manual_dir": args.manual_dir}}
    if args.clients is not None:
        overrides["partition"] = {"num_clients": args.clients}
    config = config.with_overrides(**overrides)

    from cpcfl_tf.results import prepare_out_dir, write_json

    out = prepare_out_dir(args.out or f"results/{config.preset}/partition")
    from cpcfl_tf.federated.clients import load_client_splits, partition_for
    from cpcfl_tf.plots import plot_client_data_amounts

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
