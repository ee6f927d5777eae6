"""tab:app_pretraining_costs: seconds per epoch of SimCLR pre-training and FLOPs, per encoder.

Seconds per epoch are the median time of a compiled SimCLR step (after one warm-up step)
on random images of the preset's size, times the steps of one epoch over the preset's
unlabeled set (100,000 STL-10 images in the paper preset). Speed does not depend on
image content, so no data is loaded. FLOPs: TF's profiler on the frozen inference graph
at batch size 1, as keras-flops counts them.
"""
from __future__ import annotations

from collections.abc import Sequence

from cpcfl_tf.errors import UserError, run_cli
from cpcfl_tf.methods.ssl import get_ssl_method
from cpcfl_tf.plan.choices import ENCODERS
from cpcfl_tf.plan.presets import pretrain_config_for
from cpcfl_tf.records.environment import environment
from cpcfl_tf.running.cli import name_list
from cpcfl_tf.running.report import markdown_table
from cpcfl_tf.running.script import Script

SCRIPT = Script(__file__, __doc__, distribute=False, runs=False)

PAPER = {"cnn": (23, 0.17), "resnet18": (60, 0.67), "resnet50": (134, 1.42)}
"""The paper's seconds per epoch (RTX 3080, 96x96, 100,000 images) and GFLOPs."""


def _options(parser) -> None:
    parser.add_argument("--encoders", type=name_list(ENCODERS),
                        default=list(ENCODERS), metavar="ENCODER[,ENCODER...]",
                        help="a subset of " + ",".join(ENCODERS) + " (default: all)")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per encoder")


def main(argv: Sequence[str] | None = None) -> None:
    session = SCRIPT.start(argv, _options)
    config, out, args = session.config, session.out, session.args
    if args.repeats < 1:
        raise UserError(f"--repeats must be >= 1, got {args.repeats}")

    from cpcfl_tf.data.sources import split_size
    from cpcfl_tf.flops import count_flops
    from cpcfl_tf.models import build_encoder
    from cpcfl_tf.pretraining.timing import contrastive_step, median_seconds, random_images
    from cpcfl_tf.records.files import read_json, write_json

    size = config.data.image_size
    images = split_size(config.data.pretrain_dataset, config.data.pretrain_split)
    rows = []
    measured = False
    for name in args.encoders:
        pretrain = pretrain_config_for(config.pretrain, name)
        settings = {"encoder": name, "method": "simclr", "image_size": size,
                    "batch_size": pretrain.batch_size, "epoch_images": images,
                    "repeats": args.repeats, "jit_compile": pretrain.jit_compile}
        path = out / f"{name}.json"
        if path.exists() and not args.force:
            row = read_json(path, fix="delete it to measure again")
            if not isinstance(row, dict) or row.get("settings") != settings:
                raise UserError(f"{path} was measured with other settings; pass --force to "
                                "measure again, or --out another folder")
            print(f"{name}: kept the earlier measurement ({path})")
            rows.append(row)
            continue
        step = contrastive_step(pretrain, size, args.seed, get_ssl_method("simclr"))
        seconds = median_seconds(step, random_images(pretrain.batch_size, size, args.seed),
                                 repeats=args.repeats)
        flops = count_flops(build_encoder(name, (size, size, 3)))
        flops_96 = flops if size == 96 else count_flops(build_encoder(name, (96, 96, 3)))
        steps = images // pretrain.batch_size
        row = {"settings": settings, "seconds_per_step": seconds, "steps_per_epoch": steps,
               "seconds_per_epoch": seconds * steps, "gflops": flops / 1e9,
               "gflops_96": flops_96 / 1e9, "paper_seconds_per_epoch": PAPER[name][0],
               "paper_gflops": PAPER[name][1], "environment": environment()}
        write_json(path, row)
        rows.append(row)
        measured = True
        print(f"{name}: {row['seconds_per_epoch']:.1f} s/epoch ({steps} steps of "
              f"{seconds:.3f} s), {flops / 1e9:.4f} GFLOPs at {size}px")

    summary = out / "pretraining_cost.json"
    if measured or not summary.exists() or read_json(summary, fix="delete it")["rows"] != rows:
        write_json(summary, {
            "experiment": "pretraining_cost", "preset": config.preset,
            "config": config.to_dict(), "seeds": {"data": config.seed, "train": config.seed},
            "rows": rows, "environment": environment()})
    device = rows[0]["environment"]["device"]  # where the rows were measured
    lines = [f"# Pre-training cost (preset `{config.preset}`, {device})", "",
             "Ours: SimCLR at the preset's image size on this machine, seconds per epoch over "
             f"{images:,} images; the paper's: RTX 3080, 96x96, 100,000 STL-10 images.", ""]
    lines += markdown_table(
        ["encoder", "batch", "image", "s/step", "steps/epoch", "s/epoch (ours)",
         "s/epoch (paper)", "GFLOPs (ours, this size)", "GFLOPs (ours, 96x96)", "GFLOPs (paper)"],
        [[r["settings"]["encoder"], r["settings"]["batch_size"], r["settings"]["image_size"],
          f"{r['seconds_per_step']:.3f}", r["steps_per_epoch"], f"{r['seconds_per_epoch']:.1f}",
          r["paper_seconds_per_epoch"], f"{r['gflops']:.4f}", f"{r['gflops_96']:.4f}",
          r["paper_gflops"]] for r in rows])
    session.finish("\n".join(lines) + "\n")


if __name__ == "__main__":
    run_cli(main)
