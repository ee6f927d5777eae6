"""Linear evaluation of pre-trained encoders (Sec. "Experimental settings").

SimCLR, BYOL and SimSiam pre-train the encoder on the preset's unlabeled images (cached
and shared with every other script); each encoder, and the randomly initialised encoder
they all start from, is then scored by a classifier head theta_c trained on its frozen
features of the proxy set: the client dataset's training split -> its test split (the
paper: STL-10 train -> test). The paper keeps the encoder with the best proxy accuracy.
"""
from __future__ import annotations

from typing import Sequence

from cpcfl_tf.config import PRETRAIN_METHODS
from cpcfl_tf.errors import UserError, run_cli
from cpcfl_tf.experiment import environment, experiment_parser, finish, setup


def main(argv: Sequence[str] | None = None) -> None:
    parser = experiment_parser("linear_eval", __doc__.split("\n\n")[0])
    parser.add_argument("--methods", default=",".join(PRETRAIN_METHODS),
                        help="comma-separated subset of simclr,byol,simsiam")
    args = parser.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    if not methods or set(methods) - set(PRETRAIN_METHODS):
        raise UserError(f"--methods takes a comma-separated subset of {', '.join(PRETRAIN_METHODS)}")
    config, out = setup(args, "linear_eval")

    import keras

    from cpcfl_tf.contrastive.linear_eval import linear_eval
    from cpcfl_tf.contrastive.pretrain import pretrained_encoder
    from cpcfl_tf.federated.clients import load_client_splits
    from cpcfl_tf.models import build_encoder
    from cpcfl_tf.results import write_json

    proxy_train, proxy_test = load_client_splits(config.data)
    keras.utils.set_random_seed(config.seed)  # the initialisation pre-training starts from
    random_encoder = build_encoder(config.pretrain.encoder, proxy_train.images.shape[1:])
    rows = [{"pretraining": "none", "epochs": 0,
             "accuracy": linear_eval(random_encoder, proxy_train, proxy_test, seed=config.seed)}]
    print(f"random encoder: linear evaluation accuracy {rows[0]['accuracy']:.4f}")
    for method in methods:
        result = pretrained_encoder(config.pretrain, config.data, method=method,
                                    seed=config.seed, distribute=args.distribute)
        last = result.history[-1]
        rows.append({"pretraining": method, "epochs": config.pretrain.epochs,
                     "accuracy": linear_eval(result.encoder, proxy_train, proxy_test,
                                             seed=config.seed),
                     "final_loss": last["loss"], "embedding_std": last["embedding_std"],
                     "seconds_per_epoch": sum(h["seconds"] for h in result.history)
                     / len(result.history), "cache": str(result.out_dir)})
        print(f"{method}: linear evaluation accuracy {rows[-1]['accuracy']:.4f}")

    write_json(out / "linear_eval.json", {
        "experiment": "linear_eval", "preset": config.preset, "config": config.to_dict(),
        "seeds": {"data": config.seed, "train": config.seed},
        "proxy": {"train": proxy_train.source, "test": proxy_test.source},
        "rows": rows, "environment": environment()})
    lines = [f"# Linear evaluation (preset `{config.preset}`)", "",
             f"Encoder `{config.pretrain.encoder}` pre-trained on "
             f"`{config.data.pretrain_dataset}:{config.data.pretrain_split}` "
             f"({config.data.image_size}px, batch {config.pretrain.batch_size}); theta_c trained "
             f"on frozen features of `{proxy_train.source}`, accuracy on `{proxy_test.source}`.",
             "", "| pre-training | epochs | accuracy | final loss | embedding std | s/epoch |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        extra = (f"{r['final_loss']:.4f} | {r['embedding_std']:.4f} | {r['seconds_per_epoch']:.1f}"
                 if "final_loss" in r else "- | - | -")
        lines.append(f"| {r['pretraining']} | {r['epochs']} | {r['accuracy']:.4f} | {extra} |")
    finish(out, "linear_eval.md", "\n".join(lines) + "\n")


if __name__ == "__main__":
    run_cli(main)
