"""experiments/encoder_selection.py: the paper's encoder selection, and runs that start
from the selected encoders (--encoders-from)."""
import json
from pathlib import Path

import pytest

from cpcfl_tf.plan.presets import get_preset
from cpcfl_tf.plan.resolve import resolve
from cpcfl_tf.errors import UserError
from cpcfl_tf.running.runner import Runner, RunSpec
from helpers import ROOT, script

from test_experiments import run
from cpcfl_tf.plan.context import RunContext

README = Path(__file__).parents[1] / "results" / "README.md"
README_BEFORE: list[bytes] = []


@pytest.fixture(scope="module")
def selection(tmp_path_factory):
    out = tmp_path_factory.mktemp("selection")
    README_BEFORE.append(README.read_bytes())
    script("encoder_selection").main(["--preset", "smoke", "--out", str(out), "--methods",
                                      "simclr", "--seeds", "2", "--set", "federated.rounds=2",
                                      "data.pretrain_split=train[:256]", "--linear-epochs", "10"])
    return out, json.loads((out / "encoder_selection.json").read_text())


def test_every_candidate_is_scored_and_the_best_by_linear_accuracy_is_selected(selection):
    from cpcfl_tf.clustered.starting import StartingEncoders
    from cpcfl_tf.records.files import weights_fingerprint

    out, stored = selection
    rows = stored["candidates"]
    assert [(r["seed"], r["shown"]["projector_dim"]) for r in rows] == [
        (0, 256), (0, 512), (1, 256), (1, 512)]
    assert all(0 <= r[k] <= 1 for r in rows for k in ("linear_accuracy", "knn_accuracy"))
    for seed in (0, 1):
        best = max((r for r in rows if r["seed"] == seed), key=lambda r: r["linear_accuracy"])
        assert stored["selected"][str(seed)]["simclr"]["settings"] == best["settings"]
    # the paper's candidate is the very encoder every other script starts from
    paper = next(r for r in rows if r["seed"] == 1 and r["paper"])
    assert paper["settings"] == {"projector_dim": None}
    config = get_preset("smoke").with_overrides(seed=1, federated={"pretraining": "simclr",
                                                                   "rounds": 2},
                                                data={"pretrain_split": "train[:256]"})
    assert paper["fingerprint"] == weights_fingerprint(
        StartingEncoders(context=RunContext(verbose=0))(resolve(config)))
    # CP-CFL from the selected encoder: the same run where the paper's value won
    for seed in (0, 1):
        pick = stored["selected"][str(seed)]["simclr"]
        other = out / f"seed{seed}-cp-cfl-simclr-selected.json"
        assert other.exists() == (not pick["paper"])
        if other.exists():
            record = json.loads(other.read_text())
            assert record["config"]["pretrain"]["projector_dim"] == 512
    assert stored["cp_cfl"]["simclr"]["difference"]["n"] == 2
    assert "paper's value picked" in (out / "encoder_selection.md").read_text()


def test_runs_start_from_the_selected_encoders_with_encoders_from(selection, tmp_path):
    out, stored = selection
    from cpcfl_tf.running.cli import read_selection

    runner = Runner("table2", get_preset("smoke"), tmp_path, context=RunContext(verbose=0, selection=read_selection(out / "encoder_selection.json")))
    for seed in (0, 1):
        config = runner.config_of(RunSpec("cp-cfl-simclr", "cp-cfl", "simclr", seed=seed))
        assert config.pretrain.settings("simclr")["projector_dim"] == \
            stored["selected"][str(seed)]["simclr"]["settings"]["projector_dim"]
        none = runner.config_of(RunSpec("ifca-none", "ifca", "none", seed=seed))
        assert none.pretrain.options is None
    with pytest.raises(UserError, match="selected no byol encoder for seed 0"):
        runner.config_of(RunSpec("cp-cfl-byol", "cp-cfl", "byol", seed=0))
    with pytest.raises(UserError, match="not an encoder selection"):
        read_selection(out / "seed0-cp-cfl-simclr.json")


@pytest.mark.parametrize("args,message", [
    (["--grid", "projector_dim=-3"], "--grid simclr.projector_dim must be a positive integer"),
    (["--methods", "byol", "--grid", "temperature=0.2"], "--grid temperature: byol has no setting"),
    (["--grid", "projector_dim"], "--grid takes SETTING=V1,V2"),
    (["--methods", "moco"], "--methods"),
])
def test_bad_selection_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, message):
    proc = run("encoder_selection", "--preset", "smoke", "--out", str(tmp_path / "out"), *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not (tmp_path / "out").exists()


def test_what_the_selection_shows_is_written_from_its_scores_and_verdicts(selection):
    from cpcfl_tf.evidence import selection as study

    def row(seed, width, linear, paper):
        settings = {"projector_dim": None if paper else width}
        return {"seed": seed, "method": "simclr", "settings": settings,
                "shown": {"projector_dim": width}, "paper": paper,
                "linear_accuracy": linear, "knn_accuracy": 0.5}

    rows = [row(0, 256, 0.70, True), row(0, 512, 0.72, False),
            row(1, 256, 0.74, True), row(1, 512, 0.71, False)]
    selected = study.choose(rows)
    runs = {"simclr": {"difference": {"mean": -0.5, "ci95": [-0.9, -0.1],
                                      "verdict": "opposite"}}}
    assert study.findings(rows, selected, runs) == [
        "SimCLR: the selection keeps the default projector_dim=256 (CP-CFL, Sec. "
        "\"Experimental settings\": 256) in 1 of 2 seeds and picks projector_dim=512 in 1. "
        "The best mean linear accuracy over the seeds is projector_dim=256's (0.7200; "
        "projector_dim=512: 0.7150). CP-CFL from the selected encoder is behind CP-CFL from "
        "the default one by the claims' rule (mean -0.50 points, 95 % CI [-0.90, -0.10])."]
    kept = [row(0, 256, 0.80, True), row(0, 512, 0.72, False)]
    assert study.findings(kept, study.choose(kept), runs)[0].endswith(
        "The selection kept the default in every seed, so CP-CFL starts from the same "
        "encoder and does not move.")
    # the report carries them; a study outside results/<preset>/ leaves the README alone
    out, _ = selection
    assert "What it shows (written from the tables above):\n\n- SimCLR: " in \
        (out / "encoder_selection.md").read_text()
    assert README.read_bytes() == README_BEFORE[0]


@pytest.mark.parametrize("preset", [p.name for p in (ROOT / "results").glob("*")
                                    if (p / "encoder_selection" / "candidates.json").exists()])
def test_a_committed_selection_is_its_kept_scores_and_records(preset):
    """The committed study's rows are the scores candidates.json keeps, the choice is the
    best of each seed, and each CP-CFL accuracy it reports is its record's."""
    import csv

    from cpcfl_tf.evidence.judge import final_accuracy
    from cpcfl_tf.evidence.selection import choose
    from cpcfl_tf.records.record import read_record

    folder = ROOT / "results" / preset / "encoder_selection"
    kept = json.loads((folder / "candidates.json").read_text())
    stored = json.loads((folder / "encoder_selection.json").read_text())
    with open(folder / "encoder_selection.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(stored["candidates"]) == len(kept)
    for row in rows:
        for key in ("linear_accuracy", "knn_accuracy"):
            assert float(row[key]) == kept[row["cache"]][key]
        assert row["fingerprint"] == kept[row["cache"]]["fingerprint"]
    assert stored["selected"] == {
        str(s): json.loads(json.dumps(per)) for s, per in
        choose(stored["candidates"]).items()}
    made = sorted(folder.glob("seed*-cp-cfl-*.json"))  # the runs the study made itself
    assert made
    for path in made:
        seed, method = path.stem.split("-")[0][4:], path.stem.split("-")[3]
        side = "selected" if path.stem.endswith("-selected") else "paper"
        assert stored["cp_cfl"][method][side][seed] == final_accuracy(read_record(path))
