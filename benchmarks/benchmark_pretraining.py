"""Speed of one contrastive training step against the bare encoder forward+backward.

Both steps see the same batch: the contrastive step makes two augmented views, runs
encoder + projector (+ predictor / target) and the loss; the bare step runs the encoder
forward and backward on the same 2B images with a trivial loss, plus the Adam update.
The difference is what augmentation and the contrastive loss cost (goal on a CPU:
at most 25 %). With --epoch-images the step time is also scaled to one epoch.
"""
from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence

from cpcfl_tf.errors import UserError, run_cli
from cpcfl_tf.methods.federated import PRETRAIN_METHODS
from cpcfl_tf.methods.ssl import get_ssl_method
from cpcfl_tf.plan.choices import ENCODERS
from cpcfl_tf.records.environment import environment
from cpcfl_tf.running.cli import print_metrics
from cpcfl_tf.running.script import Script

SCRIPT = Script(__file__, __doc__, distribute=False, runs=False)


def main(argv: Sequence[str] | None = None) -> None:
    parser = SCRIPT.parser()
    parser.add_argument("--method", default="simclr", choices=PRETRAIN_METHODS)
    parser.add_argument("--encoder", default="cnn", choices=ENCODERS)
    parser.add_argument("--image-size", type=int, help="default: the preset's")
    parser.add_argument("--batch-size", type=int, help="default: the preset's")
    parser.add_argument("--repeats", type=int, default=10, help="timed steps of each kind")
    parser.add_argument("--epoch-images", type=int, default=0,
                        help="also report seconds per epoch of this many images")
    parser.add_argument("--jit-compile", action="store_true", help="XLA for the update")
    parser.add_argument("--precision", default="float32",
                        choices=["float32", "mixed_float16", "mixed_bfloat16"])
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.epoch_images < 0:
        raise UserError("--repeats must be >= 1 and --epoch-images >= 0")
    if args.image_size is not None and args.image_size < 32:
        raise UserError(f"--image-size must be at least 32, got {args.image_size}")
    if args.batch_size is not None and args.batch_size < 1:
        raise UserError(f"--batch-size must be positive, got {args.batch_size}")
    session = SCRIPT.session(args)
    config, out = session.config, session.out
    size = args.image_size or config.data.image_size
    pretrain = dataclasses.replace(
        config.pretrain, encoder=args.encoder,
        batch_size=args.batch_size or config.pretrain.batch_size,
        jit_compile=args.jit_compile, precision=args.precision)

    from cpcfl_tf.pretraining.timing import (
        bare_encoder_step,
        compare_seconds,
        contrastive_step,
        random_images,
    )
    from cpcfl_tf.records.files import write_json

    batch = random_images(pretrain.batch_size, size, args.seed)
    seconds = compare_seconds({"contrastive": contrastive_step(pretrain, size, args.seed,
                                                               get_ssl_method(args.method)),
                               "encoder": bare_encoder_step(pretrain, size, args.seed)},
                              batch, repeats=args.repeats)
    record = {"experiment": "benchmark_pretraining", "preset": config.preset,
              "method": args.method, "encoder": args.encoder, "image_size": size,
              "batch_size": pretrain.batch_size, "jit_compile": args.jit_compile,
              "precision": args.precision, "repeats": args.repeats,
              "contrastive_step_seconds": seconds["contrastive"],
              "encoder_step_seconds": seconds["encoder"],
              "overhead": seconds["contrastive"] / seconds["encoder"] - 1.0,
              "environment": environment()}
    if args.epoch_images:
        record["epoch_images"] = args.epoch_images
        steps = args.epoch_images // pretrain.batch_size
        record["seconds_per_epoch"] = seconds["contrastive"] * steps
    print_metrics(record, ("contrastive_step_seconds", "encoder_step_seconds", "overhead",
                           "seconds_per_epoch"))
    path = write_json(out / f"{args.method}-{args.encoder}-{size}px-b{pretrain.batch_size}.json",
                      record)
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    run_cli(main)
