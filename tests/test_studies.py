"""The studies beyond the paper's tables (all, heterogeneity, the clustered-FL families,
the clustering-reliability study), the ResNet-18 ablation, and the runner features they
rely on (records taken from the tree, taken.json, the CPU and BLAS a record names), end to
end on the smoke preset. Split from test_scripts.py so that xdist's loadfile runs the two
halves on two workers."""
import csv
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from cpcfl_tf.errors import UserError
from helpers import run_record_errors, script


def load(out, name):
    return json.loads((out / f"{name}.json").read_text())


def rows(path):
    with open(path) as fh:
        return list(csv.DictReader(fh))


def test_resnet18_uses_head_c1_and_the_resnet_pretraining_budget(tmp_path):
    out = tmp_path / "out"
    # Fewer pre-training images, clients and rounds than smoke's: the test is about the
    # ResNet path and its budget, and ResNet-18 is slow on a CPU.
    script("resnet").main(["--preset", "smoke", "--out", str(out), "--encoders", "resnet18",
                           "--methods", "cp-cfl-simclr", "--set", "data.pretrain_split=train[:256]",
                           "partition.num_clients=3",
                           "federated.rounds=2"])
    record = load(out, "resnet18-trial1-cp-cfl-simclr")
    config = record["config"]
    assert config["federated"]["encoder"] == config["pretrain"]["encoder"] == "resnet18"
    assert config["federated"]["head"] == "c-1"
    assert config["pretrain"]["batch_size"] == 64 and config["pretrain"]["epochs"] == 2
    report = (out / "resnet.md").read_text()
    assert "resnet18, head c-1, best round" in report and "| CP-CFL (SimCLR) |" in report
    assert not (out / "resnet18-trial1-fedavg-none.json").exists()
    assert (out / "accuracy-resnet18.png").exists()


def test_all_runs_the_scripts_and_gathers_every_report(tmp_path, capsys):
    root = tmp_path / "smoke"
    (root / "table2").mkdir(parents=True)
    (root / "table2" / "table2.md").write_text("# Table 2 (earlier)\n\n| a |\n|---|\n")
    (root / "claims.md").write_text("# The paper's claims\n\n| C1 | holds |\n")
    (root / "claims").mkdir()  # a run claims.py --run made: its time is counted too
    (root / "claims" / "seed0-x.json").write_text('{"timing": {"seconds": 120}}')
    script("all").main(["--preset", "smoke", "--out", str(root), "--scripts", "clusters"])
    report = (root / "report.md").read_text()
    assert "## Table 2 (earlier)" in report  # every script's report, a level down
    assert "## Number of clusters (preset `smoke`)" in report
    assert "![accuracy](clusters/accuracy.png)" in report
    assert "| `clusters` | 0 |" in report and "| `table2` | - | 0.0 |" in report
    assert "| `claims` | - | 2.0 |" in report and "`cfl_families`" not in report
    # A table from one seed says under its title that it is one draw of chance.
    clusters = report[report.index("## Number of clusters"):]
    assert clusters.splitlines()[2].startswith("*One seed (0):")
    assert "One seed" not in report[report.index("## Table 2 (earlier)"):
                                    report.index("## Number of clusters")]
    assert "## The paper's claims" in report and "| C1 | holds |" in report  # claims.md
    assert len(list((root / "clusters").glob("cp-cfl-simclr-n*.json"))) == 5

    # tools/results_unchanged.py rebuilds a copy of the tree: nothing changes ...
    check = ["--preset", "smoke", "--results", str(root), "--scripts", "clusters"]
    script("results_unchanged").main(check)
    # ... unless the code would now write a report differently from what is committed.
    (root / "clusters" / "clusters.md").write_text("# Number of clusters (edited)\n")
    with pytest.raises(SystemExit) as status:
        script("results_unchanged").main(check)
    assert status.value.code == 1
    assert "changed clusters/clusters.md" in capsys.readouterr().out


def test_heterogeneity_runs_each_kind_with_its_own_groups(tmp_path):
    out = tmp_path / "out"
    script("heterogeneity").main(["--preset", "smoke", "--out", str(out),
                                  "--methods", "ifca-none,cp-cfl-simclr", "--set", "federated.rounds=2"])
    rotated = load(out, "rotated-4-cp-cfl-simclr")
    assert rotated["config"]["partition"]["kind"] == "rotated"
    assert rotated["config"]["federated"]["num_clusters"] == 4 == len(
        {c["group"] for c in rotated["clients"]})
    assert {c["rotation"] for c in rotated["clients"]} == {0, 90, 180, 270}
    skewed = load(out, "dirichlet-0.1-ifca-none")
    assert skewed["config"]["partition"]["alpha"] == 0.1
    assert run_record_errors(skewed) == []
    assert not (out / "rotated-4-fedavg-none.json").exists()  # not among --methods
    assert len(rows(out / "heterogeneity.csv")) == 6
    assert "Dir(0.1), 3 groups" in (out / "heterogeneity.md").read_text()


def test_cfl_families_pairs_each_family_by_seed_and_judges_the_difference(tmp_path):
    families = script("cfl_families")
    out = tmp_path / "out"
    readme = Path(__file__).parents[1] / "results" / "README.md"
    before = readme.read_bytes()
    rows_ = "pacfl-none,pacfl-simclr,cp-cfl-simclr,ifca-none"
    families.main(["--preset", "smoke", "--out", str(out), "--trials", "2", "--methods", rows_,
                   "--set", "federated.rounds=2"])
    table = rows(out / "cfl_families.csv")
    assert sorted((r["run"], r["seed"]) for r in table) == sorted(
        (name, seed) for name in rows_.split(",") for seed in ("0", "1"))
    pacfl = {r["seed"]: r for r in table if r["run"].startswith("pacfl")}
    assert all(int(r["bytes_other"]) > 0 for r in pacfl.values())
    from cpcfl_tf.evidence.judge import t_interval

    acc = {(r["run"], r["seed"]): 100 * float(r["accuracy"]) for r in table}
    diffs = [acc["cp-cfl-simclr", s] - acc["ifca-none", s] for s in ("0", "1")]
    low, high = t_interval(diffs)
    effect = "helps" if low > 0 else "hurts" if high < 0 else "no difference shown"
    report = (out / "cfl_families.md").read_text()
    assert (f"| IFCA (CP-CFL) | 2 | {np.mean(diffs):+.2f} | {min(diffs):+.2f} .. "
            f"{max(diffs):+.2f} | [{low:+.2f}, {high:+.2f}] | {effect} |") in report
    assert "| PACFL | 2 |" in report and "| FeSEM |" not in report  # rows not asked for
    assert (out / "accuracy.png").stat().st_size > 0 and (out / "ari.png").exists()
    # a run elsewhere, of a subset, leaves the committed README's table alone
    assert readme.read_bytes() == before


def test_families_take_runs_this_machine_would_repeat_bit_for_bit_from_the_tree(
        tmp_path, monkeypatch, capsys):
    import cpcfl_tf.clustered.simulator as simulator

    families = script("cfl_families")
    monkeypatch.chdir(tmp_path)
    tree = Path("results") / "smoke"  # the kit's own tree, as the scripts write it
    argv = ["--preset", "smoke", "--trials", "2", "--methods", "ifca-none,cp-cfl-simclr",
            "--set", "federated.rounds=2"]
    families.main(argv + ["--out", str(tree / "trials")])  # stands for another script's runs
    made = {p.name: json.loads(p.read_text()) for p in (tree / "trials").glob("seed*.json")}
    assert len(made) == 4
    capsys.readouterr()
    with pytest.raises(SystemExit):  # the dry run says where each run would come from
        families.main(argv + ["--out", str(tree / "families"), "--dry-run"])
    assert f"seed1-cp-cfl-simclr: found: {tree / 'trials' / 'seed1-cp-cfl-simclr.json'}" in \
        capsys.readouterr().out

    real = simulator.run_federated
    monkeypatch.setattr(simulator, "run_federated", lambda *a, **k: pytest.fail("ran again"))
    families.main(argv + ["--out", str(tree / "report"), "--report"])  # --report counts them
    partial = (tree / "report" / "cfl_families.md").read_text()
    assert "partial" not in partial and "4 of these runs were taken from" in partial
    families.main(argv + ["--out", str(tree / "families")])  # into the tree: taken from it
    assert not list((tree / "families").glob("seed*.json"))  # used where they are
    report = (tree / "families" / "cfl_families.md").read_text()
    assert f"4 of these runs were taken from `{tree / 'trials'}`" in report
    with pytest.raises(pytest.fail.Exception, match="ran again"):  # a reproducer's --out
        families.main(argv + ["--out", "mine"])

    # another kind of machine, or another starting encoder: that run is made here
    moved = made["seed1-ifca-none.json"]
    moved["environment"]["cpu"] = "another CPU"
    (tree / "trials" / "seed1-ifca-none.json").write_text(json.dumps(moved))
    other = made["seed0-cp-cfl-simclr.json"]
    other["environment"]["starting_encoder"] = "0" * 16
    (tree / "trials" / "seed0-cp-cfl-simclr.json").write_text(json.dumps(other))
    monkeypatch.setattr(simulator, "run_federated", real)
    families.main(argv + ["--out", "again", "--reuse", str(tree)])
    assert sorted(p.name for p in Path("again").glob("seed*.json")) == [
        "seed0-cp-cfl-simclr.json", "seed1-ifca-none.json"]
    assert json.loads(Path("again", "seed1-ifca-none.json").read_text())["rounds"] == \
        made["seed1-ifca-none.json"]["rounds"]  # and comes out the same
    with pytest.raises(UserError, match="--reuse"):
        families.main(argv + ["--out", "x", "--reuse", "none"])


def test_a_report_elsewhere_takes_the_runs_its_folders_taken_json_names(
        tmp_path, monkeypatch):
    # A folder that took runs from the tree names them in taken.json; --report on another
    # machine, or without the encoders cached, takes them from there and says so. A named
    # record that no longer holds the run's config is not taken.
    import cpcfl_tf.clustered.simulator as simulator

    families = script("cfl_families")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CPCFL_CACHE", str(tmp_path / "cache"))
    tree = Path("results") / "smoke"
    argv = ["--preset", "smoke", "--trials", "2", "--set", "federated.rounds=2",
            "--methods", "fedavg-simclr,ifca-none,cp-cfl-simclr"]
    families.main(argv[:-2] + ["--out", str(tree / "trials"),
                               "--methods", "ifca-none,cp-cfl-simclr"])
    families.main(argv + ["--out", str(tree / "families")])
    assert sorted(p.name for p in (tree / "families").glob("seed*.json")) == [
        "seed0-fedavg-simclr.json", "seed1-fedavg-simclr.json"]  # the rest taken
    taken = json.loads((tree / "families" / "taken.json").read_text())
    assert taken == {f"seed{k}-{run}": str(tree / "trials" / f"seed{k}-{run}.json")
                     for k in (0, 1) for run in ("ifca-none", "cp-cfl-simclr")}
    table = (tree / "families" / "cfl_families.csv").read_text()

    for path in tree.rglob("seed*.json"):  # as if the tree came from another machine
        record = json.loads(path.read_text())
        record["environment"]["cpu"] = "another CPU"
        path.write_text(json.dumps(record))
    shutil.rmtree(tmp_path / "cache")
    monkeypatch.setattr(simulator, "run_federated", lambda *a, **k: pytest.fail("ran"))
    families.main(argv + ["--out", str(tree / "families"), "--report"])
    report = (tree / "families" / "cfl_families.md").read_text()
    assert "partial" not in report and (tree / "families" / "cfl_families.csv").read_text() == table
    assert (f"4 of these runs were taken from `{tree / 'trials'}` as the folder's `taken.json` "
            "names them") in report and "this machine would make them" not in report

    changed = json.loads((tree / "trials" / "seed1-ifca-none.json").read_text())
    changed["config"]["federated"]["rounds"] = 3
    (tree / "trials" / "seed1-ifca-none.json").write_text(json.dumps(changed))
    families.main(argv + ["--out", str(tree / "families"), "--report"])
    report = (tree / "families" / "cfl_families.md").read_text()
    assert "(partial: 5 of 6 runs)" in report and "seed 1: ifca-none" in report
    for damaged in ("[", "[]"):  # one line naming the fix, nothing written
        (tree / "families" / "taken.json").write_text(damaged)
        with pytest.raises(UserError, match=r"taken.json is (not valid JSON|damaged).*; "
                                            r"restore it \(git checkout\) or delete it"):
            families.main(argv + ["--out", str(tree / "families"), "--report"])
        assert (tree / "families" / "cfl_families.md").read_text() == report


def test_the_cpu_id_tells_a_cpu_within_its_kind():
    from cpcfl_tf.records.environment import cpu_id, environment, machine

    here = environment()
    assert here["cpu_id"] == cpu_id()
    if cpu_id() is not None:  # Linux
        assert cpu_id().startswith("family ") and " flags " in cpu_id()
        assert machine(here) == f"{here['cpu']} [{here['cpu_id']}]"
    assert machine({"cpu": "X"}) == "X" and machine({}) is None  # older records


def test_the_blas_kernels_numpy_picked_are_recorded_and_an_override_shows():
    import os
    import platform
    import subprocess
    import sys

    from cpcfl_tf.records.environment import blas_kernels, environment

    kernels = blas_kernels()
    assert environment()["blas"] == kernels
    if kernels is None or not kernels.startswith("openblas") or platform.machine() != "x86_64":
        pytest.skip("numpy's BLAS is not OpenBLAS on x86-64 here")
    ask = "from cpcfl_tf.records.environment import blas_kernels; print(blas_kernels())"
    other = "Sandybridge" if kernels.split()[-1] != "Sandybridge" else "Haswell"
    forced = subprocess.run([sys.executable, "-c", ask], capture_output=True, text=True,
                            env={**os.environ, "OPENBLAS_CORETYPE": other}, check=True)
    assert forced.stdout.split()[-1] == other  # what the run used, not what the CPU is


def test_clustering_reliability_counts_rates_shares_encoders_and_explains_merges(tmp_path):
    from cpcfl_tf.evidence.judge import clopper_pearson
    from cpcfl_tf.records.record import read_record

    from cpcfl_tf.evidence import reliability as study
    from cpcfl_tf.evidence import reliability_report as sentences

    reliability = script("clustering_reliability")
    out = tmp_path / "out"
    readme = Path(__file__).parents[1] / "results" / "README.md"
    before = readme.read_bytes()
    reliability.main(["--preset", "smoke", "--out", str(out), "--runs", "2", "--encoders", "1",
                      "--set", "federated.rounds=3"])
    records = {p.stem: read_record(p) for p in out.glob("run*.json")}
    # T = 3 ends before CP-CFL+restart's failure test (round Tc + 10): its runs are
    # CP-CFL's, taken, not made again, and the report says so
    assert sorted(records) == sorted(f"run{r}-{m}" for r in range(2)
                                     for m in ("cp-cfl-simclr", "ifca-none",
                                               "cp-cfl-features-simclr"))
    # CP-CFL+features: CP-CFL's Tc round, then the server's first choice; its clients'
    # mean embeddings counted once, in bytes_other
    for r in range(2):
        remedy, plain = records[f"run{r}-cp-cfl-features-simclr"], records[f"run{r}-cp-cfl-simclr"]
        assert remedy.rounds[0].cluster_ids == plain.rounds[0].cluster_ids
        assert remedy.final.bytes_other > 0 == plain.final.bytes_other
        assert remedy.final.bytes_up == plain.final.bytes_up + remedy.final.bytes_other
    for r in range(2):
        records[f"run{r}-cp-cfl-restart-simclr"] = records[f"run{r}-cp-cfl-simclr"]
    # run 1 shares run 0's encoder, with its own partition and training seed
    shared, own = records["run1-cp-cfl-simclr"], records["run0-cp-cfl-simclr"]
    assert shared.config.pretrain_seed == 0 and shared.seeds == {"data": 1, "train": 1}
    assert shared.environment["starting_encoder"] == own.environment["starting_encoder"]
    assert records["run1-ifca-none"].config.pretrain.seed is None  # no encoder to share
    # the diagnostic: from round Tc + 1 = 2 on, for CP-CFL; from round 1 for IFCA
    assert [r.selection is not None for r in own.rounds] == [False, True, True]
    assert all(r.selection is not None for r in records["run0-ifca-none"].rounds)
    summary = json.loads((out / "clustering_reliability.json").read_text())
    for name, method in summary["methods"].items():
        found = sum(records[f"run{r}-{name}"].final.ari == 1.0 for r in range(2))
        assert (method["found"], method["runs"]) == (found, 2)
        assert method["ci95"] == pytest.approx(list(clopper_pearson(found, 2)))
    # the remedies paired by run in ending with the true groups: 1 or 0 per run, each
    groups = summary["links"][study.GROUPS_LINK]
    assert groups["per_seed"] == {str(r): float(
        records[f"run{r}-cp-cfl-features-simclr"].final.ari == 1.0) - float(
        records[f"run{r}-cp-cfl-restart-simclr"].final.ari == 1.0) for r in range(2)}
    # the first choice (round Tc + 1 = 2): how many clients chose their round-1 pick
    first, plain = summary["first_choices"], [records[f"run{r}-cp-cfl-simclr"] for r in range(2)]
    assert first["chose_last_pick"] == sum(
        int(np.sum(np.array(r.rounds[1].cluster_ids) == r.rounds[0].cluster_ids)) for r in plain)
    assert (first["runs"], first["clients"], first["chance"]) == (2, 18, pytest.approx(1 / 3))
    assert first["accuracy_round_tc"] == pytest.approx(np.mean([r.rounds[0].accuracy
                                                                for r in plain]))
    assert first["uniform_loss"] == pytest.approx(np.log(len(
        {k for c in plain[0].clients for k in c["train_class_counts"]})))
    report = (out / "clustering_reliability.md").read_text()
    assert "| CP-CFL+restart (SimCLR) |" in report and "C4, clustering failures" in report
    assert ("2 runs of CP-CFL+restart are CP-CFL's runs of the same config: its restart rule "
            "never fired in them") in report
    assert "\n".join(["What it shows (written from the tables above):", "",
                      *(f"- {line}" for line in sentences.findings(summary))]) in report
    assert summary["table"][-1] == f"- {sentences.findings(summary)[-1]}"  # README's block
    merged = [n for n, r in records.items() if r.final.ari < 1]
    for name in merged:  # every run that missed the groups is listed, with its margins
        index = name.split("-")[0][3:]
        assert f"| {index} |" in report
    assert (out / "margins.png").stat().st_size > 0
    # a figure for each that merged and chose by loss at round Tc + 1 (CP-CFL+features'
    # first choice is the server's: nothing to draw)
    assert {p.stem for p in (out / "figures").glob("*.png")} >= {
        n for n in merged if "features" not in n}
    assert readme.read_bytes() == before  # a run elsewhere leaves the committed README
    # --report: no run made, the table over the finished runs, headed partial
    made = {p.name: p.read_bytes() for p in out.glob("run*.json")}
    reliability.main(["--preset", "smoke", "--out", str(out), "--runs", "3", "--encoders", "1",
                      "--set", "federated.rounds=3", "--report"])
    assert {p.name: p.read_bytes() for p in out.glob("run*.json")} == made
    partial = (out / "clustering_reliability.md").read_text()
    assert "**Partial: 8 of 12 runs.**" in partial and "`run2-cp-cfl-simclr`" in partial
    assert json.loads((out / "clustering_reliability.json").read_text())["missing"] == [
        f"run2-{name}" for name in reliability.ROWS]
    # tools/plot_selection.py draws any diagnosed record; a record without the diagnostic,
    # or a path that is none, stops it before it draws anything
    plot = script("plot_selection")
    drawn = plot.main([str(out / "run0-ifca-none.json"), "--out", str(tmp_path / "fig")])
    assert [p.name for p in drawn] == ["run0-ifca-none.png"] and drawn[0].stat().st_size > 0
    bare = json.loads((out / "run0-cp-cfl-simclr.json").read_text())
    for r in bare["rounds"]:
        r.pop("selection", None)
    (tmp_path / "bare.json").write_text(json.dumps(bare))
    for args, said in (([str(tmp_path / "bare.json")], "has no selection diagnostic: make "
                        "the run with --diagnose K"),
                       ([str(tmp_path / "nowhere.json")], "is not a file: pass the .json")):
        with pytest.raises(UserError, match=said):
            plot.main([str(out / "run1-ifca-none.json"), *args, "--out", str(tmp_path / "no")])
    assert not (tmp_path / "no").exists()


def test_what_the_reliability_study_shows_is_written_from_its_summary():
    from cpcfl_tf.evidence import reliability_report as reliability

    def method(found, runs, acc_found, acc_not, merged_from=(), restarts=0, mb=100.0):
        from cpcfl_tf.evidence.judge import clopper_pearson
        return {"found": found, "runs": runs, "ci95": list(clopper_pearson(found, runs)),
                "restarts": restarts, "runs_restarted": min(restarts, runs), "megabytes": mb,
                "accuracy_found": acc_found, "accuracy_not_found": acc_not,
                "merges_final_from": list(merged_from)}

    summary = {"first_choice_round": 11,
               "methods": {"cp-cfl-simclr": method(3, 4, [93.0, 93.0, 93.0], [85.0],
                                                   merged_from=[11]),
                           "ifca-none": method(4, 4, [91.0] * 4, []),
                           "cp-cfl-restart-simclr": method(4, 4, [93.0] * 4, [], restarts=1,
                                                           mb=110.0)},
               "links": {"cp-cfl-simclr - ifca-none": {"verdict": "not shown"},
                         "cp-cfl-restart-simclr - cp-cfl-simclr": {"verdict": "not shown"},
                         "cp-cfl-restart-simclr - ifca-none": {"verdict": "holds"},
                         "C4": {"verdict": "opposite"}},
               "margins": {"found": {"median": 0.05, "quartiles": [0.03, 0.07]},
                           "merged groups": {"median": 0.02, "quartiles": [0.01, 0.03]}},
               "rescued": {"missed": 1, "found_by_restart": 1},
               "first_choices": {"runs": 4, "accuracy_round_tc": 0.25, "pool_loss": 2.2,
                                 "uniform_loss": 2.302585, "chose_last_pick": 30, "clients": 60,
                                 "last_pick_rate": 0.5, "last_pick_ci95": [0.4, 0.6],
                                 "chance": 1 / 3}}
    assert reliability.findings(summary) == [
        "CP-CFL (SimCLR) ends with the true groups in 3 of 4 runs (75 %, 95 % interval "
        "19-99 %); its runs without them end 8.00 points below those with them (means).",
        "IFCA (None) ends with the true groups in 4 of 4 runs (100 %, 95 % interval 40-100 %).",
        "CP-CFL+restart (SimCLR) ends with the true groups in 4 of 4 runs (100 %, 95 % "
        "interval 40-100 %).",
        "Of CP-CFL (SimCLR)'s 1 merge, 1 was final from its first choice by loss (round Tc + 1 "
        "= 11) on; at that choice the merged groups' clients had a median margin of 0.0200, "
        "against 0.0500 (middle half 0.0300-0.0700) in the runs that found the groups: smaller "
        "than three quarters of those, so near-equal losses over the pool let two groups "
        "settle on one model.",
        "At that first choice CP-CFL's heads had trained for Tc rounds on random picks and were "
        "still weak: round Tc's accuracy was 25.0 % and the clients' mean loss on the pool "
        "2.200, against 2.303 for a uniform guess over the classes; the clients chose the model "
        "they had trained in round Tc in 50 % of cases (95 % interval over runs 40-60 %, chance "
        "33 %), more often than chance: the last random pick pulls the first choice.",
        "CP-CFL+restart restarted in 1 of 4 runs (1 restart) and ended with the true groups in "
        "1 of the 1 runs CP-CFL (SimCLR) merged, sending 10.0% more bytes than CP-CFL (SimCLR) "
        "(means); in accuracy it is not told apart from CP-CFL (SimCLR) and ahead of IFCA "
        "(None) by the claims' rule.",
        "CP-CFL (SimCLR) is not told apart from IFCA (None) in accuracy by the claims' rule "
        "over these runs; C4's link (IFCA (None) fails to cluster more often than CP-CFL): "
        "opposite."]
    assert reliability.remedy_lines(summary) == []  # one remedy only: no advice
    # With CP-CFL+features: its line, and which remedy to use, from the numbers.
    summary["preset"], summary["runs"] = "quick", 4
    summary["rounds"] = {"cp-cfl-restart-simclr": 45.0, "cp-cfl-features-simclr": 40.0}
    summary["methods"]["cp-cfl-features-simclr"] = method(4, 4, [93.5] * 4, [], mb=100.5)
    summary["rescued_by_features"] = {"missed": 1, "found_by_restart": 1}
    summary["links"]["cp-cfl-features-simclr - cp-cfl-simclr"] = {"verdict": "holds"}
    summary["links"]["cp-cfl-features-simclr - cp-cfl-restart-simclr"] = {"verdict": "not shown"}
    assert reliability.findings(summary)[7] == (
        "CP-CFL+features trained 40 rounds in every run (no restart, no round added) and ended "
        "with the true groups in 1 of the 1 runs CP-CFL (SimCLR) merged, sending 0.50% more "
        "bytes than CP-CFL (SimCLR) (its clients' mean embeddings, once); in accuracy it is "
        "ahead of CP-CFL (SimCLR) and not told apart from CP-CFL+restart (SimCLR) by the "
        "claims' rule.")
    groups = "found: cp-cfl-features-simclr - cp-cfl-restart-simclr"
    summary["links"][groups] = {"verdict": "not shown"}
    facts = ("CP-CFL+features ends with the true groups in {} of 4 runs and CP-CFL+restart in "
             "4 of 4; paired by run, CP-CFL+features is {} in ending with them and {} in "
             "accuracy by the claims' rule; CP-CFL+restart trained 45.0 rounds on average and "
             "sent 110 MB, CP-CFL+features 40.0 rounds and 100 MB.")
    head = "Which remedy to use (beyond the paper, preset quick, 4 runs): "
    level = "not told apart from CP-CFL+restart"
    assert reliability.remedy_lines(summary) == [
        head + "CP-CFL+features, because the two are not told apart in accuracy or in how "
        "often they end with the true groups by the claims' rule, and it costs no more rounds "
        "or bytes. " + facts.format(4, level, "not told apart from it")]
    summary["links"]["cp-cfl-features-simclr - cp-cfl-restart-simclr"] = {"verdict": "opposite"}
    assert reliability.remedy_lines(summary) == [
        head + "CP-CFL+restart, because it is ahead in accuracy by the claims' rule. "
        + facts.format(4, level, "behind it")]
    # One merge more in CP-CFL+features, not told apart by the rule: the cheaper still, and
    # the other named as the safer; told apart, the one that ends with the groups.
    summary["links"]["cp-cfl-features-simclr - cp-cfl-restart-simclr"] = {"verdict": "not shown"}
    summary["methods"]["cp-cfl-features-simclr"]["found"] = 3
    assert reliability.remedy_lines(summary)[0].endswith(
        "100 MB. Where a run that ends with two groups on one model would be costly, "
        "CP-CFL+restart is the safer of the two: it ended with the true groups in 4 of 4 runs "
        "here, CP-CFL+features in 3, a difference the claims' rule does not tell apart.")
    summary["links"][groups] = {"verdict": "opposite"}
    assert reliability.remedy_lines(summary) == [
        head + "CP-CFL+restart, because the two are not told apart in accuracy by the claims' "
        "rule, and it ends with the true groups more often by the same rule. "
        + facts.format(3, "behind CP-CFL+restart", "not told apart from it")]
    summary["rounds"]["cp-cfl-features-simclr"] = 46.0  # dearer and level: CP-CFL+restart
    summary["methods"]["cp-cfl-features-simclr"]["found"] = 4
    summary["links"][groups] = {"verdict": "not shown"}
    assert reliability.remedy_lines(summary)[0].startswith(
        head + "CP-CFL+restart, because the two are not told apart in accuracy or in how often "
        "they end with the true groups by the claims' rule, and it costs fewer rounds or bytes.")
    # Each remedy's worst run against CP-CFL and the runs where it merged groups CP-CFL
    # found (the quick study's case: features lost them once, restart never): shown, and
    # weighed beside the choice.
    summary["worst"] = {
        "cp-cfl-restart-simclr": {"run": 7, "difference": 0.0, "merged_where_plain_found": []},
        "cp-cfl-features-simclr": {"run": 49, "difference": -12.0,
                                   "merged_where_plain_found": [{"run": 49,
                                                                 "difference": -12.0}]}}
    worst = ("Worst runs, paired by run: CP-CFL+restart's worst run against CP-CFL (SimCLR) "
             "is run 7 (+0.00 points), and it merged groups CP-CFL (SimCLR) found in no run; "
             "CP-CFL+features's worst run against CP-CFL (SimCLR) is run 49 (-12.00 points), "
             "and it merged groups CP-CFL (SimCLR) found in run 49 (-12.00 points).")
    assert worst in reliability.findings(summary)
    summary["rounds"]["cp-cfl-features-simclr"] = 40.0  # cheaper and level: features chosen
    advice = reliability.remedy_lines(summary)[0]
    assert advice.startswith(head + "CP-CFL+features, because")
    assert advice.endswith(
        worst + " So CP-CFL+features costs nothing on average but once lost what CP-CFL "
        "(SimCLR) had, which CP-CFL+restart never did: a user who weighs the worst run above "
        "the mean, or runs only a few times, should take CP-CFL+restart.")
    del summary["worst"]
    del summary["methods"]["cp-cfl-features-simclr"]
    summary["first_choices"]["last_pick_ci95"] = [0.2, 0.45]
    assert reliability.findings(summary)[4].endswith(
        "no more often than chance: the last random pick does not decide the first choice.")
    summary["margins"]["merged groups"]["median"] = 0.04  # inside the found runs' middle half
    assert ("margin of 0.0400, against 0.0500 (middle half 0.0300-0.0700) in the runs that "
            "found the groups: not among the smallest, so a merge is not a near tie between "
            "models but one model the best for two groups.") in reliability.findings(summary)[3]
    from cpcfl_tf.plan.presets import get_preset

    assert reliability.verdict_line(get_preset("standard"), summary) == (
        "Beyond the paper (60 clients, T = 100, `experiments/clustering_reliability.py`): runs "
        "ending with the true groups, with the 95 % interval: CP-CFL (SimCLR) 3 of 4 (19-99 %); "
        "IFCA (None) 4 of 4 (40-100 %); CP-CFL+restart (SimCLR) 4 of 4 (40-100 %). Accuracy, "
        "paired by run: CP-CFL+restart (SimCLR) − CP-CFL (SimCLR): not shown; CP-CFL (SimCLR) "
        "− IFCA (None): not shown.")


@pytest.mark.parametrize("args,message", [(["--runs", "1"], "--runs must be >= 2"),
                                          (["--encoders", "9"], "--encoders in [1, runs]")])
def test_clustering_reliability_refuses_impossible_counts_before_writing(tmp_path, args,
                                                                          message):
    with pytest.raises(UserError, match=re.escape(message)):
        script("clustering_reliability").main(["--preset", "smoke", "--out",
                                               str(tmp_path / "out"), *args])
    assert not (tmp_path / "out").exists()


def test_a_partial_reliability_report_counts_every_named_method_and_how_to_resume(tmp_path):
    """--methods naming all four rows on quick (whose default leaves CP-CFL+features out)
    gives all four, and the partial report's command makes the same study."""
    study = script("clustering_reliability")
    out, rows = tmp_path / "out", ",".join(study.ROWS)
    study.main(["--preset", "quick", "--runs", "2", "--encoders", "1", "--out", str(out),
                "--report", "--methods", rows])
    report = (out / "clustering_reliability.md").read_text()
    assert "**Partial: 0 of 8 runs.**" in report  # 2 runs of each of the 4 named
    assert (f"`python experiments/clustering_reliability.py --preset quick --runs 2 --encoders 1 "
            f"--out {out} --methods {rows} --resume` makes the rest") in report
    assert not list(out.glob("*.json"))[1:]  # no run made: the summary alone


def test_reliability_runs_are_made_encoder_by_encoder(tmp_path, capsys):
    """Runs sharing an encoder are made one after another (0, 2, then 1, 3 with two
    encoders), each method of a run in the table's order; nothing is made by a dry run."""
    study = script("clustering_reliability")
    with pytest.raises(SystemExit):
        study.main(["--preset", "quick", "--runs", "4", "--encoders", "2", "--out",
                    str(tmp_path / "out"), "--methods", "cp-cfl-simclr,ifca-none",
                    "--dry-run"])
    made = [line.split(":")[0].strip() for line in capsys.readouterr().out.splitlines()
            if line.startswith("  run")]
    assert made == [f"run{r}-{m}" for r in (0, 2, 1, 3) for m in ("cp-cfl-simclr", "ifca-none")]
    assert not (tmp_path / "out").exists()


def test_cfl_families_report_of_a_partial_folder_says_so_and_names_the_missing_runs(
        tmp_path):
    families = script("cfl_families")
    out = tmp_path / "out"
    families.main(["--preset", "smoke", "--out", str(out), "--trials", "2", "--methods",
                   "fedavg-none", "--set", "federated.rounds=2"])
    planted = json.loads((out / "seed1-fedavg-none.json").read_text())  # from elsewhere
    planted["environment"]["cpu_id"] = "family 1 model 2; flags 00000000"
    (out / "seed1-fedavg-none.json").write_text(json.dumps(planted))
    before = {p.name: p.read_bytes() for p in out.glob("*.json")}
    families.main(["--preset", "smoke", "--out", str(out), "--trials", "2", "--methods",
                   "fedavg-none,ifca-none", "--set", "federated.rounds=2", "--report"])
    assert {p.name: p.read_bytes() for p in out.glob("*.json")} == before  # no run made
    report = (out / "cfl_families.md").read_text()
    assert "(partial: 2 of 4 runs)" in report
    assert ("Missing (2): seeds 0, 1: every run" not in report
            and "seed 0: ifca-none; seed 1: ifca-none" in report)
    assert (f"`python experiments/cfl_families.py --preset smoke --out {out} --trials 2 "
            "--methods fedavg-none,ifca-none --set federated.rounds=2 --resume` makes them"
            ) in report
    assert "| FedAvg (None) | 2 |" in report and "IFCA (None)" not in report
    assert "these 2 runs come from 2 kinds of CPU" in report  # as a pass making them says


def test_a_study_updates_the_results_readme_only_from_the_kits_own_folder(tmp_path,
                                                                           monkeypatch):
    import argparse

    from cpcfl_tf.plan.presets import get_preset
    from cpcfl_tf.running.script import Session

    monkeypatch.chdir(tmp_path)
    readme = Path("results", "README.md")
    readme.parent.mkdir()
    readme.write_text("head\n<!-- study:smoke -->\nold\n<!-- /study -->\ntail\n")
    config = get_preset("smoke")
    elsewhere = Session("study", argparse.Namespace(), config, tmp_path / "mine")
    elsewhere.update_readme("study", ["new"], "tables")
    assert "old" in readme.read_text()  # a reproducer's --out leaves it alone
    own = Session("study", argparse.Namespace(), config, Path("results", "smoke", "study"))
    own.update_readme("study", ["new"], "tables")
    assert readme.read_text() == "head\n<!-- study:smoke -->\nnew\n<!-- /study -->\ntail\n"


def test_the_reliability_study_pairs_only_runs_from_the_same_encoder_bits():
    # An encoder pre-trained on another kind of machine has other bits: its run is not the
    # same experiment as one from the committed encoder, and is left out of the pairs.
    from types import SimpleNamespace

    from cpcfl_tf.evidence import reliability

    def run(pretraining, bits):
        return SimpleNamespace(pretraining=pretraining, from_random_weights=pretraining == "none",
                               environment={"starting_encoder": bits})

    a = {0: run("simclr", "aa"), 1: run("simclr", "bb"), 2: run("simclr", "cc"),
         3: run("simclr", "dd")}
    b = {0: run("simclr", "aa"), 1: run("simclr", "xx"), 2: run("none", "random")}
    kept, left = reliability.comparable(a, b)
    assert sorted(kept) == [0, 2, 3] and left == 1  # run 3 has no partner: not counted


def test_a_remedys_worst_run_and_its_merges_are_paired_by_run():
    """worst_against_plain by hand: three runs of CP-CFL and of a remedy, same encoder;
    the remedy's differences +1, -12, 0 points; in run 1 the remedy lost the groups CP-CFL
    found, in run 2 both found them; a run of another encoder is left out."""
    from types import SimpleNamespace

    from cpcfl_tf.evidence import reliability

    def run(accuracy, ari, encoder="e"):
        return SimpleNamespace(final=SimpleNamespace(accuracy=accuracy, ari=ari),
                               final_accuracy=accuracy,
                               pretraining="simclr", from_random_weights=False,
                               environment={"starting_encoder": encoder})

    plain = {0: run(0.80, 0.5), 1: run(0.92, 1.0), 2: run(0.90, 1.0), 3: run(0.5, 1.0)}
    remedy = {0: run(0.81, 1.0), 1: run(0.80, 0.6), 2: run(0.90, 1.0), 3: run(0.1, 0.2, "x")}
    worst = reliability.worst_against_plain({"cp-cfl-simclr": plain,
                                             "cp-cfl-features-simclr": remedy},
                                            "cp-cfl-features-simclr")
    assert worst["run"] == 1 and worst["difference"] == pytest.approx(-12.0)
    assert [(m["run"], round(m["difference"], 6)) for m in worst["merged_where_plain_found"]] \
        == [(1, -12.0)]
    assert reliability.worst_against_plain({"cp-cfl-simclr": plain}, "cp-cfl-features-simclr") \
        is None


def test_personalization_judges_cp_cfl_against_each_rival_by_seed_on_both_partitions(tmp_path):
    """experiments/personalization.py: CP-CFL (SimCLR) minus FedPer from each start, per
    seed, on label-skew and rotated groups; the link's line worked out here from the csv
    by the claims' rule, what is kept counted, the sentence read off the verdicts."""
    study = script("personalization")
    out = tmp_path / "out"
    readme = Path(__file__).parents[1] / "results" / "README.md"
    before = readme.read_bytes()
    study.main(["--preset", "smoke", "--out", str(out), "--trials", "2", "--rivals", "fedper",
                "--set", "federated.rounds=2"])
    table = rows(out / "personalization.csv")
    assert sorted((r["partition"], r["run"], r["seed"]) for r in table) == sorted(
        (part, name, seed) for part in ("label-skew", "rotated")
        for name in ("cp-cfl-simclr", "fedper-simclr", "fedper-none") for seed in ("0", "1"))
    assert all((int(r["bytes_kept"]) > 0) == r["run"].startswith("fedper") for r in table)
    from cpcfl_tf.evidence.judge import seeds_needed, t_interval

    report = (out / "personalization.md").read_text()
    acc = {(r["partition"], r["run"], r["seed"]): 100 * float(r["accuracy"]) for r in table}
    said, beaten = {}, {}
    for part in ("label-skew", "rotated"):
        diffs = [acc[part, "cp-cfl-simclr", s] - acc[part, "fedper-none", s] for s in "01"]
        low, high = t_interval(diffs)
        wins = "clustering" if low > 0 else "personalization" if high < 0 else "not told apart"
        needed = seeds_needed(diffs) if wins == "not told apart" else None
        assert (f"| CP-CFL (SimCLR) − FedPer (None) | 2 | {np.mean(diffs):+.2f} | "
                f"{min(diffs):+.2f} .. {max(diffs):+.2f} | at most {high:+.2f}, at least "
                f"{low:+.2f} | {wins} | {needed if needed is not None else '-'} |") in report
        assert f"## {part}" in report
        said[part] = wins
        other = [acc[part, "cp-cfl-simclr", s] - acc[part, "fedper-simclr", s] for s in "01"]
        beaten[part] = t_interval(other)[1] < 0 or wins == "personalization"
    assert readme.read_bytes() == before  # a subset, elsewhere: the README is left alone
    # README's sentences (written when the whole study is there), from the same verdicts
    from argparse import Namespace

    from cpcfl_tf.records.record import read_record

    runs = {}
    for path in out.glob("seed*.json"):
        seed, rest = path.stem.split("-", 1)
        part = "rotated" if rest.startswith("rotated") else "label-skew"
        runs.setdefault(f"{part}/{rest[len(part) + 1:]}", {})[int(seed[4:])] = read_record(path)
    sentences = study.summary_sentences(
        runs, Namespace(partitions=["label-skew", "rotated"], rivals=["fedper"]))
    for line, part in zip(sentences, ("label-skew", "rotated")):
        assert line.startswith(f"- {part}: CP-CFL (SimCLR) — ")
        segment = next(s for s in line.split(" — ")[1].split("; ") if "FedPer (None)" in s)
        assert segment.startswith("not told apart from" if said[part] == "not told apart"
                                  else f"{said[part]} against")
        assert line.endswith("; personalization wins against none.") == (not beaten[part])


def test_personalizations_two_strongest_rivals_are_named_from_the_links_by_hand(monkeypatch):
    """strongest(): the mean of each rival's links (CP-CFL minus it, per seed) over both
    partitions and starts, smallest first, worked by hand; the line names them and the
    standard preset's command, and the standard preset's own report names none."""
    from types import SimpleNamespace

    study = script("personalization")

    def by_seed(*accs):
        return {s: SimpleNamespace(final_accuracy=a) for s, a in enumerate(accs)}

    runs = {"label-skew/cp-cfl-simclr": by_seed(0.90, 0.92), "rotated/cp-cfl-simclr":
            by_seed(0.70, 0.74)}
    # points, CP-CFL minus the rival, per link (label-skew SimCLR, None | rotated SimCLR,
    # None), each the same on both seeds: fedper +1, +3 | +5, +6: mean 3.75; ditto +0, +2 |
    # +9, +9: 5; fedrep +4 everywhere: 4; lg-fedavg only on label-skew, +3.5 twice: 3.5.
    acc = {"fedper": [(0.89, 0.91), (0.87, 0.89), (0.65, 0.69), (0.64, 0.68)],
           "ditto": [(0.90, 0.92), (0.88, 0.90), (0.61, 0.65), (0.61, 0.65)],
           "fedrep": [(0.86, 0.88), (0.86, 0.88), (0.66, 0.70), (0.66, 0.70)],
           "lg-fedavg": [(0.865, 0.885), (0.865, 0.885)]}
    for method, rows_ in acc.items():
        for (part, start), pair in zip([("label-skew", "simclr"), ("label-skew", "none"),
                                        ("rotated", "simclr"), ("rotated", "none")], rows_):
            runs[f"{part}/{method}-{start}"] = by_seed(*pair)
    rivals, parts = ["fedper", "ditto", "fedrep", "lg-fedavg"], ["label-skew", "rotated"]
    assert study.strongest(runs, rivals, parts) == ["lg-fedavg", "fedper"]
    assert study.strongest(runs, rivals, parts, k=4) == ["lg-fedavg", "fedper", "fedrep",
                                                         "ditto"]
    args = SimpleNamespace(rivals=rivals, partitions=parts)
    (line,) = study.strongest_line(runs, SimpleNamespace(preset="quick"), args)
    assert ": LG-FedAvg and FedPer." in line
    assert line.endswith("`python experiments/personalization.py --preset standard --rivals "
                         "lg-fedavg,fedper --resume` (its default, `STANDARD_RIVALS`, is "
                         "FedPer and Ditto).")
    assert study.strongest_line(runs, SimpleNamespace(preset="standard"), args) == []
    # Where they are the standard preset's default, its command needs no --rivals.
    monkeypatch.setattr(study, "STANDARD_RIVALS", ("lg-fedavg", "fedper"))
    (line,) = study.strongest_line(runs, SimpleNamespace(preset="quick"), args)
    assert line.endswith(": LG-FedAvg and FedPer. At standard, its default: `python "
                         "experiments/personalization.py --preset standard --resume`.")


def test_the_larger_presets_run_the_two_rivals_closest_to_cp_cfl_in_the_committed_quick_study(
        tmp_path, capsys):
    """Without --rivals, standard and paper run STANDARD_RIVALS: worked out here from the
    committed quick csv, the two methods with the smallest mean, over both partitions and
    starts, of the per-seed mean of CP-CFL (SimCLR) minus the rival; smoke and quick run all."""
    study = script("personalization")
    table = rows(Path(__file__).parents[1] / "results/quick/personalization/personalization.csv")
    acc = {(r["partition"], r["run"], int(r["seed"])): float(r["accuracy"]) for r in table}
    gaps = {}
    for method in study.RIVALS:
        gaps[method] = np.mean([
            np.mean([acc[part, "cp-cfl-simclr", s] - acc[part, f"{method}-{start}", s]
                     for s in range(5)])
            for part in ("label-skew", "rotated") for start in ("simclr", "none")])
    assert len(acc) == 2 * 11 * 5  # the whole quick study: 11 runs a partition and seed
    closest = sorted(gaps, key=gaps.get)[:2]
    assert sorted(study.STANDARD_RIVALS) == sorted(closest)
    assert study.default_rivals("standard") == study.default_rivals("paper") == list(
        study.STANDARD_RIVALS)
    assert study.default_rivals("quick") == study.default_rivals("smoke") == list(study.RIVALS)
    for given, runs in ([], closest), (["--rivals", "fedrep"], ["fedrep"]):  # what it plans
        with pytest.raises(SystemExit):
            study.main(["--preset", "standard", "--dry-run", "--out", str(tmp_path), "--trials",
                        "1", "--partitions", "rotated", *given])
        planned = re.findall(r"seed0-rotated-(\S+)-(?:simclr|none): ", capsys.readouterr().out)
        # CP-CFL (SimCLR), then each rival from both starts
        assert sorted(set(planned)) == sorted(["cp-cfl", *runs]) and len(planned) == 1 + 2 * len(
            runs), planned


def test_the_margins_figure_bins_pythons_base_10_logarithms_not_numpys(tmp_path, monkeypatch):
    """clustering_reliability's margins.png: each set's histogram over log10 of its
    positive margins, 29 equal bins from the smallest to the largest, density per decade,
    worked out here; numpy's log10 and power (whose SIMD paths on AVX-512 give other last
    bits than elsewhere) are never called, so the figure's bytes depend on the records."""
    import math

    import cpcfl_tf.evidence.plots as plots

    margins = {"found": [1e-3, 2e-3, 0.5, 0.0], "merged": [1e-4, 3e-2, 3e-2, 2.0]}
    logs = {k: [math.log10(v) for v in vs if v > 0] for k, vs in margins.items()}
    low, high = -4.0, math.log10(2.0)
    width = (high + 1e-9 - low) / 29
    drawn = {}

    def keep(plt, fig, path):
        drawn["fig"] = fig
        return Path(path)

    def forbidden(*args, **kwargs):
        raise AssertionError("numpy's log10 or power: other last bits on other CPUs")

    class NumpyWithoutLogs:  # plots.py's numpy; matplotlib keeps its own
        def __getattr__(self, name):
            return forbidden if name in ("log", "log10", "power", "logspace") else getattr(
                np, name)

    monkeypatch.setattr(plots, "_save", keep)
    monkeypatch.setattr(plots, "np", NumpyWithoutLogs())
    plots.plot_margin_distributions(margins, tmp_path / "m.png", title="t")
    monkeypatch.undo()
    (ax,) = drawn["fig"].axes
    bars = ax.patches
    assert len(bars) == 2 * 29
    for k, (label, xs) in enumerate(logs.items()):
        mine = bars[29 * k: 29 * (k + 1)]
        counts = [sum(low + i * width <= x < low + (i + 1) * width + 1e-12 for x in xs)
                  for i in range(29)]
        assert [b.get_height() for b in mine] == pytest.approx(
            [c / (len(xs) * width) for c in counts], rel=1e-9)  # per decade
        assert mine[0].get_x() == pytest.approx(low) and sum(counts) == len(xs)
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        f"$10^{{{k}}}$" for k in range(-4, 2)]
    assert ax.get_xscale() == "linear" and ax.get_ylabel() == "density per decade"
    import matplotlib.pyplot as plt

    plt.close(drawn["fig"])
