"""The command-line contract: bad input -> one stderr line, exit 2, nothing written."""
import json
import os
import subprocess
import sys

import pytest

from helpers import ROOT, script


def run(*args, cwd=None):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, str(ROOT / "experiments" / "partition.py"), *args],
                          cwd=cwd,
                          capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("args,message", [
    (["--preset", "fast"], "invalid choice"),
    (["--clients", "16"], "split evenly"),
    (["--clients", "0"], "positive"),
    (["--seed", "x"], "invalid int"),
    (["--data-dir", "/nonexistent/fmnist"], "apt-get install -y dataset-fashion-mnist"),
    (["--bogus"], "unrecognized arguments"),
    (["--set", "federated.rounds=many"], "--set federated.rounds takes an integer"),
    (["--set", "federated.round=3"], "unknown field federated.round"),
    (["--set", "partition.num_clients=16"], "split evenly"),
    (["--set", "partition.num_clients=99999"],
     "fashion_mnist_idx:train[50000:] holds 10,000; use at most 200 clients"),
    (["--set", "partition.test_fraction=20"], "15 clients of 1000 test images need 15,000 "
                                              "but fashion_mnist_idx:test holds 10,000"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, message):
    out = tmp_path / "out"
    out.mkdir()
    (out / "partition.json").write_text("earlier result")
    proc = run(*args, "--out", str(out))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["partition.json"]
    assert (out / "partition.json").read_text() == "earlier result"


def test_unwritable_out_is_refused(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = run("--preset", "smoke", "--out", str(blocker / "sub"))
    assert proc.returncode == 2 and "cannot write to" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_partition_command_writes_json_and_figure(tmp_path):
    proc = run("--preset", "quick", "--seed", "2", "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    record = json.loads((tmp_path / "partition.json").read_text())
    assert record["seeds"] == {"data": 2} and len(record["clients"]) == 15
    assert record["group_classes"] == [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]]
    assert (tmp_path / "client_data_amount.png").stat().st_size > 1000
    assert "wrote" in proc.stdout


def test_set_changes_settings_records_them_and_guards_the_folder(tmp_path, monkeypatch, capsys):
    from cpcfl_tf.errors import UserError
    from helpers import script

    monkeypatch.setenv("CPCFL_CACHE", str(tmp_path / "cache"))
    table2 = script("table2")
    out = str(tmp_path / "out")
    args = ["--preset", "smoke", "--out", out, "--methods", "fedavg-none,ifca-none"]
    table2.main(args + ["--set", "federated.rounds=2", "partition.num_clients=6",
                        "--set", "federated.learning_rate=0.002"])
    record = json.loads((tmp_path / "out" / "ifca-none.json").read_text())
    assert [r["round"] for r in record["rounds"]] == [1, 2]
    assert len(record["clients"]) == 6 and record["config"]["federated"]["learning_rate"] == 0.002
    assert record["config"]["requested"]["partition"]["num_clients"] == 6
    assert not (tmp_path / "out" / "cp-cfl-simclr.json").exists()  # not among --methods
    report = (tmp_path / "out" / "table2.md").read_text()
    assert "IFCA (None)" in report and "CP-CFL" not in report
    capsys.readouterr()
    table2.main(args + ["--set", "federated.rounds=2", "partition.num_clients=6",
                        "federated.learning_rate=0.002"])  # the same settings: skipped
    assert capsys.readouterr().out.count("done before") == 2
    with pytest.raises(UserError, match="different config"):
        table2.main(args + ["--set", "federated.rounds=3", "partition.num_clients=6",
                            "federated.learning_rate=0.002"])


def test_dry_run_says_what_would_run_and_touches_nothing(tmp_path, monkeypatch, capsys):
    from helpers import script

    monkeypatch.setenv("CPCFL_CACHE", str(tmp_path / "cache"))
    table2 = script("table2")
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as stop:
        table2.main(["--preset", "smoke", "--out", str(out), "--dry-run",
                     "--set", "federated.rounds=2"])
    assert stop.value.code == 0 and not out.exists() and not (tmp_path / "cache").exists()
    lines = capsys.readouterr().out.splitlines()
    assert "changed federated.rounds=2" in lines[0]
    assert "  fedavg-none: to run" in lines and "  cp-cfl-simclr: to run" in lines
    assert any("simclr encoder: to pre-train (1 epochs)" in l for l in lines)
    assert any("FedAvg encoder: kept from the FedAvg (None) run" in l for l in lines)
    table2.main(["--preset", "smoke", "--out", str(out), "--methods", "fedavg-none",
                 "--set", "federated.rounds=2"])
    (out / ".ifca-none.ckpt.npz").write_bytes(b"")  # an interrupted run
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(SystemExit):
        table2.main(["--preset", "smoke", "--out", str(out), "--dry-run", "--resume",
                     "--methods", "fedavg-none,ifca-none,ifca-fedavg",
                     "--set", "federated.rounds=2"])
    lines = capsys.readouterr().out.splitlines()
    assert "  fedavg-none: done" in lines and "  ifca-none: to resume" in lines
    assert any("FedAvg encoder: cached" in l for l in lines)
    assert sorted(p.name for p in out.iterdir()) == before


def test_tensorboard_gets_every_round_and_every_pretraining_epoch(tmp_path, monkeypatch):
    from cpcfl_tf.records.scalars import read_scalars
    from helpers import script

    monkeypatch.setenv("CPCFL_CACHE", str(tmp_path / "cache"))
    out, board = tmp_path / "out", tmp_path / "board"
    script("table2").main(["--preset", "smoke", "--out", str(out), "--tensorboard", str(board),
                           "--methods", "fedavg-none,cp-cfl-simclr",
                           "--set", "federated.rounds=2"])
    for name in ("fedavg-none", "cp-cfl-simclr"):
        record = json.loads((out / f"{name}.json").read_text())
        scalars = read_scalars(board / "table2" / name)
        assert scalars["accuracy"] == [(r["round"], pytest.approx(r["accuracy"]))
                                       for r in record["rounds"]]
        assert [step for step, _ in scalars["ari"]] == [1, 2]
        sizes = [v for k, points in scalars.items() if k.startswith("cluster_size/")
                 for step, v in points if step == 2]
        assert sum(sizes) == 9  # every smoke client in a cluster after round 2
    (folder,) = (board / "pretrain").iterdir()
    summary = json.loads((tmp_path / "cache" / "pretrained" / folder.name / "pretrain.json")
                         .read_text())
    assert read_scalars(folder)["loss"] == [(h["epoch"], pytest.approx(h["loss"]))
                                            for h in summary["history"]]


def test_max_clients_per_step_reaches_the_runs_and_changes_nothing(tmp_path, monkeypatch):
    from helpers import script

    monkeypatch.setenv("CPCFL_CACHE", str(tmp_path / "cache"))
    args = ["--preset", "smoke", "--methods", "ifca-none", "--set", "federated.rounds=2"]
    import cpcfl_tf.clustered.simulator as simulator

    table2 = script("table2")
    table2.main(args + ["--out", str(tmp_path / "whole")])
    sizes = []  # the clients of each of the backend's training steps, with the option
    original = simulator._Simulation._trained

    def trained(self, *a, **k):
        backend = self.backend
        real = backend.train

        def counted(pool, ids, data, *rest, **kw):
            sizes.append(data.num_clients)
            return real(pool, ids, data, *rest, **kw)

        monkeypatch.setattr(backend, "train", counted)
        try:
            return original(self, *a, **k)
        finally:
            monkeypatch.setattr(backend, "train", real)

    monkeypatch.setattr(simulator._Simulation, "_trained", trained)
    table2.main(args + ["--out", str(tmp_path / "chunks"), "--max-clients-per-step", "2"])
    assert sizes and max(sizes) == 2, sizes  # the smoke preset's rounds train more than 2
    whole, chunks = (json.loads((tmp_path / d / "ifca-none.json").read_text())
                     for d in ("whole", "chunks"))
    for key in ("config", "clients", "rounds", "final"):
        assert whole[key] == chunks[key], key


def _no_data(*args, **kwargs):
    raise AssertionError("data was read before the bad folder was refused")


@pytest.mark.parametrize("at_fault", ["cache", "tensorboard", "foreign checkpoint"])
def test_bad_folders_are_refused_by_name_before_any_data_is_read(tmp_path, monkeypatch,
                                                                 at_fault):
    """A cache or TensorBoard path that is a file, or another pre-training's checkpoint in
    the cache: one error naming the setting at fault, before any image is read, and the
    earlier results untouched."""
    import numpy as np

    import cpcfl_tf.pretraining.pretrain as pretrain
    import cpcfl_tf.data as data
    import cpcfl_tf.clustered.clients as clients
    from cpcfl_tf.plan.presets import get_preset
    from cpcfl_tf.methods.ssl import get_ssl_method
    from cpcfl_tf.errors import UserError
    from helpers import script

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cache = blocker if at_fault == "cache" else tmp_path / "cache"
    monkeypatch.setenv("CPCFL_CACHE", str(cache))
    out = tmp_path / "out"
    out.mkdir()
    (out / "fedavg-none.json").write_text("earlier result")
    args = ["--preset", "smoke", "--out", str(out), "--methods", "cp-cfl-simclr"]
    if at_fault == "tensorboard":
        args += ["--tensorboard", str(blocker)]
    if at_fault == "foreign checkpoint":
        config = get_preset("smoke")
        folder = pretrain.pretrain_folder(config.pretrain, config.data,
                                          get_ssl_method("simclr"), config.seed)
        folder.mkdir(parents=True)
        meta = {"config": pretrain.identity(config.pretrain, "simclr"), "seed": 12345,
                "images": [1, 1, 1, 1]}
        np.savez(folder / "checkpoint.npz",
                 __record__=np.array(json.dumps({"epoch": 1, "meta": meta, "history": []})))
    for module, name in ((data, "load_unlabeled"), (data, "load_labeled"),
                         (clients, "load_client_splits"), (pretrain, "load_pretrain_images")):
        monkeypatch.setattr(module, name, _no_data)
    fix = {"cache": "set CPCFL_CACHE to a writable folder",
           "tensorboard": "pass --tensorboard DIR with a writable folder",
           "foreign checkpoint": "belongs to a different pre-training"}[at_fault]
    with pytest.raises(UserError, match=fix) as err:
        script("table2").main(args)
    assert "\n" not in str(err.value) and "--out" not in str(err.value)
    assert sorted(p.name for p in out.iterdir()) == ["fedavg-none.json"]
    assert (out / "fedavg-none.json").read_text() == "earlier result"


@pytest.mark.parametrize("name,args,setting,option", [
    # a table script: its rows fix the method and its start (issue: the record said simclr)
    ("table2", ["--methods", "cp-cfl-simclr"], "federated.pretraining=byol", "--methods"),
    # a study: its runs fix the method of each row
    ("clustering_reliability", ["--runs", "2"], "federated.method=ifca", "--methods"),
    # a script without --methods whose runs set N (N = 1-5 are its rows)
    ("clusters", [], "federated.num_clusters=4", "leave it out"),
])
def test_a_set_that_a_row_fixes_is_refused_before_any_work(tmp_path, capsys, name, args,
                                                          setting, option):
    from cpcfl_tf.errors import run_cli

    out = tmp_path / "out"
    for dry in ([], ["--dry-run"]):
        with pytest.raises(SystemExit) as stop:
            run_cli(script(name).main, ["--preset", "smoke", "--out", str(out), "--set",
                                        setting, *args, *dry])
        captured = capsys.readouterr()
        err = captured.err.strip().splitlines()
        assert stop.value.code == 2 and len(err) == 1, err
        assert f"--set {setting} would not be used" in err[0] and option in err[0]
        assert "changed" not in captured.out  # no dry-run header, no run
        assert not out.exists() or not any(out.iterdir())  # nothing written


@pytest.mark.parametrize("name,specs", [
    ("table2", lambda module: module.SPECS),
    ("clustering_reliability", lambda module: module.specs(0, 2, 1)),
])
def test_what_the_dry_run_says_changed_is_what_every_run_uses(tmp_path, capsys, name, specs):
    from cpcfl_tf.running.cli import changed_fields

    module = script(name)
    argv = ["--preset", "smoke", "--out", str(tmp_path / "out"), "--dry-run",
            "--set", "federated.rounds=3", "federated.local_epochs=2", "partition.num_clients=6"]
    with pytest.raises(SystemExit) as stop:
        module.main(argv)
    header = capsys.readouterr().out.splitlines()[0]
    assert stop.value.code == 0
    assert "changed federated.rounds=3, federated.local_epochs=2" in header.replace(
        "partition.num_clients=6, ", "")
    session = module.SCRIPT.start(argv)
    assert set(changed_fields(session.config)) == {
        ("federated", "rounds"), ("federated", "local_epochs"), ("partition", "num_clients")}
    for spec in specs(module):
        config = session.runner.config_of(spec)
        assert (config.federated.rounds, config.federated.local_epochs,
                config.partition.num_clients) == (3, 2, 6), spec.name


@pytest.mark.parametrize("setting,option", [("federated.rounds=5", "--rounds"),
                                            ("federated.method=ifca", "--method"),
                                            ("partition.num_clients=4", "--nodes")])
def test_the_flower_launcher_refuses_a_set_its_options_give(tmp_path, capsys, setting, option):
    from cpcfl_tf.errors import run_cli
    from cpcfl_tf.flower.loopback import main

    out = tmp_path / "flower"
    with pytest.raises(SystemExit) as stop:
        run_cli(main, ["--out", str(out), "--set", setting])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and f"use {option} instead" in err[0], err
    assert not out.exists()  # before any process started or folder was made


def _scripts_with_runner_options():
    """Every script whose command line takes the runner's options."""
    from helpers import SCRIPT_FOLDERS

    names = []
    for folder in SCRIPT_FOLDERS:
        for path in sorted((ROOT / folder).glob("*.py")):
            text = path.read_text()
            if "Script(__file__" in text and "distribute=False" not in text:
                names.append(path.stem)
    return names


FITS_SMOKE = {"federated_pretraining": ["--set", "partition.num_clients=3"]}
"""What a script needs beside ``--preset smoke`` to get past its own checks."""


@pytest.mark.parametrize("name", _scripts_with_runner_options())
@pytest.mark.parametrize("option,value,message", [
    ("--knn-proxy", "bad", "--knn-proxy takes TRAIN,TEST"),
    ("--knn-proxy", "digits:train,digits:valid", "digits has no split 'valid'"),
    ("--knn-proxy", "stl10:unlabelled,stl10:test", "stl10:unlabelled has no labels"),
    ("--encoders-from", "/nowhere/encoder_selection.json", "--encoders-from /nowhere"),
])
def test_a_bad_runner_option_is_refused_before_any_data_is_read(tmp_path, capsys, monkeypatch,
                                                                name, option, value, message):
    from cpcfl_tf.data import sources
    from cpcfl_tf.errors import run_cli

    def read(*args, **kwargs):
        raise AssertionError("data was read before the options were checked")

    monkeypatch.setattr(sources, "load_labeled", read)
    monkeypatch.setattr(sources, "load_unlabeled", read)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as stop:
        run_cli(script(name).main, ["--preset", "smoke", "--out", str(out), option, value,
                                    *FITS_SMOKE.get(name, [])])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and message in err[0], (name, err)
    assert not out.exists()


def test_a_knn_proxy_that_cannot_be_read_is_refused_when_the_monitor_would_read_it(
        tmp_path, capsys, monkeypatch):
    from cpcfl_tf.errors import run_cli

    monkeypatch.setenv("CPCFL_OFFLINE", "1")
    monkeypatch.setenv("TFDS_DATA_DIR", str(tmp_path / "tfds"))
    out = tmp_path / "out"
    argv = ["--preset", "smoke", "--out", str(out), "--knn-proxy", "stl10:train,stl10:test"]
    with pytest.raises(SystemExit) as stop:
        run_cli(script("table2").main, [*argv, "--knn-every", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and "stl10 is not prepared" in err[0]
    assert not out.exists()
    with pytest.raises(SystemExit) as stop:  # a dry run reads no data
        script("table2").main([*argv, "--knn-every", "2", "--dry-run"])
    assert stop.value.code == 0 and "fedavg-none" in capsys.readouterr().out
    assert not out.exists()


def test_all_passes_every_option_it_takes_to_each_script(tmp_path, monkeypatch):
    """experiments/all.py takes the scripts' options: each one reaches every script (they
    were accepted and silently dropped), none is taken and not passed on."""
    module = script("all")
    calls = []
    monkeypatch.setattr(module, "load", lambda name: type("M", (), {
        "SCRIPT": script(name).SCRIPT,
        "main": staticmethod(lambda argv: calls.append((name, argv)))}))
    proxy = "fashion_mnist_idx:train[50000:],fashion_mnist_idx:test"
    module.main(["--preset", "smoke", "--out", str(tmp_path), "--scripts", "table2,heads",
                 "--distribute", "mirrored", "--knn-every", "2", "--knn-proxy", proxy,
                 "--nondeterministic", "--set", "federated.rounds=3"])
    assert [name for name, _ in calls] == ["table2", "heads"]
    for name, argv in calls:
        parsed = script(name).SCRIPT.parser().parse_args(argv)
        assert (parsed.distribute, parsed.knn_every, parsed.knn_proxy, parsed.nondeterministic,
                parsed.set, parsed.out) == ("mirrored", 2, proxy, True, ["federated.rounds=3"],
                                            str(tmp_path / name))


def test_all_gives_each_script_only_options_it_takes(tmp_path, monkeypatch):
    """Every script all.py runs parses the command line all.py gives it, with every
    option all.py takes set (pretraining_cost, which times one device, was given
    --distribute and stopped the whole run); the options a script lacks are the
    pre-training's placement ones, and only where its SCRIPT says it takes none."""
    module = script("all")
    calls = []
    monkeypatch.setattr(module, "load", lambda name: type("M", (), {
        "SCRIPT": script(name).SCRIPT,
        "main": staticmethod(lambda argv: calls.append((name, argv)))}))
    module.main(["--preset", "smoke", "--out", str(tmp_path), "--distribute", "mirrored",
                 "--knn-every", "2", "--nondeterministic", "--set", "federated.rounds=3"])
    assert [name for name, _ in calls] == list(module.SCRIPTS)
    for name, argv in calls:
        parsed = script(name).SCRIPT.parser().parse_args(argv)  # exits 2 on an unknown one
        assert parsed.nondeterministic and parsed.set == ["federated.rounds=3"], name
        assert getattr(parsed, "distribute", None) == (
            "mirrored" if script(name).SCRIPT.distribute else None), name


def test_a_resume_command_repeats_the_command_line_as_given(tmp_path):
    """A partial report's command: every option given, abbreviated ones in full, quoted as
    a shell needs, with --resume in place of --report, --force and --dry-run."""
    import argparse

    from cpcfl_tf.plan.presets import get_preset
    from cpcfl_tf.running.script import Session

    study = script("clustering_reliability")
    parser = study.SCRIPT.parser()
    study._options(parser)
    out = tmp_path / "my runs"
    args = parser.parse_args(["--preset", "smoke", "--rep", "--out", str(out), "--ru", "4",
                              "--force", "--set", "federated.rounds=2", "pretrain.epochs=1"])
    assert args.report and args.runs == 4  # argparse took the abbreviations
    session = Session("clustering_reliability", args, get_preset("smoke"), out,
                      "experiments/clustering_reliability.py")
    assert session.resume_command() == (
        f"python experiments/clustering_reliability.py --preset smoke --out '{out}' --runs 4 "
        "--set federated.rounds=2 pretrain.epochs=1 --resume")
    assert Session("x", argparse.Namespace(), get_preset("smoke"), out).resume_command() \
        == "python x.py --resume"
