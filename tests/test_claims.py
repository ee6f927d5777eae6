"""experiments/claims.py and cpcfl_tf.evidence.judge: each verdict kind on a synthetic tree of
records whose answer is known, the rule's interval, the paper's numbers against the table
scripts', and the run mode on smoke."""
import dataclasses
import json
import re

import numpy as np
import pytest

from cpcfl_tf.evidence.claims import claims as claim_list
from cpcfl_tf.evidence.claims import evidence
from cpcfl_tf.plan.presets import get_preset
from cpcfl_tf.evidence.claims_report import found_at
from cpcfl_tf.evidence.judge import (CANNOT, HOLDS, NOT_SHOWN, OPPOSITE, SMALLER, t_interval,
                                     verdict)
from cpcfl_tf.records.record import Final, Round, RunRecord, write_record
from cpcfl_tf.plan.resolve import resolve
from helpers import script

SMOKE = get_preset("smoke")
SEEDS = range(5)


def fake(spec, seed, accuracy, *, ari=1.0, restarts=0, base=SMOKE, merged_from=None):
    """A run record of ``spec`` for ``seed`` with a flat accuracy curve; from round
    ``merged_from`` on, every client in cluster 0."""
    spec = dataclasses.replace(spec, seed=seed)
    requested = spec.config(base)
    fl = requested.federated
    config = requested if fl.method == "centralized" else resolve(requested).config
    clients = requested.partition.num_clients
    groups = [k * requested.partition.num_groups // clients for k in range(clients)]
    rounds = [Round(t, [0] * clients if merged_from and t >= merged_from else groups, accuracy)
              for t in range(1, fl.rounds + 1)]
    return RunRecord(config, requested, {"data": seed, "train": seed},
                     [{"id": k, "group": g} for k, g in enumerate(groups)], rounds,
                     Final(accuracy, ari=ari, restarts=restarts), {"seconds": 1.0},
                     "synthetic", {"cpu": "test"})


@pytest.fixture
def tree(tmp_path):
    """C1's three links as holds / not shown / opposite, C11 within its margin, C4 with
    one IFCA failure, C5 with no runs at all."""
    specs = evidence(SMOKE)
    wiggle = (0.01, -0.01, 0.02, -0.02, 0.0)
    (tmp_path / "somewhere").mkdir()
    for seed in SEEDS:
        for name, accuracy, extra in (
                ("cp-cfl-simclr", 0.90 + 0.001 * seed, {}),
                ("ifca-fedavg", 0.85, {}),
                ("ifca-none", 0.85 + wiggle[seed], {"restarts": int(seed == 2)}),
                ("fedavg-none", 0.95, {}),
                ("centralized-group", 0.905, {})):
            write_record(tmp_path / "somewhere" / f"s{seed}-{name}.json",
                         fake(specs[name], seed, accuracy, **extra))
    return tmp_path


def judged(tree, *claims_):
    script("claims").main(["--preset", "smoke", "--results", str(tree), "--out",
                           str(tree / "claims"), "--claims", ",".join(claims_)])
    return {c["id"]: c for c in json.loads((tree / "claims.json").read_text())["claims"]}


def test_each_verdict_kind_is_the_known_answer(tree):
    out = judged(tree, "C1", "C11", "C5", "C4")
    c1 = [link["verdict"] for link in out["C1"]["links"]]
    # The second: differences -1, 1, -2, 2, 0 (interval +-1.96 by hand) against the paper's
    # 3.10 points: smaller than the paper's.
    assert c1 == [HOLDS, SMALLER, OPPOSITE]
    assert out["C1"]["links"][1]["paper_difference"] == 3.10
    assert out["C1"]["links"][1]["paper_inside"] is False
    first = out["C1"]["links"][0]
    assert first["n"] == 5 and first["per_seed"]["4"] == pytest.approx(100 * 0.054)
    assert first["min"] == pytest.approx(5.0) and first["max"] == pytest.approx(5.4)
    assert out["C1"]["verdict"].startswith("1 of 3 links holds")
    assert out["C11"]["verdict"] == HOLDS  # -0.5 points, within ± 2
    assert out["C11"]["links"][0]["margin"] == 2.0
    # One failure of IFCA (None) in five seeds against none for CP-CFL: not shown.
    assert out["C4"]["links"][0]["per_seed"] == {"0": 0, "1": 0, "2": 1, "3": 0, "4": 0}
    assert out["C4"]["verdict"] == NOT_SHOWN
    assert out["C5"]["verdict"] == CANNOT
    assert "seed 0: n2" in out["C5"]["links"][1]["missing"]
    text = (tree / "claims.md").read_text()
    assert "--claims C5 --run --resume" in text  # the command that makes the missing runs
    assert "interval lies above zero" in text  # the rule is written at the top


def test_a_link_with_a_chosen_seed_missing_is_not_judged_yet(tree):
    """Two of five seeds would give an interval, but the verdict waits for all the chosen
    seeds; what the rule says so far is shown beside it."""
    for seed in (2, 3, 4):
        (tree / "somewhere" / f"s{seed}-ifca-fedavg.json").unlink()
    link = judged(tree, "C1")["C1"]["links"][0]
    assert link["n"] == 2 and link["verdict"] == CANNOT and link["so_far"] == HOLDS
    assert "3 run(s) missing" in (tree / "claims.md").read_text()
    assert "so far (n = 2): holds" in (tree / "claims.md").read_text()
    assert verdict({0: 1.0, 1: 1.1}, missing=1).verdict == CANNOT
    assert verdict({0: 1.0, 1: 1.1}).verdict == HOLDS


def test_the_second_verdict_puts_cp_cfl_restart_in_cp_cfls_place(tmp_path):
    """C1's first link by hand: CP-CFL − IFCA (FedAvg) per seed +5, +6, −15 (seed 2
    merged two groups), +7, +5 points: mean +1.6, t-interval [−9.5, +12.7], not shown.
    With the restart rule (checked after round Tc + 2 = 3 of 4) it fires only in seed 2,
    whose CP-CFL+restart run (made, +6) replaces it; the other seeds' CP-CFL runs are
    their CP-CFL+restart runs: +5, +6, +6, +7, +5, mean +5.8, interval [+4.76, +6.84],
    holds. The link IFCA (FedAvg) − IFCA (None) names no CP-CFL run: the same runs."""
    from scipy import stats

    base = SMOKE.with_overrides(federated={"restart_round": 2})
    specs = evidence(base)
    (tmp_path / "runs").mkdir()
    cp_cfl = (0.90, 0.91, 0.70, 0.92, 0.90)
    for seed in SEEDS:
        for name, accuracy, extra in (
                ("cp-cfl-simclr", cp_cfl[seed], {"merged_from": 2} if seed == 2 else {}),
                ("ifca-fedavg", 0.85, {}), ("ifca-none", 0.80, {})):
            write_record(tmp_path / "runs" / f"s{seed}-{name}.json",
                         fake(specs[name], seed, accuracy, base=base, **extra))
    fixed = specs["cp-cfl-simclr+restart"]
    assert (fixed.method, fixed.name) == ("cp-cfl-restart", "cp-cfl-restart-simclr")
    argv = ["--preset", "smoke", "--results", str(tmp_path), "--out", str(tmp_path / "claims"),
            "--claims", "C1", "--set", "federated.restart_round=2"]
    script("claims").main(argv)
    link = json.loads((tmp_path / "claims.json").read_text())["claims"][0]["links"][0]
    assert link["verdict"] == NOT_SHOWN
    # Seed 2's rule fires: its CP-CFL run is not CP-CFL+restart's, which is missing.
    again = link["with_restart_rule"]
    assert again["verdict"] == CANNOT and again["missing"] == ["seed 2: cp-cfl-simclr+restart"]
    write_record(tmp_path / "runs" / "s2-cp-cfl-restart.json",
                 fake(fixed, 2, 0.91, base=base, restarts=1))
    script("claims").main(argv)
    stored = json.loads((tmp_path / "claims.json").read_text())["claims"][0]
    again = stored["links"][0]["with_restart_rule"]
    diffs = [5.0, 6.0, 6.0, 7.0, 5.0]
    half = stats.t.ppf(0.975, 4) * np.std(diffs, ddof=1) / np.sqrt(5)
    assert list(again["per_seed"].values()) == pytest.approx(diffs)
    assert again["ci95"] == pytest.approx([5.8 - half, 5.8 + half])
    assert again["verdict"] == HOLDS and stored["links"][0]["verdict"] == NOT_SHOWN
    assert stored["links"][1]["with_restart_rule"] is None  # IFCA's link: the same runs
    # IFCA (FedAvg) − IFCA (None) is +5 in every seed (holds), FedAvg (None) has no run.
    assert stored["verdict"].startswith("1 of 3 links holds")
    assert stored["with_restart_rule"].startswith("2 of 3 links holds")
    text = (tmp_path / "claims.md").read_text()
    assert "| same runs | same runs |" in text and "with the restart rule" in text


def test_a_linear_evaluation_missing_is_counted_once_per_seed(tmp_path):
    # One linear_eval.json per seed scores the three encoders: with seeds 0 and 1
    # evaluated, three evaluations are missing, not six encoders' worth of runs.
    from cpcfl_tf.records.files import write_json

    for seed, (simclr, byol) in enumerate(((0.80, 0.75), (0.82, 0.76))):
        (tmp_path / f"seed{seed}").mkdir()
        write_json(tmp_path / f"seed{seed}" / "linear_eval.json", {
            "config": SMOKE.with_overrides(seed=seed).to_dict(),
            "rows": [{"pretraining": "simclr", "accuracy": simclr},
                     {"pretraining": "byol", "accuracy": byol},
                     {"pretraining": "simsiam", "accuracy": 0.7}]})
    link = judged(tmp_path, "C9")["C9"]["links"][2]
    assert link["per_seed"] == pytest.approx({"0": 5.0, "1": 6.0})
    assert link["verdict"] == CANNOT and len(link["missing"]) == 3
    text = (tmp_path / "claims.md").read_text()
    assert "3 linear evaluation(s) missing" in text
    assert "seed(s) 0, 1 do not name the encoder they scored" in text


def test_a_linear_evaluation_of_another_encoder_than_the_seeds_run_is_noted(tmp_path):
    # Seed 0 evaluated the SimCLR encoder its CP-CFL run started from; seed 1's
    # evaluation scored other bits (e.g. pre-trained again on another machine).
    from cpcfl_tf.records.files import write_json

    spec = evidence(SMOKE)["cp-cfl-simclr"]
    for seed in (0, 1):
        (tmp_path / f"seed{seed}").mkdir()
        write_json(tmp_path / f"seed{seed}" / "linear_eval.json", {
            "config": SMOKE.with_overrides(seed=seed).to_dict(),
            "rows": [{"pretraining": m, "accuracy": 0.8, "encoder_fingerprint": f"{m}{seed}" * 8}
                     for m in ("simclr", "byol", "simsiam")]})
        run = fake(spec, seed, 0.9)
        write_record(tmp_path / f"s{seed}.json", dataclasses.replace(
            run, environment={"cpu": "test", "starting_encoder": "simclr0" * 8}))
    judged(tmp_path, "C9")
    text = (tmp_path / "claims.md").read_text()
    assert "seed 1's linear evaluation of simclr scored encoder `simclr1simclr1si`" in text
    assert "seed 0's linear evaluation" not in text and "do not name" not in text


def test_groups_found_shows_each_clustered_runs_final_ari_and_first_round(tree):
    # Seed 3's CP-CFL run keeps groups 1 and 2 merged from round 2 on (never found, final
    # ARI below 1); every other run has its clients in their groups from round 1.
    spec = evidence(SMOKE)["cp-cfl-simclr"]
    merged = fake(spec, 3, 0.85, ari=0.4)
    first = merged.rounds[0]
    rounds = [first] + [dataclasses.replace(r, cluster_ids=[min(g, 1) for g in r.cluster_ids])
                        for r in merged.rounds[1:]]
    rounds[0] = dataclasses.replace(first, cluster_ids=[0] * len(first.cluster_ids))
    write_record(tree / "somewhere" / "s3-cp-cfl-simclr.json",
                 dataclasses.replace(merged, rounds=rounds))
    assert found_at(merged) == 1 and found_at(
        dataclasses.replace(merged, rounds=rounds)) is None
    judged(tree, "C4")
    text = (tree / "claims.md").read_text()
    section = text[text.index("## Groups found"):]
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:]
            for line in section.splitlines() if line.startswith("| ")}
    sizes = ",".join(map(str, np.bincount(first.cluster_ids)))  # the true groups
    assert rows["IFCA (None)"] == ["1.00 / 1.00 / 1.00 / 1.00 / 1.00", " / ".join([sizes] * 5),
                                   "1 / 1 / 1 / 1 / 1", "0 / 0 / 1 / 0 / 0", "5 of 5 |"]
    merged_sizes = ",".join(map(str, np.bincount(rounds[-1].cluster_ids, minlength=3)))
    assert merged_sizes.endswith(",0")  # groups 1 and 2 share model 1, model 2 is unused
    assert rows["CP-CFL (SimCLR)"] == [
        "1.00 / 1.00 / 1.00 / 0.40 / 1.00", " / ".join([sizes] * 3 + [merged_sizes, sizes]),
        "1 / 1 / 1 / never / 1", "0 / 0 / 0 / 0 / 0", "4 of 5 |"]
    assert "CP-CFL (BYOL)" not in rows  # no runs: no row
    # IFCA's failure test catches the merged run (an empty model), not the others.
    assert ("flags 1 of the 1 CP-CFL runs that end below ARI 1 and 0 of the 4 that end "
            "with the true groups") in section

    # C7's runs with another number of clients get a row each and count among CP-CFL's;
    # the preset's own number (9) is the CP-CFL (SimCLR) row, not repeated.
    for seed in (0, 1):
        write_record(tree / "somewhere" / f"s{seed}-c3.json",
                     fake(evidence(SMOKE)["c3"], seed, 0.8))
    judged(tree, "C4")
    section = (tree / "claims.md").read_text().split("## Groups found")[1]
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ")[1:]
            for line in section.splitlines() if line.startswith("| ")}
    assert rows["CP-CFL (SimCLR), 3 clients"][0] == "1.00 / 1.00"
    assert rows["CP-CFL (SimCLR), 3 clients"][-1] == "2 of 2 |"
    assert not any(label.endswith(("6 clients", "9 clients")) for label in rows)
    assert "and 0 of the 6 that end with the true groups" in section


def test_a_link_pairs_runs_of_one_encoder_and_one_machine(tmp_path):
    # CP-CFL (SimCLR) was run on two machines, each with its own SimCLR encoder; the
    # index prefers machine A's record (first path). FedAvg (SimCLR) exists from
    # machine B only, so C2 must pair it with B's CP-CFL run (same encoder): +10 points,
    # not A's +15. IFCA (FedAvg) (each run's own FedAvg encoder) exists from B only: C1
    # pairs it with B's run too, by machine kind.
    specs = evidence(SMOKE)

    def put(folder, name, seed, accuracy, cpu, encoder):
        run = fake(specs[name], seed, accuracy)
        (tmp_path / folder).mkdir(exist_ok=True)
        write_record(tmp_path / folder / f"s{seed}-{name}.json", dataclasses.replace(
            run, environment={"cpu": cpu, "starting_encoder": encoder}))

    for seed in SEEDS:
        put("a", "cp-cfl-simclr", seed, 0.95, "A", f"a{seed}")
        put("b", "cp-cfl-simclr", seed, 0.90, "B", f"b{seed}")
        put("b", "fedavg-simclr", seed, 0.80 + 0.001 * seed, "B", f"b{seed}")
        put("b", "ifca-fedavg", seed, 0.85, "B", f"f{seed}")
    out = judged(tmp_path, "C1", "C2")
    assert out["C2"]["links"][0]["per_seed"]["0"] == pytest.approx(10.0)
    assert out["C1"]["links"][0]["per_seed"]["0"] == pytest.approx(5.0)
    used = json.loads((tmp_path / "claims.json").read_text())["records"]
    # The links used B's, and so does the groups table (what was judged), not A's.
    assert used["seed 0: cp-cfl-simclr"] == [str(tmp_path / "b" / "s0-cp-cfl-simclr.json")]
    text = (tmp_path / "claims.md").read_text()
    assert "runs judged here" not in text and "paired differences" not in text  # one machine


def test_the_note_names_the_claims_and_seeds_of_another_machine_and_mixed_pairs(tmp_path):
    # C2 seeds 3-4 ran on machine B (its own encoders), the rest on A; B's CP-CFL run of
    # seed 4 is missing, so C2 seed 4 mixes encoders and machines, and C1 seed 4 (B's
    # IFCA (FedAvg), from each run's own FedAvg encoder) mixes machines.
    specs = evidence(SMOKE)

    def put(folder, name, seed, accuracy, cpu, encoder):
        (tmp_path / folder).mkdir(exist_ok=True)
        write_record(tmp_path / folder / f"s{seed}-{name}.json", dataclasses.replace(
            fake(specs[name], seed, accuracy), environment={"cpu": cpu, "starting_encoder": encoder}))

    for seed in SEEDS:
        machine = "B" if seed >= 3 else "A"
        put("a", "cp-cfl-simclr", seed, 0.90, "A", f"a{seed}")
        put(machine.lower(), "fedavg-simclr", seed, 0.80, machine, f"{machine.lower()}{seed}")
        if seed == 3:
            put("b", "cp-cfl-simclr", seed, 0.90, "B", f"b{seed}")
        put("b" if seed == 4 else "a", "ifca-fedavg", seed, 0.85, "B" if seed == 4 else "A",
            f"f{seed}")
    judged(tmp_path, "C1", "C2")
    text = (tmp_path / "claims.md").read_text()
    # Neither names its CPU's identity: each is a kind, which may be several machines.
    assert "by claim and seed: B, CPU identity not recorded: C1 seed 4, C2 seeds 3, 4." in text
    assert "(what differs): C1 seed 4 (CPUs), C2 seed 4 (encoders and CPUs)." in text
    assert "Each paired difference compares runs of one kind of CPU" not in text


def test_only_a_repositorys_results_tree_writes_the_front_doors_verdicts(tmp_path):
    # README.md's verdicts come from <repository>/results/<preset>; judging a tree of
    # one's own runs elsewhere (here runs/smoke) leaves them as they are.
    spec = evidence(SMOKE)["cp-cfl-simclr"]
    front = tmp_path / "README.md"
    front.write_text("intro\n<!-- verdicts:smoke -->\nSTALE\n<!-- /verdicts -->\nend\n")
    for folder in ("runs", "results"):
        tree = tmp_path / folder / "smoke"
        tree.mkdir(parents=True)
        write_record(tree / "run.json", fake(spec, 0, 0.9))
        script("claims").main(["--preset", "smoke", "--results", str(tree),
                               "--out", str(tree / "claims")])
        if folder == "runs":
            assert "STALE" in front.read_text()
    text = front.read_text()
    assert "STALE" not in text and text.startswith("intro\n") and text.endswith("end\n")
    assert "| C11 CP-CFL comes close to the centralized by-group bound | cannot be told here |" in text


def test_a_claim_the_data_cannot_host_says_why():
    standard = {c.id: c for c in claim_list(get_preset("standard"))}
    assert "hosts 15 clients" in standard["C6"].cannot
    quick = {c.id: c for c in claim_list(get_preset("quick"))}
    assert quick["C6"].cannot is None
    # C6's "no gain" and C11's "close to" are claims of no difference: equivalence within
    # the margins fixed in claims.py; every other link is a difference the paper says is
    # positive, with its printed difference where it prints numbers.
    related, unrelated = quick["C6"].links
    assert (related.equivalence, related.effect) == (False, 6.40)
    assert (unrelated.equivalence, unrelated.margin, unrelated.effect) == (True, 2.0, -0.50)
    assert quick["C11"].links[0].equivalence and quick["C11"].links[0].effect == -0.67
    assert quick["C5"].links[2].effect == 4.00 and quick["C9"].links[0].effect == 1.93
    assert all(not link.equivalence for c in quick.values() if c.id not in ("C6", "C11")
               for link in c.links)


def test_the_interval_is_students_t():
    low, high = t_interval([1.0, 2.0, 3.0])
    half = 4.302652729911275 / np.sqrt(3)  # t(0.975, 2) * sd / sqrt(n), sd = 1
    assert (low, high) == pytest.approx((2 - half, 2 + half))
    assert verdict({0: 1.0, 1: 2.0, 2: 3.0}).verdict == NOT_SHOWN
    assert verdict({0: 1.0, 1: 1.1, 2: 0.9}).verdict == HOLDS
    assert verdict({0: -1.0, 1: -1.1, 2: -0.9}).verdict == OPPOSITE
    assert verdict({0: 1.0}).verdict == CANNOT
    assert verdict({0: 0.3, 1: -0.2, 2: 0.1}, margin=2.0).verdict == HOLDS
    assert verdict({0: -5.0, 1: -5.2, 2: -4.9}, margin=2.0).verdict == OPPOSITE


def test_the_rate_interval_is_clopper_pearsons():
    """Closed forms at the edges (k = 0: upper 1 - (0.025)^(1/n); k = n: lower
    (0.025)^(1/n)) and the beta quantiles inside, from the definition: the lower bound
    is where P(X >= k) = 0.025, the upper where P(X <= k) = 0.025 (binomial sums)."""
    from math import comb

    from cpcfl_tf.evidence.judge import clopper_pearson

    assert clopper_pearson(0, 20) == pytest.approx((0.0, 1 - 0.025 ** (1 / 20)))
    assert clopper_pearson(50, 50) == pytest.approx((0.025 ** (1 / 50), 1.0))
    low, high = clopper_pearson(17, 20)

    def tail(p, k, n, upper):
        terms = range(k, n + 1) if upper else range(0, k + 1)
        return sum(comb(n, j) * p ** j * (1 - p) ** (n - j) for j in terms)

    assert tail(low, 17, 20, upper=True) == pytest.approx(0.025, abs=1e-9)
    assert tail(high, 17, 20, upper=False) == pytest.approx(0.025, abs=1e-9)
    assert (round(100 * low), round(100 * high)) == (62, 97)  # the standard study's 17 of 20


def test_the_paper_numbers_are_the_paper_tables():
    """Every number in a claim's paper column is a cell of the table scripts' copies of
    the paper's tables (or a difference the paper prints in its text)."""
    cells = set()

    def collect(value):
        if isinstance(value, dict):
            for v in value.values():
                collect(v)
        elif isinstance(value, (tuple, list)):
            for v in value:
                collect(v)
        elif isinstance(value, float):
            cells.add(f"{value:.2f}")

    for name, attrs in {"table2": ("PAPER_ACCURACY",), "trials": ("PAPER_MEAN_SD",),
                        "clusters": ("PAPER",), "clients": ("PAPER",), "heads": ("PAPER",),
                        "encoder_training": ("PAPER",), "datasets": ("PAPER",)}.items():
        for attr in attrs:
            collect(getattr(script(name), attr))
    text_numbers = {"5.90", "0.50"}  # Sec. "Influence of pre-training ... similarity"
    for claim in claim_list(get_preset("standard")):
        for link in claim.links:
            for number in re.findall(r"\d+\.\d+", link.paper):
                assert number in cells | text_numbers, (claim.id, link.label, number)


def test_trials_carry_the_paper_mean_sd_as_printed():
    trials = script("trials")
    for metric, runs in trials.PAPER.items():
        digits = 0.01 if metric == "accuracy" else 0.0001
        for name, values in runs.items():
            mean, sd = trials.PAPER_MEAN_SD[metric][name]
            assert abs(np.mean(values) - mean) <= digits, (metric, name)
            assert abs(np.std(values) - sd) <= digits, (metric, name)
    assert trials.PAPER_MEAN_SD["accuracy"]["fedavg-none"] == (42.73, 0.69)


def test_run_mode_makes_only_the_missing_runs(tmp_path, capsys):
    results = tmp_path / "results"
    results.mkdir()
    argv = ["--preset", "smoke", "--results", str(results), "--out", str(results / "claims"),
            "--seeds", "0-1", "--claims", "C11", "--set", "federated.rounds=2",
            "federated.head_rounds=1", "federated.centralized_epochs=2"]
    with pytest.raises(SystemExit) as stop:  # --dry-run lists what --run would make
        script("claims").main(argv + ["--run", "--dry-run"])
    assert stop.value.code == 0 and not (results / "claims").exists()
    assert [line.strip() for line in capsys.readouterr().out.splitlines() if "to run" in line] == [
        f"seed{s}-{name}: to run" for s in (0, 1) for name in ("cp-cfl-simclr", "centralized-group")
    ] + [f"seed{s}-cp-cfl-restart-simclr: to run if its restart rule fires in its base "
         "method's run (made first; else that run)" for s in (0, 1)]
    # The second verdict's CP-CFL+restart runs: the rule (checked after round Tc + 10)
    # never fires in two rounds, so each is its CP-CFL run and none is written.
    script("claims").main(argv + ["--run"])
    made = sorted(p.name for p in (results / "claims").glob("*.json"))
    assert made == ["seed0-centralized-group.json", "seed0-cp-cfl-simclr.json",
                    "seed1-centralized-group.json", "seed1-cp-cfl-simclr.json"]
    stored = json.loads((results / "claims.json").read_text())
    assert stored["claims"][0]["links"][0]["n"] == 2
    assert stored["claims"][0]["verdict"] != CANNOT
    # Seed 0's records move elsewhere in the tree, as if made on another kind of machine
    # from another encoder: this machine would not make them bit for bit, but the seed is
    # complete, so nothing of it is made again.
    (results / "elsewhere").mkdir()
    for name in [n for n in made if n.startswith("seed0-")]:
        data = json.loads((results / "claims" / name).read_text())
        data["environment"].update(cpu="another kind", starting_encoder="0" * 16)
        (results / "elsewhere" / name).write_text(json.dumps(data))
        (results / "claims" / name).unlink()
    capsys.readouterr()
    with pytest.raises(SystemExit):
        script("claims").main(argv + ["--run", "--dry-run"])
    listed = capsys.readouterr().out
    assert "to run" not in listed and "C11: seeds 0, 1 complete in the tree" in listed
    script("claims").main(argv + ["--run"])  # everything is there: nothing runs
    again = capsys.readouterr().out
    assert not re.search(r"final accuracy [0-9.]+ -> ", again)
    assert sorted(p.name for p in results.rglob("seed*.json")) == made
    assert json.loads((results / "claims.json").read_text())["claims"][0]["links"][0]["n"] == 2


def test_compare_tells_same_within_and_outside(tmp_path, capsys):
    from cpcfl_tf.running.compare import DIFFERS, NO_REFERENCE, OUTSIDE, SAME, WITHIN

    specs = evidence(SMOKE)
    reference, ours = tmp_path / "reference", tmp_path / "ours"
    (reference / "trials").mkdir(parents=True)
    ours.mkdir()
    for seed, accuracy in enumerate((0.80, 0.84, 0.88)):
        write_record(reference / "trials" / f"s{seed}-cp.json",
                     fake(specs["cp-cfl-simclr"], seed, accuracy))
    write_record(reference / "trials" / "s0-fedavg.json", fake(specs["fedavg-none"], 0, 0.5))
    # The tree's first record of seed 0's config started from another encoder: the one
    # from the same encoder is the one compared with.
    other = fake(specs["cp-cfl-simclr"], 0, 0.83)
    write_record(reference / "trials" / "s0-cp-elsewhere.json", dataclasses.replace(
        other, environment={**other.environment, "starting_encoder": "f" * 16}))
    write_record(ours / "same.json", fake(specs["cp-cfl-simclr"], 0, 0.80))
    write_record(ours / "within.json", fake(specs["cp-cfl-simclr"], 1, 0.85))
    outside = fake(specs["cp-cfl-simclr"], 2, 0.95)
    write_record(ours / "outside.json", dataclasses.replace(  # its own pre-training
        outside, environment={**outside.environment, "starting_encoder": "0123456789abcdef"}))
    write_record(ours / "one-seed.json", fake(specs["fedavg-none"], 0, 0.52))
    write_record(ours / "new.json", fake(specs["ifca-none"], 0, 0.7))
    script("compare").main(["--results", str(ours), "--reference", str(reference)])
    lines = capsys.readouterr().out.splitlines()
    printed = dict(line.split(": ", 1) for line in lines if ".json: " in line)
    assert printed["same.json"].endswith(SAME)
    # the spread: each seed's preferred record (seed 0's: the tree's first, 83 %)
    assert printed["within.json"].endswith(WITHIN) and "(seeds 83.00-88.00)" in printed["within.json"]
    assert printed["outside.json"].endswith(OUTSIDE + "; another starting encoder")
    assert sum("tools/encoders.py carries encoders" in line for line in lines) == 1
    assert printed["one-seed.json"].endswith(DIFFERS)
    assert printed["new.json"].endswith(NO_REFERENCE + "; no committed run of this config")
    # Runs of another machine: the two machines said once, each run's line short.
    capsys.readouterr()
    long_cpu = "family 25 model 1 stepping 1; L1d 32K, L1i 32K, L2 512K, L3 32768K; flags x"
    for name in ("same.json", "within.json"):
        moved = json.loads((ours / name).read_text())
        moved["environment"]["cpu"] = long_cpu
        (ours / name).write_text(json.dumps(moved))
    script("compare").main(["--results", str(ours), "--reference", str(reference)])
    lines = capsys.readouterr().out.splitlines()
    assert sum(long_cpu in line for line in lines) == 1
    assert max(len(line) for line in lines if ".json: " in line) < 120


@pytest.mark.parametrize("study", [(), tuple(range(50, 58))], ids=["alone", "beside-a-study"])
def test_a_run_remade_on_another_machine_does_not_replace_the_seeds_record(tmp_path, study):
    # Every CP-CFL run came from machine A (folder z); seed 3's was remade on B (folder a,
    # first in path order) for one pairing. A link of that run alone (C3) keeps A's.
    # Beside a study (B's runs of configs the claims never ask for, seeds 50-57) B has
    # most of the tree's records (9 of 14) but A most of the claims' (5 of 6): the same.
    specs = evidence(SMOKE)
    for folder, cpu, seeds in (("z", "A", SEEDS), ("a", "B", (3, *study))):
        (tmp_path / folder).mkdir()
        for seed in seeds:
            write_record(tmp_path / folder / f"s{seed}-cp-cfl-simclr.json", dataclasses.replace(
                fake(specs["cp-cfl-simclr"], seed, 0.9),
                environment={"cpu": cpu, "starting_encoder": f"{cpu}{seed}"}))
    judged(tmp_path, "C3")
    used = json.loads((tmp_path / "claims.json").read_text())["records"]
    assert used["seed 3: cp-cfl-simclr"] == [str(tmp_path / "z" / "s3-cp-cfl-simclr.json")]
    assert not any("s5" in path for paths in used.values() for path in paths)
    assert "runs judged here" not in (tmp_path / "claims.md").read_text()


def test_two_cpus_of_one_kind_are_told_apart_by_their_cpu_id(tmp_path):
    # Two VMs both say "EPYC (avx512f)" and pre-train the same encoder, but train other
    # bits from it. A made CP-CFL, IFCA (None) and FedAvg (None) (no cpu_id: older
    # records); B, with its cpu_id, made FedAvg (SimCLR) and CP-CFL again from the same
    # encoder. C2 pairs B's with B's (+10), not A's CP-CFL (first in path order, +15).
    specs = evidence(SMOKE)

    def put(folder, name, seed, accuracy, environment):
        (tmp_path / folder).mkdir(exist_ok=True)
        write_record(tmp_path / folder / f"s{seed}-{name}.json", dataclasses.replace(
            fake(specs[name], seed, accuracy),
            environment={"cpu": "EPYC (avx512f)", "starting_encoder": f"e{seed}", **environment}))

    for seed in SEEDS:
        put("a", "cp-cfl-simclr", seed, 0.95, {})
        put("a", "ifca-none", seed, 0.85, {})
        put("a", "fedavg-none", seed, 0.75, {})
        put("b", "cp-cfl-simclr", seed, 0.90, {"cpu_id": "family 26 model 2"})
        put("b", "fedavg-simclr", seed, 0.80, {"cpu_id": "family 26 model 2"})
    out = judged(tmp_path, "C2", "C3")
    assert out["C2"]["links"][0]["per_seed"]["0"] == pytest.approx(10.0)
    used = json.loads((tmp_path / "claims.json").read_text())["records"]
    assert str(tmp_path / "b" / "s0-cp-cfl-simclr.json") in used["seed 0: cp-cfl-simclr"]
    # C3 (CP-CFL alone) keeps the tree's majority machine, A.
    assert str(tmp_path / "a" / "s0-cp-cfl-simclr.json") in used["seed 0: cp-cfl-simclr"]
    text = (tmp_path / "claims.md").read_text()
    assert "ran on EPYC (avx512f) [family 26 model 2]; the other 10" in text
    # A's records name the kind only, which is said, not left to look like B's.
    assert "by claim and seed: EPYC (avx512f), CPU identity not recorded: C2 seeds" in text
    # FedAvg (SimCLR) (B) against FedAvg (None) (A only) mixes the two machines: said so.
    assert "C2 seed 0 (CPUs)" in text


def test_judging_a_tree_writes_only_into_it_and_a_refusal_writes_nothing(tree, tmp_path,
                                                                          monkeypatch):
    """Without --run no output folder is prepared (it used to create and remove a file in
    the kit's own results/<preset>/claims); refused arguments leave no folder behind."""
    import cpcfl_tf.records.files as results
    from cpcfl_tf.errors import UserError

    monkeypatch.chdir(tmp_path)  # the default output folder is results/smoke/claims here
    prepared = []
    real = results.prepare_out_dir
    monkeypatch.setattr(results, "prepare_out_dir",
                        lambda path, **k: prepared.append(path) or real(path, **k))
    before = sorted(p.relative_to(tree) for p in tree.rglob("*"))
    claims = script("claims")
    claims.main(["--preset", "smoke", "--results", str(tree), "--claims", "C1"])
    assert prepared == [] and not (tmp_path / "results").exists()
    after = sorted(p.relative_to(tree) for p in tree.rglob("*"))
    assert {str(p) for p in set(after) - set(before)} == {"claims.json", "claims.md"}
    with pytest.raises(UserError, match="unknown claim.*C99"):
        claims.main(["--preset", "smoke", "--results", str(tree), "--claims", "C1,C99"])
    with pytest.raises(UserError, match="no results tree"):
        claims.main(["--preset", "smoke", "--results", str(tmp_path / "none")])
    assert prepared == [] and not (tmp_path / "results").exists()


def test_a_fired_restart_run_is_taken_where_it_starts_from_its_base_runs_encoder(tmp_path):
    """A folder's CP-CFL run merged groups (the restart rule, checked after round 3 of 4,
    fires), so its CP-CFL+restart run is not that run. A CP-CFL+restart record of the same
    config elsewhere in the tree that starts from the folder's CP-CFL run's encoder is
    that run's restart (another script made it): the runner takes it; one from another
    encoder is not taken (the run would be made)."""
    from cpcfl_tf.records.store import RecordIndex
    from cpcfl_tf.running.runner import Runner, RunSpec

    base = SMOKE.with_overrides(federated={"restart_round": 2})
    specs = evidence(base)
    tree = tmp_path / "results"
    folder, other = tree / "trials", tree / "reliability"
    folder.mkdir(parents=True)
    other.mkdir()
    merged = fake(specs["cp-cfl-simclr"], 0, 0.7, base=base, merged_from=2)
    write_record(folder / "trial1-cp-cfl-simclr.json", dataclasses.replace(
        merged, environment={"cpu": "A", "starting_encoder": "E0"}))
    restarted = fake(specs["cp-cfl-simclr+restart"], 0, 0.9, base=base, restarts=1)
    spec = RunSpec("trial1-cp-cfl-restart-simclr", "cp-cfl-restart", "simclr", seed=0)
    for encoder, taken in (("E1", None), ("E0", 0.9)):
        write_record(other / "run0-cp-cfl-restart-simclr.json", dataclasses.replace(
            restarted, environment={"cpu": "B", "starting_encoder": encoder}))
        runner = Runner("trials", base, folder)
        runner.store.reuse = RecordIndex(tree)
        found = runner.finished(spec)
        assert (found and found.final.accuracy) == taken
        assert (spec.name in runner.store.reused) == (taken is not None)


SPREAD = {0: -1.0, 1: 1.0, 2: -2.0, 3: 2.0, 4: 0.0}
"""Mean 0, SD sqrt(2.5): the 95 % interval is +-2.7764 * 1.5811 / sqrt(5) = +-1.9632."""


def test_smaller_than_the_papers_by_hand_in_every_branch():
    shifted = {k: v + 3.0 for k, v in SPREAD.items()}  # [1.04, 4.96]: above zero
    assert verdict(shifted, paper=10.0).verdict == HOLDS  # the sign decides first
    assert verdict(SPREAD, paper=3.10).verdict == SMALLER  # 1.9632 < 3.10
    assert verdict(SPREAD, paper=1.90).verdict == NOT_SHOWN  # 1.90 inside the interval
    assert verdict(SPREAD).verdict == NOT_SHOWN  # the paper gives no number
    assert verdict(SPREAD, paper=-0.5).verdict == NOT_SHOWN  # no positive difference
    below = {k: v - 3.0 for k, v in SPREAD.items()}
    assert verdict(below, paper=3.10).verdict == OPPOSITE
    waiting = verdict(SPREAD, paper=3.10, missing=2)
    assert (waiting.verdict, waiting.so_far) == (CANNOT, SMALLER)
    from cpcfl_tf.evidence.judge import bounds

    assert bounds(verdict(SPREAD, paper=3.10)) == "at most +1.96, at least -1.96"
    assert verdict(SPREAD, paper=3.10).paper_inside is False
    assert verdict(SPREAD, paper=1.5).paper_inside is True
    assert verdict(SPREAD).paper_inside is None


@pytest.mark.parametrize("effect,gpower", [(0.5, 34), (0.8, 15), (0.2, 199)])
def test_the_seeds_needed_are_the_t_tests_power_computation(effect, gpower):
    """Against the textbook sample sizes of a two-sided one-sample t-test at 5 % with
    80 % power (Cohen's d 0.5: 34, 0.8: 15, 0.2: 199, as G*Power gives them), and a
    simulation of the test itself at the n found and one fewer."""
    from scipy import stats

    from cpcfl_tf.evidence.judge import seeds_needed

    values = np.array([effect - 1.0, effect + 1.0])  # mean = effect, SD = sqrt(2)
    values = effect + (values - effect) / np.sqrt(2)  # SD 1: Cohen's d = effect
    n = seeds_needed(values)
    assert n == gpower
    rng = np.random.default_rng(0)

    def rejected(size):
        draws = rng.normal(effect, 1.0, size=(20_000, size))
        t = draws.mean(1) / (draws.std(1, ddof=1) / np.sqrt(size))
        return np.mean(np.abs(t) > stats.t.ppf(0.975, size - 1))

    assert rejected(n) >= 0.79 and rejected(n - 1) < 0.81
    assert seeds_needed(np.array([1.0, 1.0])) is None  # no spread: no test to plan
    assert seeds_needed(np.array([-1.0, 1.0])) is None  # mean zero: no effect to find


def test_equivalence_is_two_one_sided_tests():
    """TOST by its definition: the larger p-value of the t-tests of mean <= -margin and of
    mean >= margin; below 5 % exactly when the 90 % interval lies inside the margin."""
    from scipy import stats

    from cpcfl_tf.evidence.judge import equivalent

    values = np.array([0.3, -0.2, 0.5, 0.1, 0.4])
    n, mean, error = 5, values.mean(), values.std(ddof=1) / np.sqrt(5)
    for margin in (0.3, 0.6, 1.0):
        expected = max(1 - stats.t.cdf((mean + margin) / error, n - 1),
                       stats.t.cdf((mean - margin) / error, n - 1))
        assert equivalent(values, margin) == pytest.approx(expected)
        low, high = t_interval(values, 0.90)
        assert (equivalent(values, margin) < 0.05) == (-margin < low and high < margin)
    per_seed = dict(enumerate(values))
    assert verdict(per_seed, 1.0, equivalence=True).verdict == HOLDS  # 90 %: [-0.04, 0.48]
    assert verdict(per_seed, 0.3, equivalence=True).verdict == NOT_SHOWN
    far = dict(enumerate(values + 5))
    assert verdict(far, 1.0, equivalence=True).verdict == OPPOSITE
    # The 95 % rule of the studies is kept where equivalence is not asked for.
    assert verdict(per_seed, 0.5).verdict == NOT_SHOWN  # 95 %: [-0.12, 0.56]
    assert verdict(per_seed, 0.5, equivalence=True).verdict == HOLDS  # 90 %: within
