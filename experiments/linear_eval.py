"""Linear evaluation of pre-trained encoders (Sec. "Experimental settings").

SimCLR, BYOL and SimSiam pre-train the encoder on the preset's unlabeled images (cached
and shared with every other script); each encoder, and the randomly initialised encoder
they all start from, is then scored by a classifier head theta_c trained on its frozen
features of the proxy set: the client dataset's training split -> its test split (the
paper: STL-10 train -> test). The paper keeps the encoder with the best proxy accuracy.
"""
from __future__ import annotations

from collections.abc import Sequence

from cpcfl_tf.errors import UserError, run_cli
from cpcfl_tf.evidence.judge import linear_eval_config, linear_eval_settings
from cpcfl_tf.methods.federated import PRETRAIN_METHODS
from cpcfl_tf.plan.config import Config
from cpcfl_tf.records.environment import environment
from cpcfl_tf.running.cli import name_list
from cpcfl_tf.running.report import markdown_table
from cpcfl_tf.running.script import Script

SCRIPT = Script(__file__, __doc__, runs=False)


def _options(parser) -> None:
    parser.add_argument("--methods", type=name_list(PRETRAIN_METHODS),
                        default=list(PRETRAIN_METHODS), metavar="METHOD[,METHOD...]",
                        help="a subset of " + ",".join(PRETRAIN_METHODS) + " (default: all)")


def _earlier(path, config: Config, methods: list[str]) -> dict | None:
    """The record of an earlier run of the same settings and methods, if there is one."""
    from cpcfl_tf.records.files import read_json

    if not path.exists():
        return None
    stored = read_json(path, fix="delete it to evaluate again")
    same = (linear_eval_settings(linear_eval_config(stored["config"]))
            == linear_eval_settings(config)
            and [r["pretraining"] for r in stored["rows"][1:]] == methods)
    if not same:
        raise UserError(f"{path} was evaluated with other settings; pass --force to evaluate "
                        "again, or --out another folder")
    return stored


def main(argv: Sequence[str] | None = None) -> None:
    session = SCRIPT.start(argv, _options)
    config, out, args = session.config, session.out, session.args
    methods = args.methods
    earlier = None if args.force else _earlier(out / "linear_eval.json", config, methods)
    if earlier is not None:
        print(f"kept the earlier evaluation ({out / 'linear_eval.json'})")
        session.finish(_report(config, earlier["rows"], **earlier["proxy"]))
        return
    from cpcfl_tf.clustered.clients import load_client_splits
    from cpcfl_tf.models import build_encoder
    from cpcfl_tf.models.seeding import seeded
    from cpcfl_tf.plan.resolve import resolve
    from cpcfl_tf.pretraining.linear_eval import linear_eval
    from cpcfl_tf.records.files import weights_fingerprint, write_json

    proxy_train, proxy_test = load_client_splits(config.data)
    with seeded(config.seed):  # the initialisation pre-training starts from
        random_encoder = build_encoder(config.pretrain.encoder, proxy_train.images.shape[1:])
    rows = [{"pretraining": "none", "epochs": 0,
             "accuracy": linear_eval(random_encoder, proxy_train, proxy_test, seed=config.seed)}]
    print(f"random encoder: linear evaluation accuracy {rows[0]['accuracy']:.4f}")
    for method in methods:
        run = resolve(config.with_overrides(federated={"pretraining": method}))
        result = session.runner.encoders.contrastive(run)
        last = result.history[-1]
        rows.append({"pretraining": method, "epochs": config.pretrain.epochs,
                     "accuracy": linear_eval(result.encoder, proxy_train, proxy_test,
                                             seed=config.seed),
                     "final_loss": last["loss"], "embedding_std": last["embedding_std"],
                     "seconds_per_epoch": sum(h["seconds"] for h in result.history)
                     / len(result.history), "cache": str(result.out_dir),
                     # the bits scored, as a run record's environment.starting_encoder
                     "encoder_fingerprint": weights_fingerprint(result.encoder.get_weights())})
        print(f"{method}: linear evaluation accuracy {rows[-1]['accuracy']:.4f}")

    write_json(out / "linear_eval.json", {
        "experiment": "linear_eval", "preset": config.preset, "config": config.to_dict(),
        "seeds": {"data": config.seed, "train": config.seed},
        "proxy": {"train": proxy_train.source, "test": proxy_test.source},
        "rows": rows, "environment": environment()})
    session.finish(_report(config, rows, proxy_train.source, proxy_test.source))


def _report(config: Config, rows: list[dict], train: str, test: str) -> str:
    lines = [f"# Linear evaluation (preset `{config.preset}`)", "",
             f"Encoder `{config.pretrain.encoder}` pre-trained on "
             f"`{config.data.pretrain_dataset}:{config.data.pretrain_split}` "
             f"({config.data.image_size}px, batch {config.pretrain.batch_size}); theta_c trained "
             f"on frozen features of `{train}`, accuracy on `{test}`.", ""]
    lines += markdown_table(
        ["pre-training", "epochs", "accuracy", "final loss", "embedding std", "s/epoch"],
        [[r["pretraining"], r["epochs"], f"{r['accuracy']:.4f}",
          *((f"{r['final_loss']:.4f}", f"{r['embedding_std']:.4f}",
             f"{r['seconds_per_epoch']:.1f}") if "final_loss" in r else ("-", "-", "-"))]
         for r in rows])
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    run_cli(main)
