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


@pytest.mark.parametrize("break_it,where", [
    (lambda r: r["final"].update(accuracy=1.5), "$.final.accuracy"),
    (lambda r: r["final"].pop("ari"), "missing 'ari'"),
    (lambda r: r.update(method="fedprox"), "$.method"),
    (lambda r: r["rounds"][0].update(round=0), "$.rounds[0].round"),
    (lambda r: r["rounds"].pop(0), "not 1..T"),
    (lambda r: r["rounds"][1]["cluster_ids"].pop(), "one id per client"),
    (lambda r: r["clients"][0]["train_class_counts"].update({"3": "20"}), "train_class_counts.3"),
    (lambda r: r["seeds"].update(data=True), "$.seeds.data"),
])
def test_a_broken_record_is_caught(break_it, where):
    record = copy.deepcopy(json.loads((ROOT / "results/quick/table2/cp-cfl-simclr.json")
                                      .read_text()))
    assert run_record_errors(record) == []
    break_it(record)
    errors = run_record_errors(record)
    assert errors and any(where in e for e in errors), errors
