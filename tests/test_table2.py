"""experiments/table2.py end to end on the smoke preset, and the runner's contract."""
import csv
import json
import re

import pytest

from cpcfl_tf.errors import UserError
from cpcfl_tf.records.record import read_record
from cpcfl_tf.plan.resolve import resolve
from cpcfl_tf.methods.ssl import get_ssl_method
from helpers import ROOT, run_record_errors, script
from cpcfl_tf.plan.context import RunContext

CONTRACT = ("experiment", "preset", "method", "pretraining", "config", "seeds", "clients",
            "rounds", "final", "timing", "environment")


def table2():
    return script("table2")


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("table2")
    table2().main(["--preset", "smoke", "--out", str(out)])
    return out


def test_table2_writes_every_run_and_the_papers_tables(smoke_run):
    names = [s.name for s in table2().SPECS]
    # CP-CFL+restart's rule (checked after round Tc + 10) never fires in 4 rounds: its row
    # is the CP-CFL (SimCLR) run, not written again
    assert not (smoke_run / "cp-cfl-restart-simclr.json").exists()
    rows = {r["run"]: r for r in csv.DictReader(open(smoke_run / "table2.csv"))}
    assert {k: v for k, v in rows["cp-cfl-restart-simclr"].items() if k != "run"} == \
        {k: v for k, v in rows["cp-cfl-simclr"].items() if k != "run"}
    for name in names[:-1]:
        record = json.loads((smoke_run / f"{name}.json").read_text())
        assert all(key in record for key in CONTRACT)
        assert run_record_errors(record) == [], name
        assert record["experiment"] == "table2" and record["preset"] == "smoke"
        assert [r["round"] for r in record["rounds"]] == [1, 2, 3, 4]
        assert 0 <= record["final"]["accuracy"] <= 1
    report = (smoke_run / "table2.md").read_text()
    assert "CP-CFL (SimCLR)" in report and "76.80" in report  # the paper's column
    assert (smoke_run / "table2.csv").read_text().count("\n") == len(names) + 1
    for png in ("accuracy.png", "cluster_identity.png", "client_data_amount.png"):
        assert (smoke_run / png).read_bytes()[:4] == b"\x89PNG"
    assert not list(smoke_run.glob(".*.ckpt.npz"))  # no checkpoint left behind


def test_records_name_the_encoder_they_started_from(smoke_run):
    import keras
    import numpy as np

    from cpcfl_tf.pretraining.pretrain import pretrain_folder
    from cpcfl_tf.records.files import weights_fingerprint

    start = {name: read_record(smoke_run / f"{name}.json").environment["starting_encoder"]
             for name in ("fedavg-none", "ifca-none", "fedavg-simclr", "cp-cfl-simclr",
                          "cp-cfl-byol", "ifca-fedavg")}
    assert start["fedavg-none"] is None and start["ifca-none"] is None  # random init
    assert start["fedavg-simclr"] == start["cp-cfl-simclr"]  # one pre-training serves both
    assert len({start["cp-cfl-simclr"], start["cp-cfl-byol"], start["ifca-fedavg"]}) == 3
    config = read_record(smoke_run / "cp-cfl-simclr.json").config
    cached = pretrain_folder(config.pretrain, config.data, get_ssl_method("simclr"), seed=0) / "encoder.keras"
    weights = keras.saving.load_model(cached, compile=False).get_weights()
    assert weights_fingerprint(weights) == start["cp-cfl-simclr"]
    weights[0] = np.nextafter(weights[0], np.inf)  # one ulp in every entry of one array
    assert weights_fingerprint(weights) != start["cp-cfl-simclr"]


def test_a_rerun_skips_finished_runs(smoke_run, capsys):
    before = (smoke_run / "fedavg-none.json").read_text()
    table2().main(["--preset", "smoke", "--out", str(smoke_run)])
    assert capsys.readouterr().out.count("done before") == 7
    assert (smoke_run / "fedavg-none.json").read_text() == before


def test_a_folder_of_another_config_is_refused(smoke_run):
    with pytest.raises(UserError, match="different config; pass --force"):
        table2().main(["--preset", "smoke", "--out", str(smoke_run), "--seed", "1"])


def test_an_interrupted_run_needs_resume(smoke_run, tmp_path):
    from cpcfl_tf.plan.presets import get_preset
    from cpcfl_tf.running.runner import RunSpec, Runner

    spec = RunSpec("fedavg-none", "fedavg", "none")
    runner = Runner("table2", get_preset("smoke"), tmp_path, context=RunContext(verbose=0))
    from cpcfl_tf.clustered.simulator import run_federated

    config = spec.config(get_preset("smoke"))
    stop = {"after": 2}

    class Stop(Exception):
        pass

    def interrupt(record, state):
        if record["round"] == stop["after"]:
            raise Stop

    with pytest.raises(Stop):
        run_federated(resolve(config), runner.data.clients(config), context=RunContext(verbose=0),
                      checkpoint=tmp_path / ".fedavg-none.ckpt.npz", on_round=interrupt)
    with pytest.raises(UserError, match="interrupted .* --resume"):
        runner.run(spec)
    resumed = Runner("table2", get_preset("smoke"), tmp_path, context=RunContext(resume=True, verbose=0)).run(spec)
    whole = read_record(smoke_run / "fedavg-none.json")
    assert resumed.rounds == whole.rounds and resumed.final == whole.final


def test_fedavg_simclr_is_cp_cfl_simclr_with_one_cluster(smoke_run, tmp_path):
    from cpcfl_tf.plan.presets import get_preset
    from cpcfl_tf.running.runner import RunSpec, Runner

    fedavg = json.loads((smoke_run / "fedavg-simclr.json").read_text())
    one = Runner("clusters", get_preset("smoke"), tmp_path, context=RunContext(verbose=0)).run(
        RunSpec("cp-cfl-simclr-n1", "cp-cfl", "simclr", {"num_clusters": 1})).to_json()
    assert fedavg["config"]["federated"]["head_rounds"] == 1  # smoke's Tc
    for key in ("seeds", "clients", "rounds", "final"):
        assert fedavg[key] == one[key], key
    # Apart from the labels, the configs they ran are the same too.
    ran = [dict(r["config"]["federated"], method=None) for r in (fedavg, one)]
    assert ran[0] == ran[1]
    for name in ("fedavg-none", "ifca-none", "ifca-fedavg"):  # no Tc phase
        record = json.loads((smoke_run / f"{name}.json").read_text())
        assert record["config"]["federated"]["head_rounds"] == 0, name


def test_a_record_that_ran_with_an_older_meaning_of_its_method_is_refused(smoke_run, tmp_path):
    from cpcfl_tf.plan.presets import get_preset
    from cpcfl_tf.running.runner import RunSpec, Runner

    record = json.loads((smoke_run / "fedavg-simclr.json").read_text())
    record["config"]["federated"]["head_rounds"] = 0  # before FedAvg (SimCLR) had Tc
    (tmp_path / "fedavg-simclr.json").write_text(json.dumps(record))
    runner = Runner("table2", get_preset("smoke"), tmp_path, context=RunContext(verbose=0))
    with pytest.raises(UserError, match="different config"):
        runner.run(RunSpec("fedavg-simclr", "fedavg", "simclr"))


def test_a_record_written_before_a_config_field_existed_still_counts(smoke_run, tmp_path):
    from cpcfl_tf.plan.presets import get_preset
    from cpcfl_tf.running.runner import RunSpec, Runner

    record = json.loads((smoke_run / "fedavg-none.json").read_text())
    for section in (record["config"]["federated"], record["config"]["requested"]["federated"]):
        del section["local_optimizer"], section["optimizer_state"]
    (tmp_path / "fedavg-none.json").write_text(json.dumps(record))
    runner = Runner("table2", get_preset("smoke"), tmp_path, context=RunContext(verbose=0))
    assert (runner.run(RunSpec("fedavg-none", "fedavg", "none")).to_json()["rounds"]
            == record["rounds"])
    other = RunSpec("fedavg-none", "fedavg", "none", {"local_optimizer": "sgd"})
    with pytest.raises(UserError, match="different config"):
        runner.run(other)


def test_no_arguments_means_the_paper_preset_and_offline_it_stops_at_once(tmp_path):
    import os
    import subprocess
    import sys
    import time

    env = dict(os.environ, CPCFL_OFFLINE="1", TF_CPP_MIN_LOG_LEVEL="3",
               TFDS_DATA_DIR=str(tmp_path / "tfds"))
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "table2.py"),
                           "--data-dir", str(tmp_path / "tfds"), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2 and time.monotonic() - started < 120
    # TF 2.21 writes start-up lines (absl, oneDNN, CUDA) to stderr on import that no
    # environment variable silences; everything else must be our single error line.
    tf_noise = re.compile(r"^(WARNING: All log messages before absl|[IWEF]\d{4} |To enable the "
                          r"following instructions)")
    lines = [l for l in proc.stderr.strip().splitlines() if not tf_noise.match(l)]
    assert len(lines) == 1 and "stl10" in lines[0] and "--preset quick" in lines[0]
    assert not proc.stdout  # refused before the first run began (no run's header)
    assert not list((tmp_path / "out").glob("*.json"))
    dry = subprocess.run([sys.executable, str(ROOT / "experiments" / "table2.py"),
                          "--data-dir", str(tmp_path / "tfds"), "--out", str(tmp_path / "out"),
                          "--dry-run"], capture_output=True, text=True, env=env, timeout=300)
    assert dry.returncode == 0 and "fedavg-none" in dry.stdout  # a dry run reads no data


def test_clusters_script_runs_n_1_to_5(tmp_path):
    script("clusters").main(["--preset", "smoke", "--out", str(tmp_path / "out")])
    for n in range(1, 6):
        record = json.loads((tmp_path / "out" / f"cp-cfl-simclr-n{n}.json").read_text())
        assert record["config"]["federated"]["num_clusters"] == n
        assert record["final"]["bytes_down"] == 4 * 9 * n * record["final"]["model_bytes"]
    assert "| 3 |" in (tmp_path / "out" / "clusters.md").read_text()
    assert (tmp_path / "out" / "accuracy.png").exists()


def test_encoder_training_script_covers_heads_and_settings(tmp_path):
    script("encoder_training").main(["--preset", "smoke", "--out", str(tmp_path / "out"),
                                     "--set", "federated.rounds=2"])
    frozen = json.loads((tmp_path / "out" / "cp-cfl-simclr-c-3-e0.json").read_text())
    assert frozen["config"]["federated"]["encoder_epochs"] == 0
    assert frozen["config"]["federated"]["head"] == "c-3"
    shared = json.loads((tmp_path / "out" / "cp-cfl-simclr-c-global.json").read_text())
    assert shared["config"]["federated"]["global_encoder"] is True
    report = (tmp_path / "out" / "encoder_training.md").read_text()
    assert "E_l,f = 0 (frozen)" in report and "(79.10)" in report
    assert (tmp_path / "out" / "encoder_training.csv").read_text().count("\n") == 17


def test_ifca_fedavg_starts_from_the_cached_fedavg_encoder(tmp_path, monkeypatch, capsys):
    import cpcfl_tf.clustered.starting as starting
    from cpcfl_tf.plan.presets import get_preset
    from cpcfl_tf.running.runner import RunSpec, Runner

    monkeypatch.setenv("CPCFL_CACHE", str(tmp_path / "cache"))
    spec = RunSpec("ifca-fedavg", "ifca", "fedavg")
    first = Runner("table2", get_preset("smoke"), tmp_path / "a", context=RunContext(verbose=0)).run(spec)
    (cached,) = (tmp_path / "cache" / "fedavg").glob("*.npz")
    trained = starting.fedavg_encoder
    monkeypatch.setattr(starting, "fedavg_encoder",
                        lambda *a, **k: pytest.fail("FedAvg was trained again"))
    again = Runner("table2", get_preset("smoke"), tmp_path / "b", context=RunContext(verbose=0)).run(spec)
    assert again.rounds == first.rounds and again.final == first.final
    cached.write_bytes(b"damaged")  # a damaged entry is rebuilt, with one line
    monkeypatch.setattr(starting, "fedavg_encoder", trained)
    third = Runner("table2", get_preset("smoke"), tmp_path / "c", context=RunContext(verbose=0)).run(spec)
    assert third.final == first.final and capsys.readouterr().err.count("is damaged") == 1


def test_a_restart_variant_run_whose_rule_never_fires_is_taken_from_its_base_run(
        smoke_run, tmp_path):
    # CP-CFL+restart is CP-CFL until its failure test fires (tests/test_simulator.py), so
    # where CP-CFL's run of the same config shows the test passing, that run is taken
    # for it (no record written, nothing trained); where the test fires, it runs.
    from cpcfl_tf.plan.presets import get_preset
    from cpcfl_tf.clustered.restarts import clustering_failed
    from cpcfl_tf.running.runner import RunSpec, Runner

    runner = Runner("reliability", get_preset("smoke"), tmp_path, context=RunContext(verbose=0))
    short = {"rounds": 3, "restart_round": 1}
    plain = runner.run(RunSpec("cp-cfl", "cp-cfl", "simclr", short))
    assert not clustering_failed(plain.rounds[1].cluster_ids, 3, 0.5)  # at Tc + 1 = 2
    variant = RunSpec("restart", "cp-cfl-restart", "simclr", short)
    assert runner.planned(variant)[0] == (f"its restart rule never fires in "
                                          f"{tmp_path / 'cp-cfl.json'}: that run")
    # --dry-run lists no encoder for it: none is pre-trained for a run taken from another
    assert runner.planned(variant)[1] is None
    assert runner.planned(RunSpec("cp-cfl", "cp-cfl", "simclr", short))[1] is None  # done
    assert runner.planned(RunSpec("other", "cp-cfl", "simclr", short))[1].startswith(
        "simclr encoder: cached")
    # One decision per run, an enum: the variant stands in, the base is done, a new
    # config is made; a run taken elsewhere never builds an encoder.
    from cpcfl_tf.running.runner import Decision

    assert [runner.decide(s).decision for s in (
        variant, RunSpec("cp-cfl", "cp-cfl", "simclr", short),
        RunSpec("other", "cp-cfl", "simclr", short))] == [
            Decision.STAND_IN, Decision.DONE, Decision.RUN]
    assert runner.decide(variant).found.path == tmp_path / "cp-cfl.json"
    (tmp_path / ".other.ckpt.npz").write_bytes(b"")  # interrupted: resumed, or refused
    assert Runner("reliability", get_preset("smoke"), tmp_path, context=RunContext(verbose=0, resume=True)
                  ).decide(RunSpec("other", "cp-cfl", "simclr", short)).decision \
        is Decision.RESUME
    assert runner.planned(RunSpec("other", "cp-cfl", "simclr", short))[0].startswith(
        "stops: other was interrupted")
    (tmp_path / ".other.ckpt.npz").unlink()
    assert runner.run(variant).to_json() == plain.to_json()
    assert runner.finished(variant).to_json() == plain.to_json()
    assert runner.store.stood_in == {"restart": ("cp-cfl-restart", tmp_path / "cp-cfl.json")}
    assert not (tmp_path / "restart.json").exists()
    # a share no cluster reaches: the test fires at round 2, and the variant runs itself
    strict = {**short, "min_cluster_share": 1.5, "max_restarts": 1}
    base = runner.run(RunSpec("cp-cfl-strict", "cp-cfl", "simclr", strict))
    assert base.rounds == plain.rounds  # CP-CFL has no restart rule
    made = runner.run(RunSpec("restart-strict", "cp-cfl-restart", "simclr", strict))
    assert made.final.restarts == 1 and (tmp_path / "restart-strict.json").exists()
    assert "restart-strict" not in runner.store.stood_in
    # --force makes every run again
    forced = Runner("reliability", get_preset("smoke"), tmp_path, context=RunContext(verbose=0, force=True))
    again = forced.run(variant)
    assert again.rounds == plain.rounds and (tmp_path / "restart.json").exists()
    # The report's note counts the stand-ins, and the runs made in full whose rule never
    # fired either: here `again` (0 restarts) of `made` and `again`; a record passed
    # twice counts once; CP-CFL's own run is not the variant's.
    from cpcfl_tf.running.script import stood_in_note

    assert again.final.restarts == 0
    assert stood_in_note(runner.store.stood_in, [made, again, again, plain]) == (
        "1 run of CP-CFL+restart is CP-CFL's run of the same config: its restart rule never "
        "fired in it, and until it fires CP-CFL+restart is CP-CFL bit for bit; it never "
        "fired either in 1 of the 2 runs of CP-CFL+restart made in full (2 of 3 in all).")
    assert stood_in_note(runner.store.stood_in, [made]).endswith("CP-CFL bit for bit.")


def test_one_run_of_any_method_is_the_tables_run_of_its_config(smoke_run, tmp_path,
                                                                 monkeypatch, capsys):
    # experiments/run.py makes one run of a method from a start. Here the kit's tree is
    # this table2 folder (results/smoke/table2 under a working folder of the test's own):
    # run.py's IFCA (None) has table2's ifca-none config, so this machine takes it (same
    # config, machine kind and starting encoder) and makes nothing; its report is that
    # record's, and --dry-run of any method says what it would do without doing it.
    import shutil

    from cpcfl_tf.errors import run_cli

    tree = tmp_path / "results" / "smoke" / "table2"
    shutil.copytree(smoke_run, tree)
    monkeypatch.chdir(tmp_path)
    run = script("run")
    record = read_record(tree / "ifca-none.json")
    run.main(["--preset", "smoke", "--method", "ifca", "--pretraining", "none"])
    out = capsys.readouterr().out
    assert "ifca-none-seed0: the same run as results/smoke/table2/ifca-none.json" in out
    report = (tmp_path / "results" / "smoke" / "run" / "run.md").read_text()
    marks = record.config.federated.quarters
    assert "| " + " | ".join(f"{100 * record.accuracy_at(t):.2f}" for t in marks) in report
    assert not list((tmp_path / "results" / "smoke" / "run").glob("*-seed0.json"))
    # The method from --set where --method is left out (the start is the preset's);
    # --dry-run says what it would do and writes nothing.
    with pytest.raises(SystemExit) as stop:
        run.main(["--preset", "smoke", "--set", "federated.method=fedavg", "--dry-run"])
    assert stop.value.code == 0
    from cpcfl_tf.plan.presets import get_preset

    start = get_preset("smoke").federated.pretraining
    assert f"  fedavg-{start}-seed0: " in capsys.readouterr().out
    # An unknown method: one line naming the choices, exit status 2, nothing written.
    with pytest.raises(SystemExit) as stop:
        run_cli(run.main, ["--preset", "smoke", "--method", "fedprox", "--out",
                           str(tmp_path / "new")])
    assert stop.value.code == 2
    assert "unknown federated.method 'fedprox'; choose one of" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
    # --from RECORD re-makes the stored run from its config, never taken from the tree:
    # on this machine, from the same (random) start, it is the record bit for bit.
    run.main(["--from", str(tree / "ifca-none.json"), "--out", str(tmp_path / "again")])
    assert (f"against {tree / 'ifca-none.json'}: bit for bit: every round and the final "
            "result equal the record's") in capsys.readouterr().out
    again = read_record(tmp_path / "again" / "ifca-none-seed0.json")
    assert [r.to_json() for r in again.rounds] == [r.to_json() for r in record.rounds]
    assert again.requested == record.requested
    # Bad input: one line, exit status 2, no folder made.

    centralized = ROOT / "results" / "quick" / "datasets" / "fmnist-digits-centralized-all.json"
    for argv, said in (
            (["--from", str(centralized)], "is a centralized baseline's record (centralized)"),
            (["--from", str(tmp_path / "none.json")], "is not a file; give a run record"),
            (["--from", str(tree / "table2.csv")], "is not a run record"),
            (["--from", str(tree / "ifca-none.json"), "--seed", "2"],
             "--from takes the run's settings from its record; drop --seed"),
            (["--from", str(tree / "ifca-none.json"), "--method=cfl"], "drop --method")):
        with pytest.raises(SystemExit) as stop:
            run_cli(run.main, [*argv, "--out", str(tmp_path / "bad")])
        assert stop.value.code == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1, err
        assert not (tmp_path / "bad").exists()


def test_a_remade_run_is_compared_with_its_record_and_says_why_it_differs(smoke_run):
    """experiments/run.py --from's comparison line, against a record by hand: the same
    outcome is bit for bit; another outcome from another starting encoder or on another
    CPU says so; another outcome where neither differs is a difference to report."""
    import dataclasses

    from cpcfl_tf.running.compare import against_record

    stored = read_record(smoke_run / "ifca-none.json")
    assert against_record(stored, stored).startswith("bit for bit")
    other = dataclasses.replace(stored, final=dataclasses.replace(stored.final, accuracy=0.5))
    env = stored.environment
    said = against_record(dataclasses.replace(other, environment={
        **env, "starting_encoder": "abc"}), stored)
    assert said.startswith("not bit for bit, as expected: another starting encoder (abc "
                           f"against {env.get('starting_encoder')}")
    assert said.endswith(f"final accuracy 50.00 against the record's "
                         f"{100 * stored.final.accuracy:.2f}")
    said = against_record(dataclasses.replace(other, environment={**env, "cpu": "Elsewhere",
                                                                  "cpu_id": None}), stored)
    assert said.startswith("not bit for bit, as expected: another CPU (Elsewhere against ")
    assert against_record(other, stored).startswith(
        "differs although the CPU kind and the starting encoder are the record's")
    # Both another encoder and another CPU: the encoder is named (it alone would differ).
    said = against_record(dataclasses.replace(other, environment={
        **env, "starting_encoder": "abc", "cpu": "Elsewhere", "cpu_id": None}), stored)
    assert said.startswith("not bit for bit, as expected: another starting encoder"), said
    # A round that differs is a difference, even where the final result is the record's.
    first = dataclasses.replace(stored.rounds[0], accuracy=stored.rounds[0].accuracy + 0.01)
    assert against_record(dataclasses.replace(stored, rounds=[first, *stored.rounds[1:]]),
                          stored).startswith("differs although")
    # A Flower run's record holds no F1, AUROC or ARI (the server never sees the clients'
    # data) and says who replied: held to what it records.
    from cpcfl_tf.records.record import RunRecord

    served = stored.to_json()
    scores = ("f1_macro", "f1_weighted", "auroc_ovr_macro", "auroc_ovr_weighted",
              "auroc_ovo_macro", "auroc_ovo_weighted")
    for r in served["rounds"]:
        for key in scores:
            r.pop(key, None)
        r.update(replies=3, failed_partitions=[])
    for key in scores:
        served["final"].pop(key, None)
    served.update(experiment="flower")
    served["final"].update(ari=None)
    flower = RunRecord.from_json(served)
    assert against_record(stored, flower) == (
        "bit for bit: every round and the final result equal the record's (what a Flower "
        "record holds)")
    assert against_record(stored, dataclasses.replace(flower, rounds=[first, *flower.rounds[1:]])
                          ).startswith("differs although")


def test_a_scripts_data_is_checked_once_per_piece_of_data(tmp_path, monkeypatch):
    # The script's set-up checks the base config's data; the runner then checks only what
    # its runs read beyond it: table2's rows start from none, SimCLR (the smoke preset's,
    # checked by the set-up), FedAvg, BYOL and SimSiam; CP-CFL+restart's base run and
    # the other SimCLR rows read the same data and are not checked again.
    from cpcfl_tf.plan import resolve as plan_resolve

    checked, real = [], plan_resolve.check_data
    monkeypatch.setattr(plan_resolve, "check_data",
                        lambda config: (checked.append(config.federated.pretraining),
                                        real(config))[1])
    with pytest.raises(SystemExit) as stop:
        table2().main(["--preset", "smoke", "--out", str(tmp_path / "t"), "--dry-run"])
    assert stop.value.code == 0
    assert sorted(checked) == ["byol", "fedavg", "none", "simclr", "simsiam"]
