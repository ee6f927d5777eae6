"""The run record's contract (docs/run-record.schema.json) holds for every committed
result and for what the kit writes now."""
import copy
import json

import pytest

from helpers import ROOT, run_record_errors

RECORDS = sorted(p for p in (ROOT / "results").rglob("*.json")
                 if {"rounds", "final"} <= set(json.loads(p.read_text())))


def test_results_hold_run_records():
    assert len(RECORDS) >= 100  # every table's runs; a glob that found none would pass below


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: str(p.relative_to(ROOT / "results")))
def test_every_committed_run_record_follows_the_schema(path):
    assert run_record_errors(json.loads(path.read_text())) == []


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: str(p.relative_to(ROOT / "results")))
def test_every_committed_record_reads_as_a_run_record_and_writes_back_the_same_bytes(path):
    from cpcfl_tf.records.record import read_record

    record = read_record(path)
    assert json.dumps(record.to_json(), indent=1) + "\n" == path.read_text()


def test_an_older_record_is_migrated_once_with_its_rounds_and_metrics_unchanged(tmp_path):
    import subprocess
    import sys

    from cpcfl_tf.records.record import read_record
    from cpcfl_tf.records.files import DamagedFile

    source = ROOT / "results/quick/table2/cp-cfl-byol.json"
    old = json.loads(source.read_text())
    for section in (old["config"], old["config"]["requested"]):
        section["pretrain"]["method"] = "simclr"  # what the kit wrote before
        del section["federated"]["local_optimizer"]  # a field added later
    path = tmp_path / "runs" / "cp-cfl-byol.json"
    path.parent.mkdir()
    path.write_text(json.dumps(old, indent=1) + "\n")
    with pytest.raises(DamagedFile, match="migrate_records.py"):
        read_record(path)
    script = [sys.executable, str(ROOT / "tools/migrate_records.py")]
    done = subprocess.run(script + [str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0 and "1 migrated" in done.stdout, done.stdout + done.stderr
    assert path.read_text() == source.read_text()
    again = subprocess.run(script + ["--check", str(tmp_path)], capture_output=True, text=True)
    assert again.returncode == 0 and "1 already current" in again.stdout


@pytest.mark.parametrize("break_it,where", [
    (lambda r: r["final"].update(accuracy=1.5), "$.final.accuracy"),
    (lambda r: r["final"].pop("ari"), "$.final: 'ari' is a required property"),
    (lambda r: r.update(method="fedprox"),  # unnamed
     "$.environment: 'plugins' is a required property"),
    (lambda r: r.update(pretraining="barlow"), "$.environment: 'plugins' is a required property"),
    (lambda r: r["rounds"][0].update(round=0), "$.rounds[0].round"),
    (lambda r: r["rounds"].pop(0), "not 1..T"),
    (lambda r: r["rounds"][1]["cluster_ids"].pop(), "one id per client"),
    (lambda r: r["clients"][0]["train_class_counts"].update({"3": "20"}),
     "train_class_counts['3']: '20' is not of type 'integer'"),
    (lambda r: r["seeds"].update(data=True), "$.seeds.data"),
])
def test_a_broken_record_is_caught(break_it, where):
    record = copy.deepcopy(json.loads((ROOT / "results/quick/table2/cp-cfl-simclr.json")
                                      .read_text()))
    assert run_record_errors(record) == []
    break_it(record)
    errors = run_record_errors(record)
    assert errors and any(where in e for e in errors), errors


def test_a_plugins_method_is_a_record_when_its_environment_names_the_plugin():
    record = copy.deepcopy(json.loads((ROOT / "results/quick/table2/cp-cfl-simclr.json")
                                      .read_text()))
    record.update(method="my-cfl", pretraining="barlow")
    record["environment"]["plugins"] = {"method my-cfl": "my-package 0.1",
                                        "ssl_method barlow": "my-package 0.1"}
    assert run_record_errors(record) == []
    record["environment"]["plugins"] = {"method my-cfl": 1}
    assert any("$.environment.plugins" in e for e in run_record_errors(record))


def _attempted_rounds(federated: dict, restarts: int) -> int:
    """Rounds whose bytes a run sent: its own, and per failed attempt the rounds until its
    failure test, Tc (CP-CFL+restart's; resolved, IFCA's is 0) + ``restart_round``."""
    return federated["rounds"] + restarts * (federated["head_rounds"] + federated["restart_round"])


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: str(p.relative_to(ROOT / "results")))
def test_every_committed_record_reports_what_its_rounds_and_clients_say(path):
    """``final`` is the last round; the ARI is recomputed from the cluster ids and the true
    groups (scikit-learn, clients that have taken part); bytes are the protocol's: N models
    (less the part a client keeps) down and one up per participant and round, failed IFCA
    attempts included (docs/run-record.md)."""
    import numpy as np
    from sklearn.metrics import adjusted_rand_score

    from cpcfl_tf.methods.federated import METHODS

    record = json.loads(path.read_text())
    final, fl = record["final"], record["config"]["federated"]
    if not record["rounds"]:  # a centralized baseline: no rounds, nothing sent
        assert fl["method"] == "centralized" and final["bytes_down"] == final["bytes_up"] == 0
        return
    last = record["rounds"][-1]
    for key in set(last) - {"round", "cluster_ids"} - {"replies", "failed_partitions",
                                                       "split_test", "selection"}:
        assert final[key] == last[key], key
    if record["clients"]:  # the Flower server never sees the true groups
        groups = np.array([c["group"] for c in record["clients"]])
        ids = np.array(last["cluster_ids"])
        took_part = ids >= 0
        assert final["ari"] == pytest.approx(adjusted_rand_score(groups[took_part],
                                                                 ids[took_part]))
    participants = max(1, round(fl["participation"] * record["config"]["partition"]
                                ["num_clients"]))
    rounds = _attempted_rounds(fl, final["restarts"])
    method = METHODS[fl["method"]]
    rule = method.rule
    # a client sends the shared model less the part it keeps of its own (FedPer, FedRep,
    # LG-FedAvg); Ditto's personal model lies beside the shared one, which goes whole
    num_clients = record["config"]["partition"]["num_clients"]
    kept = 0 if method.keeps == "model" else final.get("bytes_kept", 0)
    assert kept % num_clients == 0
    size = final["model_bytes"] - kept // num_clients
    # N down when the client chooses (CP-CFL+features too: only its first choice after Tc
    # is the server's), its own model when the server assigns, none alone
    sent = (0 if not rule.communicates else 1 if rule.server_assigns
            else fl["num_clusters"])
    assert final["bytes_down"] == rounds * participants * sent * size
    # what was sent besides weights (PACFL's subspaces) is in bytes_up too
    assert final["bytes_up"] == rounds * participants * size * min(1, sent) + final.get(
        "bytes_other", 0)
