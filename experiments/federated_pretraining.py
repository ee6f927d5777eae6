"""Federated self-supervised pre-training: does CP-CFL's gain survive when no server holds
the unlabeled images, and the encoder is learned federated on non-IID clients?

Per seed (each its own partition and encoders), on the same clients:

- IFCA (None): no pre-training;
- CP-CFL (SimCLR): the server's pre-training (the paper's);
- CP-CFL (FedSimCLR) with the images dealt ``iid`` and by ``groups`` (each client's from
  its own classes), and CP-CFL (FedEMA-BYOL) with the ``groups`` deal
  (``partition.unlabeled``; docs/presets-and-data.md).

Server and federated pre-training make the same passes over the same unlabeled images
(the federated rounds default to ``pretrain.epochs / (local epochs x participation)``).
Every encoder is scored by linear and kNN accuracy on the linear evaluation's proxy. The
table gives each run's accuracy and ARI, the bytes of each stage, the clients' compute;
for each federated encoder the paired differences "CP-CFL from it minus IFCA (None)" and
"minus CP-CFL (SimCLR)", judged by the claims' rule (results/<preset>/claims.md). Each
encoder's record (how it was made) is copied to ``encoders/``.
"""
from __future__ import annotations

from collections.abc import Sequence

from cpcfl_tf.errors import run_cli
from cpcfl_tf.evidence.federated_pretraining import (
    ROWS,
    report,
    run_rows,
    runs_environment,
    summarize,
    tables,
)
from cpcfl_tf.plan.resolve import check_data
from cpcfl_tf.running.cli import resolve_config
from cpcfl_tf.running.runner import RunSpec
from cpcfl_tf.running.script import Script

SEEDS = {"smoke": 2, "quick": 5, "standard": 5, "paper": 1}
"""Seeds per preset (the claims' five on the CPU presets)."""

SCRIPT = Script(__file__, __doc__, default_preset="quick", runs=True)


def _options(parser) -> None:
    parser.add_argument("--seeds", type=int, help="seeds, each with its own partition and "
                                                  "encoders (default: quick, standard 5; "
                                                  "smoke 2)")
    parser.add_argument("--linear-epochs", type=int, default=100, metavar="E",
                        help="epochs of each linear evaluation (default 100)")
    parser.add_argument("--report", action="store_true",
                        help="make no run and score no encoder: write the report from the "
                             "seeds whose runs are all finished in the output folder (with "
                             "the encoder scores kept so far), headed partial")


def specs_for(seeds: Sequence[int]) -> list[RunSpec]:
    return [RunSpec(f"seed{seed}-{row}", method, start, seed=seed, row=row,
                    partition={"unlabeled": deal})
            for seed in seeds for row, method, start, deal in ROWS]


def main(argv: Sequence[str] | None = None) -> None:
    parser = SCRIPT.parser()
    _options(parser)
    args = parser.parse_args(argv)
    config = resolve_config(args)
    seeds = [config.seed + s for s in range(args.seeds or SEEDS[config.preset])]
    for spec in specs_for(seeds):  # a start the settings cannot run: refused, nothing written
        check_data(spec.config(config))
    session = SCRIPT.session(args)
    specs = session.kept(specs_for(seeds))
    records, encoders = {}, {}
    for seed in seeds:  # a seed's runs, then its encoders' scores: kept as they come
        done, _ = session.run_or_read([s for s in specs if s.seed == seed], args.report)
        records.update({spec.name: record for spec, record in done})
        encoders = score_encoders(session, [s for s, _ in done], args.report)
    complete = [s for s in seeds if all(f"seed{s}-{row}" in records for row, *_ in ROWS)]
    specs = [spec for spec in specs if spec.seed in complete]
    summary = summarize(specs, records, encoders)
    from cpcfl_tf.records.files import write_json

    write_json(session.out / "federated_pretraining.json", {
        "experiment": "federated_pretraining", "preset": config.preset,
        "config": config.to_dict(), "seeds": seeds, "rows": summary["rows"],
        "differences": summary["differences"], "encoders": encoders,
        "environment": runs_environment(records.values())})
    text = report(config, summary)
    if len(complete) < len(seeds):
        title, rest = text.split("\n", 1)
        text = (f"{title}\n\n**Partial: seeds {', '.join(map(str, complete)) or 'none'} of "
                f"{seeds[0]}-{seeds[-1]}.** Every mean and verdict below is over these seeds "
                f"alone. `{session.resume_command()}` makes the rest.\n" + rest)
    session.finish(text, rows=run_rows(specs, records, encoders))
    if len(complete) == len(seeds) and len(summary["rows"]) == len(ROWS):
        session.update_readme("fedpretrain", tables(text), "federated pre-training tables")



def score_encoders(session, specs: Sequence[RunSpec], only_kept: bool = False
                   ) -> dict[str, dict]:
    """Linear and kNN accuracy of every run's starting encoder on the proxy, and how each
    was made (its ``pretrain.json`` beside it in ``encoders/``), by cache folder; scores
    kept in ``encoders.json`` so an interrupted study does not score again.
    ``only_kept``: score nothing, return the scores kept."""
    from cpcfl_tf.pretraining.knn import proxy_scores
    from cpcfl_tf.records.files import prepare_out_dir, read_json, write_json

    runner, epochs = session.runner, session.args.linear_epochs
    kept_path = session.out / "encoders.json"
    kept = {} if session.args.force or not kept_path.exists() else read_json(
        kept_path, fix="delete it to score the encoders again")
    if only_kept:
        return kept
    proxy = None
    for spec in specs:
        run = runner.plan_of(spec)
        config, start, pretraining = run.requested, run.start.name, run.pretraining
        if pretraining is None:  # random weights
            continue
        result = (runner.encoders.federated(run) if pretraining.federated
                  else runner.encoders.contrastive(run))
        folder = result.out_dir.name
        if kept.get(folder, {}).get("linear_epochs") != epochs:
            proxy = proxy or runner.data.client_splits(config.data)
            made = read_json(result.out_dir / "pretrain.json", fix="delete the cache folder "
                             f"{result.out_dir} to pre-train it again")
            kept[folder] = {
                "start": start, "seed": pretraining.seed,
                "deal": config.partition.unlabeled,
                **proxy_scores(result.encoder, *proxy, seed=pretraining.seed,
                               epochs=epochs),
                "pretrain_seconds": round(sum(h["seconds"] for h in made["history"]), 3),
                **({"federated": made["federated"]} if "federated" in made else {})}
            write_json(prepare_out_dir(session.out / "encoders") / f"{folder}.json", made)
            write_json(kept_path, kept)
            print(f"{spec.name}: encoder linear {kept[folder]['linear_accuracy']:.4f}, kNN "
                  f"{kept[folder]['knn_accuracy']:.4f}", flush=True)
        kept[folder]["runs"] = sorted({*kept[folder].get("runs", []), spec.name})
    write_json(kept_path, kept)
    return kept


if __name__ == "__main__":
    run_cli(main)
