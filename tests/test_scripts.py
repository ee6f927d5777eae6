"""The ablation scripts (datasets, heads, supervised, clients, trials, the local optimizer) end to end
on the smoke preset, and the runner features they rely on."""
import csv
import json
from pathlib import Path

import numpy as np
import pytest

from cpcfl_tf.errors import UserError
from cpcfl_tf.plan.resolve import resolve
from helpers import run_record_errors, script



def load(out, name):
    return json.loads((out / f"{name}.json").read_text())


def rows(path):
    with open(path) as fh:
        return list(csv.DictReader(fh))


def test_datasets_runs_every_pair_with_centralized_baselines(tmp_path, capsys, monkeypatch):
    from cpcfl_tf.pretraining import pretrain

    loads = []
    load_images = pretrain.load_pretrain_images
    monkeypatch.setattr(pretrain, "load_pretrain_images",
                        lambda data: loads.append(data.pretrain_dataset) or load_images(data))
    out = tmp_path / "out"
    script("datasets").main(["--preset", "smoke", "--out", str(out), "--set", "federated.rounds=2"])
    # Both smoke pairs pre-train on digits: the runner reads those images once for the
    # pre-training and the relevance scores of both pairs.
    assert loads == ["digits"]
    printed = capsys.readouterr().out
    assert "pair digits -> Fashion-MNIST stands for the paper's STL-10 -> MNIST (unrelated)" in printed
    related, unrelated = load(out, "digits-digits-cp-cfl-simclr"), load(out, "digits-fmnist-cp-cfl-simclr")
    for path in out.glob("*.json"):  # federated and centralized runs follow the contract
        if path.name != "relevance.json":
            assert run_record_errors(json.loads(path.read_text())) == [], path.name
    assert related["config"]["data"]["client_dataset"] == "digits"
    assert unrelated["config"]["data"]["client_dataset"] == "fashion_mnist_idx"
    assert unrelated["config"]["data"]["pretrain_dataset"] == "digits"
    for pair in ("digits-digits", "digits-fmnist"):
        pooled, grouped = load(out, f"{pair}-centralized-all"), load(out, f"{pair}-centralized-group")
        assert pooled["method"] == grouped["method"] == "centralized"
        assert pooled["rounds"] == [] and 0 <= pooled["final"]["accuracy"] <= 1
        assert [pooled["config"]["federated"]["num_clusters"],
                grouped["config"]["federated"]["num_clusters"]] == [1, 3]
        # Same clients as the federated runs of the pair.
        assert pooled["clients"] == load(out, f"{pair}-ifca-none")["clients"]
    table = rows(out / "datasets.csv")
    assert len(table) == 2 * 7
    assert all(-1 <= float(r["relevance"]) <= 1 for r in table)
    assert "Centralized (by cluster)" in (out / "datasets.md").read_text()
    # The scores are kept beside the records with their encoder: a rebuilt report reads
    # them (another kind of CPU pre-trains other bits), an encoder of other settings
    # computes its own.
    kept = json.loads((out / "relevance.json").read_text())
    assert sorted(kept) == ["digits-digits", "digits-fmnist"]
    assert {float(r["relevance"]) for r in table} == {v["score"] for v in kept.values()}
    assert all(v["encoder"].startswith("simclr-cnn-") and v["environment"]["cpu_id"]
               for v in kept.values())
    planted = {**kept, "digits-digits": {**kept["digits-digits"], "score": 0.125}}
    (out / "relevance.json").write_text(json.dumps(planted))
    module = script("datasets")
    monkeypatch.setattr(module, "relevance", lambda *a: pytest.fail("score computed again"))
    module.main(["--preset", "smoke", "--out", str(out), "--set", "federated.rounds=2"])
    assert "(0.1250 / " in (out / "datasets.md").read_text()
    stale = {**planted, "digits-digits": {**planted["digits-digits"], "encoder": "simclr-x"}}
    (out / "relevance.json").write_text(json.dumps(stale))
    monkeypatch.setattr(module, "relevance", lambda *a: 0.25)
    module.main(["--preset", "smoke", "--out", str(out), "--set", "federated.rounds=2"])
    assert "(0.2500 / " in (out / "datasets.md").read_text()
    assert json.loads((out / "relevance.json").read_text())["digits-digits"]["encoder"] == \
        kept["digits-digits"]["encoder"]


def test_heads_reports_every_head_at_the_quarters(tmp_path):
    out = tmp_path / "out"
    script("heads").main(["--preset", "smoke", "--out", str(out),
                          "--set", "partition.num_clients=3"])  # 8 runs: few clients
    for pair in ("digits-digits", "digits-fmnist"):
        for head in ("c", "c-1", "c-2", "c-3"):
            record = load(out, f"{pair}-cp-cfl-simclr-{head}")
            assert record["config"]["federated"]["head"] == head
    table = rows(out / "heads.csv")
    assert len(table) == 8 and {"accuracy_t1", "accuracy_t4"} <= set(table[0])
    assert (out / "accuracy-digits-fmnist.png").exists()


def test_supervised_pretrains_with_labels_once_and_caches_it(tmp_path, monkeypatch):
    from cpcfl_tf.clustered import centralized

    monkeypatch.setenv("CPCFL_CACHE", str(tmp_path / "cache"))  # its own: empty at first
    calls, train = [], centralized.supervised_encoder
    monkeypatch.setattr(centralized, "supervised_encoder",
                        lambda *a, **k: calls.append(a[1].source) or train(*a, **k))
    out = tmp_path / "out"
    script("supervised").main(["--preset", "smoke", "--out", str(out)])
    record = load(out, "cp-cfl-supervised")
    assert record["pretraining"] == "supervised" and record["method"] == "cp-cfl"
    assert calls == ["digits:train[:697]"]  # with the labels of the pre-training split
    cache = tmp_path / "cache" / "pretrained"
    assert len(list(cache.glob("supervised-cnn-*/encoder.npz"))) == 1

    # A second script run reads the cached encoder instead of training again.
    def fail(*args, **kwargs):
        raise AssertionError("supervised pre-training ran twice")

    monkeypatch.setattr(centralized, "supervised_encoder", fail)
    script("supervised").main(["--preset", "smoke", "--out", str(tmp_path / "again")])
    again = load(tmp_path / "again", "cp-cfl-supervised")
    assert again["rounds"] == record["rounds"]


def test_trials_redraw_the_clients_and_report_mean_and_sd(tmp_path):
    out = tmp_path / "out"
    script("trials").main(["--preset", "smoke", "--out", str(out), "--trials", "2", "--set", "federated.rounds=2"])
    first, second = load(out, "trial1-cp-cfl-simclr"), load(out, "trial2-cp-cfl-simclr")
    assert (first["seeds"]["data"], second["seeds"]["data"]) == (0, 1)
    assert first["clients"] != second["clients"]
    table = rows(out / "trials.csv")
    assert len(table) == 12  # five rows of the paper and CP-CFL+restart, two trials
    # its rule (checked after round Tc + 10) never fires in 2 rounds: its trials are CP-CFL's
    assert [{k: v for k, v in r.items() if k != "run"} for r in table
            if r["run"] == "cp-cfl-restart-simclr"] == [
        {k: v for k, v in r.items() if k != "run"} for r in table if r["run"] == "cp-cfl-simclr"]
    assert not (out / "trial1-cp-cfl-restart-simclr.json").exists()
    values = [100 * float(r["accuracy"]) for r in table if r["run"] == "cp-cfl-simclr"]
    report = (out / "trials.md").read_text()
    assert f"{np.mean(values):.2f} ± {np.std(values):.2f}" in report
    assert "76.69 ± 0.47" in report  # the paper's CP-CFL row, computed from its trials
    from cpcfl_tf.records.record import read_record

    trial = [read_record(out / f"trial{k}-cp-cfl-simclr.json") for k in (1, 2)]
    cells = [f"{r.final.ari:.3f} / {r.last_cluster_change()} / 0" for r in trial]
    assert f"| CP-CFL (SimCLR) | {cells[0]} | {cells[1]} |" in report
    assert "| FedAvg (None) | one model | one model |" in report  # no clusters to score
    assert {r["last_cluster_change"] for r in table if r["run"] == "fedavg-none"} == {"1"}


def test_last_cluster_change_is_the_round_after_which_ids_stay():
    import dataclasses

    from cpcfl_tf.records.record import Round, read_record
    from helpers import ROOT

    record = read_record(ROOT / "results/quick/table2/cp-cfl-simclr.json")

    def changes(ids):
        return dataclasses.replace(record, rounds=[Round(t + 1, c) for t, c in enumerate(ids)]
                                   ).last_cluster_change()

    assert changes([[0, 1], [1, 1], [1, 0], [1, 0], [1, 0]]) == 3
    assert changes([[0, 0]] * 4) == 1


def test_clients_scales_the_number_of_clients(tmp_path):
    out = tmp_path / "out"
    script("clients").main(["--preset", "smoke", "--out", str(out), "--set", "federated.rounds=2"])
    for n in (3, 6, 9):
        record = load(out, f"c{n}-cp-cfl-simclr")
        assert len(record["clients"]) == n == record["config"]["partition"]["num_clients"]
        assert (out / f"accuracy-c{n}.png").exists()
    assert len(rows(out / "clients.csv")) == 15




def test_local_optimizer_probes_every_round_and_reports_each_variant(tmp_path):
    from cpcfl_tf.clustered.metrics import zigzag_amplitude

    module = script("local_optimizer")
    module.main(["--preset", "smoke", "--out", str(tmp_path)])
    assert len(module.SPECS) == 10
    sgd = load(tmp_path, "fedavg-none-sgd")
    assert sgd["config"]["federated"]["local_optimizer"] == "sgd"
    assert load(tmp_path, "cp-cfl-simclr-kept")["config"]["federated"]["optimizer_state"] == "client"
    for spec in module.SPECS:
        record, probe = load(tmp_path, spec.name), load(tmp_path, f"{spec.name}.rounds")["rounds"]
        assert [r["round"] for r in probe] == [1, 2, 3, 4]
        for r, p in zip(record["rounds"], probe):  # the probe sees the model the run scored
            assert np.isclose(np.mean(p["client_accuracy"]), r["accuracy"])
        assert -1 <= probe[-1]["update_cosine"] <= 1 and probe[-1]["update_norm"] > 0
    table = rows(tmp_path / "local_optimizer.csv")
    assert {r["variant"] for r in table} == set(module.VARIANTS)
    paper = next(r for r in table if r["run"] == "fedavg-none-paper")
    accuracy = [r["accuracy"] for r in load(tmp_path, "fedavg-none-paper")["rounds"]]
    assert float(paper["zigzag"]) == pytest.approx(zigzag_amplitude(accuracy))
    report = (tmp_path / "local_optimizer.md").read_text()
    assert "Which classes and clients flip" in report and "| group 0 clients |" in report
    assert (tmp_path / "class_accuracy-fedavg-none.png").read_bytes()[:4] == b"\x89PNG"


def test_local_optimizer_summary_sees_rounds_that_undo_each_other():
    summary = script("local_optimizer").summary

    from types import SimpleNamespace

    from cpcfl_tf.records.record import Round

    def run(classes):
        rounds = [Round(t + 1, [], float(np.mean(c))) for t, c in enumerate(classes)]
        probe = [{"round": t + 1, "class_accuracy": c} for t, c in enumerate(classes)]
        return summary(SimpleNamespace(rounds=rounds), probe)

    flipping = run([[0.8, 0.2, 0.5] if t % 2 else [0.3, 0.7, 0.6] for t in range(12)])
    assert flipping["class_flip"] == pytest.approx(-1.0)
    rng = np.random.default_rng(0)
    drifting = run([list(0.05 * t * np.array([1.0, 2.0, 3.0]) + 0.001 * rng.random(3))
                    for t in range(12)])
    assert drifting["class_flip"] > 0.9 and drifting["zigzag"] < 0.01


def test_zigzag_amplitude_measures_an_alternating_curve():
    from cpcfl_tf.clustered.metrics import zigzag_amplitude

    assert zigzag_amplitude([0.5, 0.6] * 10) == pytest.approx(0.1)
    assert zigzag_amplitude(np.linspace(0.2, 0.9, 20)) == pytest.approx(0.0)


@pytest.mark.parametrize("name,args,message", [
    ("resnet", ["--encoders", "vgg"], "argument --encoders: unknown vgg"),
    ("resnet", ["--methods", "fedprox"], "argument --methods: unknown fedprox"),
    ("table2", ["--methods", "cp-cfl-simclr,fedprox"], "argument --methods: unknown fedprox"),
    ("resnet", ["--encoders", "resnet18,vgg"], "argument --encoders: unknown vgg"),
    ("linear_eval", ["--methods", "simclr,moco"], "argument --methods: unknown moco"),
    *[(name, ["--trials", "0"], "argument --trials: takes an integer >= 1, got '0'")
      for name in ("trials", "cfl_families", "personalization", "resnet")],
])
def test_name_lists_and_counts_are_checked_in_one_line(tmp_path, capsys, name, args, message):
    with pytest.raises(SystemExit) as stop:
        script(name).main(["--preset", "smoke", "--out", str(tmp_path / "out"), *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "out").exists()  # stopped before anything was written


def test_name_lists_parse_into_the_names():
    from cpcfl_tf.running.cli import name_list

    assert name_list(["a", "b", "c"])("c,a") == ["c", "a"]


def test_mean_sd_is_the_papers_population_sd():
    from cpcfl_tf.running.report import mean_sd

    mean, sd = mean_sd([42.73, 41.53, 43.67, 43.03, 42.67])  # FedAvg (None), paper trials
    # The paper prints 0.69 (truncated); the sample SD (ddof = 1) would be 0.78.
    assert round(mean, 2) == 42.73 and 0.69 <= sd < 0.70


def test_trial_table_summarises_only_several_trials():
    from cpcfl_tf.running.report import trial_table

    def table(*trials, paper=(67.17, 0.8)):
        records = {"cp-cfl": [{"v": v} for v in trials]}
        return trial_table(records, {"cp-cfl": "CP-CFL"}, lambda r: r["v"], percent=True,
                           paper={"cp-cfl": paper})

    assert table(0.5, 0.7)[0] == "| method | trial 1 | trial 2 | mean ± SD | paper mean ± SD |"
    assert table(0.5, 0.7)[2] == "| CP-CFL | 50.00 | 70.00 | 60.00 ± 10.00 | 67.17 ± 0.80 |"
    # One trial: no "± 0.00" column that would look like a measured spread.
    assert table(0.5) == ["| method | trial 1 | paper mean ± SD |", "|---|---|---|",
                          "| CP-CFL | 50.00 | 67.17 ± 0.80 |"]
    # The paper's single run (ResNet-50) is not headed as a mean ± SD.
    assert table(0.5, paper=(72.93, None))[::2] == ["| method | trial 1 | paper |",
                                                    "| CP-CFL | 50.00 | 72.93 |"]


def test_a_report_says_when_its_runs_come_from_other_machines_or_encoders():
    import dataclasses

    from cpcfl_tf.records.record import read_record
    from cpcfl_tf.running.report import provenance

    base = read_record(Path(__file__).parents[1] / "results/quick/table2/cp-cfl-simclr.json")

    def run(cpu, encoder, pretraining="simclr"):
        method = "cp-cfl" if pretraining != "none" else "fedavg"
        config = base.config.with_overrides(federated={"method": method,
                                                       "pretraining": pretraining})
        kept = {k: v for k, v in base.environment.items() if k not in ("cpu_id", "blas")}
        return dataclasses.replace(base, config=config, environment={
            **kept, "cpu": cpu, "starting_encoder": encoder})

    assert provenance([run("A", "e1"), run("A", "e1"), run("A", None, "none")]) == []
    assert provenance([run("A", "e1"), run("A", "e2", "byol")]) == []  # two pre-trainings
    lines = provenance([run("A", "e1"), run("B", "e2"), run("A", "e1")])
    assert len(lines) == 2
    assert "3 runs come from 2 kinds of CPU (2 on A; 1 on B)" in lines[0]
    assert "same simclr pre-training started from different encoders" in lines[1]
    # every seed pre-trains its own encoder: two seeds, two encoders, nothing to note
    other_seed = dataclasses.replace(run("A", "e2"), config=run("A", "e2").config.with_overrides(
        seed=1))
    assert provenance([run("A", "e1"), other_seed]) == []


def test_a_centralized_run_needs_one_or_group_many_models():
    from cpcfl_tf.plan.presets import get_preset
    from cpcfl_tf.clustered.centralized import run_centralized
    from cpcfl_tf.clustered.clients import Clients

    config = get_preset("smoke").with_overrides(
        federated={"method": "centralized", "pretraining": "none", "num_clusters": 2})
    clients = Clients(None, None, np.array([0, 1, 2]), 10, [])
    with pytest.raises(UserError, match="num_clusters 1 .* or 3"):
        run_centralized(resolve(config), clients)


def test_distribute_option_reaches_the_runner(tmp_path):
    from cpcfl_tf.running.cli import experiment_parser
    from cpcfl_tf.plan.presets import get_preset
    from cpcfl_tf.plan.context import RunContext
    from cpcfl_tf.running.runner import Runner
    from cpcfl_tf.running.script import run_context

    args = experiment_parser("x", "x").parse_args(["--distribute", "mirrored"])
    context = run_context(args)
    assert context.distribute == "mirrored" and context.resume is False
    # Every option the context holds comes from its own flag.
    given = experiment_parser("x", "x").parse_args(
        ["--resume", "--force", "--dry-run", "--max-clients-per-step", "2", "--diagnose", "3",
         "--tensorboard", str(tmp_path / "tb"), "--knn-every", "4"])
    assert run_context(given) == RunContext(
        resume=True, force=True, dry_run=True, max_clients=2, diagnose=3,
        tensorboard=tmp_path / "tb", knn_every=4)
    # ... and none from another's: no flag is the default context, --force forces only.
    assert run_context(experiment_parser("x", "x").parse_args([])) == RunContext()
    assert run_context(experiment_parser("x", "x").parse_args(["--force"])) == RunContext(
        force=True)
    # The encoder cache, which pre-trains, reads it there.
    assert Runner("x", get_preset("smoke"), tmp_path, context).encoders.context is context
    assert "--distribute" not in experiment_parser("x", "x", distribute=False).format_help()


def test_op_determinism_is_on_by_default_where_a_gpu_runs(monkeypatch):
    import tensorflow as tf

    from cpcfl_tf.records import environment
    from cpcfl_tf.running.cli import experiment_parser

    calls = []
    monkeypatch.setattr(tf.config.experimental, "enable_op_determinism",
                        lambda: calls.append("on"))
    monkeypatch.setattr(environment, "_DETERMINISTIC_OPS", False)
    assert environment.set_determinism(True, gpus=[]) is False and not calls  # CPU
    assert environment.set_determinism(False, gpus=["GPU:0"]) is False and not calls
    assert environment.set_determinism(True, gpus=["GPU:0"]) is True and calls == ["on"]
    assert environment.environment()["deterministic_ops"] is True
    args = experiment_parser("x", "x").parse_args(["--nondeterministic"])
    assert args.nondeterministic is True


def test_a_record_is_reproducible_here_only_where_every_deciding_field_matches():
    from cpcfl_tf.records.environment import REPRODUCING, environment, reproduces

    here = environment()
    assert reproduces(dict(here), here) and reproduces({**here, "python": "2.7"}, here)
    for field in REPRODUCING:  # any one of them changes the last bits
        assert not reproduces({**here, field: "other"}, here)
        assert not reproduces({k: v for k, v in here.items() if k != field}, here)  # older
