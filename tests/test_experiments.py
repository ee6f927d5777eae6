"""The experiment scripts end to end on the smoke preset, and their error contract."""
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cpcfl_tf.plan.presets import get_preset
from cpcfl_tf.plan.resolve import resolve
from cpcfl_tf.errors import UserError
from helpers import ROOT, SCRIPT_FOLDERS, script, script_path
from cpcfl_tf.plan.context import RunContext


def run(name, *args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.run([sys.executable, str(script_path(name)), *args],
                          capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)


def test_pretraining_cost_writes_rows_keeps_them_and_refuses_to_mix(tmp_path, capsys):
    cost = script("pretraining_cost")
    cost.main(["--preset", "smoke", "--out", str(tmp_path), "--encoders", "cnn", "--repeats", "1"])
    row = json.loads((tmp_path / "cnn.json").read_text())
    assert row["steps_per_epoch"] == 697 // 128 and row["seconds_per_epoch"] > 0
    assert abs(row["gflops_96"] - 0.1648) < 0.001 and row["paper_seconds_per_epoch"] == 23
    summary = json.loads((tmp_path / "pretraining_cost.json").read_text())
    assert summary["experiment"] == "pretraining_cost" and summary["environment"]["tensorflow"]
    assert "| cnn | 128 | 32 |" in (tmp_path / "pretraining_cost.md").read_text()

    cost.main(["--preset", "smoke", "--out", str(tmp_path), "--encoders", "cnn", "--repeats", "1"])
    assert "kept the earlier measurement" in capsys.readouterr().out
    before = (tmp_path / "cnn.json").read_text()
    with pytest.raises(UserError, match="other settings; pass --force"):
        cost.main(["--preset", "smoke", "--out", str(tmp_path), "--encoders", "cnn",
                   "--repeats", "2"])
    assert (tmp_path / "cnn.json").read_text() == before


def test_benchmark_prints_both_step_times(tmp_path, capsys):
    script("benchmark_pretraining").main(["--preset", "smoke", "--out", str(tmp_path),
                                          "--repeats", "1", "--epoch-images", "1000"])
    printed = capsys.readouterr().out
    for key in ("contrastive_step_seconds:", "encoder_step_seconds:", "overhead:",
                "seconds_per_epoch:"):
        assert key in printed
    record = json.loads(next(tmp_path.glob("simclr-cnn-32px-b128.json")).read_text())
    assert record["overhead"] == pytest.approx(
        record["contrastive_step_seconds"] / record["encoder_step_seconds"] - 1)


def test_linear_eval_scores_random_and_pretrained_encoders(tmp_path):
    script("linear_eval").main(["--preset", "smoke", "--out", str(tmp_path),
                                "--methods", "simclr"])
    record = json.loads((tmp_path / "linear_eval.json").read_text())
    assert [r["pretraining"] for r in record["rows"]] == ["none", "simclr"]
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in record["rows"])
    assert record["proxy"] == {"train": "digits:train[697:]", "test": "digits:test"}
    assert Path(record["rows"][1]["cache"], "encoder.keras").exists()
    # The encoder's bits, named as a run record names the encoder it started from.
    from cpcfl_tf.clustered.starting import StartingEncoders
    from cpcfl_tf.records.files import weights_fingerprint

    config = get_preset("smoke").with_overrides(federated={"pretraining": "simclr"})
    assert record["rows"][1]["encoder_fingerprint"] == weights_fingerprint(
        StartingEncoders(context=RunContext(verbose=0))(resolve(config)))


@pytest.mark.parametrize("name,args,message", [
    ("pretraining_cost", ["--preset", "huge"], "invalid choice"),
    ("pretraining_cost", ["--preset", "smoke", "--encoders", "vgg"], "argument --encoders: unknown vgg"),
    ("linear_eval", ["--preset", "smoke", "--methods", "moco"], "--methods"),
    ("benchmark_pretraining", ["--preset", "smoke", "--image-size", "16"], "at least 32"),
    ("benchmark_simulator", ["--clusters", "0"], "--clusters >= 1"),
    ("encoders", ["pack", "--results", "nowhere"], "--results nowhere is not a folder"),
])
def test_bad_script_input_is_one_line_and_exit_2(tmp_path, name, args, message):
    proc = run(name, *args, "--out", str(tmp_path / "out"))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr


@pytest.mark.parametrize("name,args,message", [
    ("shape", ["--package", "nowhere"], "--package nowhere: no package there"),
    ("shape", ["--top", "0"], "--top must be >= 1"),
    ("suite_times", ["--cpu", "nowhere.jsonl"], "no such CPU log: nowhere.jsonl"),
    ("suite_times", ["--cpu", "a.jsonl", "b.jsonl"], "--cpu takes one CPU log, got 2"),
    ("suite_times", ["--workers", "a.jsonl", "b.jsonl"], "--workers takes one CPU log, got 2"),
    ("suite_times", ["--cpu", "--workers", "a.jsonl"], "give one of them"),
])
def test_bad_tool_input_is_one_line_and_exit_2(name, args, message):
    proc = run(name, *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in proc.stderr


HELP_CHILD = """
import contextlib, io, json, runpy, sys
said = {}
for path in sys.argv[1:]:
    sys.argv = [path, "--help"]  # as `python PATH --help` runs it
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            runpy.run_path(path, run_name="__main__")
            code = "no exit"
        except SystemExit as stop:
            code = stop.code
    said[path] = [code, out.getvalue()]
print(json.dumps(said))
"""


def test_every_script_has_help():
    # Each script run as `python PATH --help` runs it (__main__, its own sys.argv), all in
    # one process: a process each cost a second of CPU apiece for forty of them.
    paths = sorted(p for folder in SCRIPT_FOLDERS for p in (ROOT / folder).glob("*.py"))
    assert {p.parent.name for p in paths} == set(SCRIPT_FOLDERS)
    proc = subprocess.run([sys.executable, "-c", HELP_CHILD, *map(str, paths)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = json.loads(proc.stdout.splitlines()[-1])
    for path in paths:
        code, stdout = said[str(path)]
        assert code in (0, None), (path.stem, code)
        assert stdout.startswith(f"usage: python {path.parent.name}/{path.stem}.py"), path.stem
        if path.stem not in ("migrate_records", "compare", "results_unchanged", "encoders",
                             "update_schema", "plot_selection", "suite_times",
                             "shape", "round_stages", "code_metrics"):  # no runs kept
            assert "--preset" in stdout and "--resume" in stdout, path.stem


def test_every_study_of_experiments_is_rebuilt_by_results_unchanged():
    # tools/results_unchanged.py runs all.py's scripts and those it names beyond them: a
    # study missing from both would never be checked against its committed report.
    keep_none = {"all", "claims", "compare", "run"}  # a driver, the judge (run apart), tools
    measures = {"paper_shape"}  # seconds and memory: no two runs write the same bytes
    studies = {p.stem for p in (ROOT / "experiments").glob("*.py")} - keep_none - measures
    assert studies == set(script("all").SCRIPTS) | set(script("results_unchanged").BEYOND)


def test_results_unchanged_compares_the_trees_files_but_a_runs_checkpoint(tmp_path):
    tool = script("results_unchanged")
    for tree, text in (("a", "one"), ("b", "two")):
        (tmp_path / tree / "study").mkdir(parents=True)
        (tmp_path / tree / "study" / "report.md").write_text(text)
        (tmp_path / tree / "study" / ".run.ckpt.npz").write_text(text)  # a run under way's
    (tmp_path / "b" / "study" / "new.csv").write_text("")
    assert tool.differences(tmp_path / "a", tmp_path / "b") == [
        "changed study/report.md", "new study/new.csv"]


def test_results_unchanged_rebuilds_a_partial_study_from_its_records_alone(tmp_path,
                                                                          monkeypatch):
    # A study with --report is rebuilt from the runs its folder holds, even where its dry
    # run would make the rest (a standard study under way); one without it is asked first.
    tool = script("results_unchanged")
    for name in ("cfl_families", "local_optimizer"):
        (tmp_path / "results" / "standard" / name).mkdir(parents=True)
    asked, ran = [], []
    monkeypatch.setattr(tool, "not_checkable",
                        lambda name, *_: asked.append(name) or f"{name}: would make 1")
    monkeypatch.setattr(tool, "_must_run", lambda name, args, _: ran.append((name, args)))
    unchecked = tool.rebuild("standard", tmp_path, ["cfl_families", "local_optimizer"])
    assert asked == ["local_optimizer"] and unchecked == ["local_optimizer: would make 1"]
    assert ran == [("cfl_families", ["--preset", "standard", "--resume", "--report"])]


def test_a_script_is_loaded_registered_so_its_dataclasses_see_their_module(tmp_path):
    # One loader serves all.py, results_unchanged and the tests: the module is in
    # sys.modules while it runs (without it, dataclasses fails on a ClassVar annotated as
    # a string), and a missing script is a one-line UserError.
    from cpcfl_tf.running.script import load_script

    path = tmp_path / "study_x.py"
    path.write_text("from __future__ import annotations\nimport dataclasses, typing\n"
                    "@dataclasses.dataclass\nclass Row:\n    kept: typing.ClassVar[int] = 1\n"
                    "    value: int = 0\n")
    module = load_script(path)
    assert sys.modules["experiments_study_x"] is module
    assert [f.name for f in dataclasses.fields(module.Row)] == ["value"]
    with pytest.raises(UserError, match="no script at .*nope.py"):
        load_script(tmp_path / "nope.py")


def test_benchmark_simulator_runs_both_loops(tmp_path, capsys):
    script("benchmark_simulator").main(["--out", str(tmp_path), "--clients", "3", "--rounds", "2",
                                        "--baseline-rounds", "1"])
    printed = capsys.readouterr().out
    assert "seconds_per_round:" in printed and "speedup:" in printed
    record = json.loads((tmp_path / "c3-n3-32px-auto.json").read_text())
    assert len(record["simulator_round_seconds"]) == 2 and len(record["baseline_round_seconds"]) == 1
    table = (tmp_path / "benchmark_simulator.md").read_text()
    assert f"| {record['seconds_per_round']:.2f} |  | {record['baseline_seconds_per_round']:.1f} |" in table


def test_benchmark_times_many_clients_against_a_reference_round_in_the_same_run(tmp_path):
    script("benchmark_simulator").main([
        "--out", str(tmp_path), "--clients", "4", "--participation", "0.5", "--eval-every", "2",
        "--reference-clients", "2", "--reference-rounds", "2", "--rounds", "3",
        "--baseline-rounds", "0"])
    record = json.loads((tmp_path / "c4-n3-32px-auto-p0.5-e2-vs2.json").read_text())
    assert record["eval_every"] == 2 and record["reference_clients"] == 2
    assert len(record["reference_round_seconds"]) == 2
    assert len(record["simulator_round_seconds"]) == 3
    assert record["cost_vs_reference"] == pytest.approx(
        record["seconds_per_round"] / record["reference_seconds_per_round"])
    assert "x 2 clients'" in (tmp_path / "benchmark_simulator.md").read_text()


def test_flower_simulation_measures_every_process_of_a_run_and_tabulates_both_drivers(
        tmp_path):
    bench = script("flower_simulation")
    # a run's processes are found by the mark they inherit: a child holding 300 MB counts
    code = ("import subprocess, sys; subprocess.run([sys.executable, '-c', "
            "'import time; b = bytearray(300 << 20); b[::4096] = b\"x\" * len(b[::4096]); "
            "time.sleep(2)'])")
    seconds, peak, status = bench.measured([sys.executable, "-c", code], dict(os.environ),
                                           "t1", tmp_path / "log")
    assert status == 0 and seconds >= 2 and 300 <= peak < 2000
    sim = {"seconds_per_round": 1.0, "wall_seconds": 10.0, "peak_pss_mb": 900.0,
           "cluster_ids": [[0, 1]]}
    study = {"run": {"preset": "quick", "method": "ifca", "rounds": 3, "set": ""},
             "runs": {"15": {"simulator": sim, "engine": {**sim, "seconds_per_round": 4.0}}},
             "environment": {"cpu": "Some CPU (avx2)"}}
    (tmp_path / "x.json").write_text(json.dumps(study))
    assert "| Some CPU (avx2) | quick | 15 | ifca | 3 |  | 1.0 | 10 | 900 | 4.0 | 10 | 900 | yes |" \
        in bench.report(tmp_path)


@pytest.mark.parametrize("flag", [["--xla"], ["--set", "federated.jit_compile=true"]])
def test_benchmark_xla_is_the_jit_compile_setting(tmp_path, flag):
    script("benchmark_simulator").main(["--out", str(tmp_path), "--clients", "2", "--rounds", "2",
                                        "--baseline-rounds", "0", *flag])
    assert json.loads((tmp_path / "c2-n3-32px-auto-xla.json").read_text())["xla"] is True


def test_the_kit_runs_tensorflow_with_onednn_kernels():
    import platform

    from cpcfl_tf.records.environment import environment

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("oneDNN's switch is for x86 CPUs")
    assert environment()["onednn"] is True  # cpcfl_tf asks for them before TF is imported


def test_speed_study_times_the_local_steps_kernels_against_the_peak(tmp_path, capsys):
    study_script = script("speed_study")
    study_script.main(["--out", str(tmp_path), "--clients", "2"])
    (path,) = tmp_path.glob("*.json")
    study = json.loads(path.read_text())
    work = study["round_flops"]
    assert work["total"] == work["training"] + work["selection"] + work["evaluation"]
    assert work["evaluation"] == work["forward_per_image"] * 2 * 50
    assert work["training"] == 3 * 3 * work["evaluation"]  # 3 epochs, backward = 2 forwards
    assert study["peak"]["matmul_gflops"] > 0
    kernels = study["kernels"]
    assert kernels["batches"] == [32, 18]  # 50 images per client in batches of 32
    first, *rest = [c for c in kernels["convolutions"] if c["batch"] == 32]
    assert "input_gradient" not in first and all("input_gradient" in c for c in rest)
    h, w, cin = rest[0]["input"]
    oh, ow, cout = rest[0]["output"]
    assert rest[0]["gflop"] == pytest.approx(2 * 32 * oh * ow * cout * 9 * cin * 2 / 1e9)
    for conv in rest:
        ms = conv["forward"]["ms"]
        assert conv["forward"]["gflops"] == pytest.approx(conv["gflop"] / ms * 1e3)
    layouts = kernels["layouts"]
    assert layouts["kit"]["max_relative_difference"] == 0.0  # the kit's own step
    for other in ("last_conv_as_matmul", "im2col_matmul"):  # same sums, another order
        assert 0.0 < layouts[other]["max_relative_difference"] < 1e-4
    # the clients' convolutions as one grouped op: each client's own kernels, not another's
    assert layouts["grouped_convolution"]["max_relative_difference"] < 1e-4
    # bfloat16 keeps 8 bits of mantissa: off by about 2^-8 per op, not by a wrong layout
    assert 1e-4 < layouts["bfloat16"]["max_relative_difference"] < 0.1
    for layout in layouts.values():
        assert set(layout["ms"]) == {"32", "18"}
    text = (tmp_path / "speed_study.md").read_text()
    assert "| conv4 | 3x3x192 -> 1x1x256 | 18 |" in text and "variant" not in text
    capsys.readouterr()  # the study's own progress lines
    with pytest.raises(SystemExit) as stop:
        study_script.main(["--out", str(tmp_path / "x"), "--clients", "0"])
    assert stop.value.code == 2 and not (tmp_path / "x").exists()
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and "--clients" in error[0]


def test_paper_shape_runs_the_paper_preset_on_a_stand_in_and_times_each_stage(tmp_path):
    before = os.environ["CPCFL_CACHE"]  # the suite's
    script("paper_shape").main([
        "--out", str(tmp_path), "--scale", "0.02",  # 100 / 160 / 2,000 images
        "--set", "data.image_size=32", "partition.num_clients=3",
        "partition.class_counts=8,8,2,2", "pretrain.batch_size=256"])
    study = json.loads((tmp_path / "paper_shape.json").read_text())
    assert study["stand_in"]["splits"] == {"train": 100, "test": 160, "unlabelled": 2000}
    stages = study["stages"]
    assert [s["stage"].split()[0] for s in stages] == ["load", "pre-train", "load", "federated"]
    assert all(s["seconds"] > 0 and s["peak_rss_mb"] >= s["rss_before_mb"] for s in stages)
    assert stages[0]["array_mb"] == pytest.approx(2000 * 32 * 32 * 3 / 2**20)
    record = json.loads((tmp_path / "runs" / "cp-cfl-simclr.json").read_text())
    assert record["config"]["preset"] == "paper" and record["config"]["data"]["client_dataset"] == "stl10"
    assert record["config"]["pretrain"]["epochs"] == 1 and len(record["rounds"]) == 2
    assert "| federated CP-CFL (SimCLR), 2 rounds |" in (tmp_path / "paper_shape.md").read_text()
    assert list((tmp_path / "cache" / "pretrained").iterdir())  # not in the shared cache
    # ... and the caller's cache is its own again (it once stayed the stand-in's, and every
    # later run of the process, the Flower apps it starts included, cached there).
    assert os.environ["CPCFL_CACHE"] == before


def test_suite_times_sums_each_files_durations_by_hand(tmp_path, capsys):
    log = tmp_path / "suite.log"
    log.write_text("=== slowest durations ===\n"
                   "12.50s call     tests/test_a.py::test_one\n"
                   "2.50s setup    tests/test_a.py::test_one\n"
                   "4.00s call     tests/test_b.py::test_two[x]\n"
                   "0.50s teardown tests/test_b.py::test_two[x]\n"
                   "1 passed in 20.00s\n")
    script("suite_times").main([str(log), "--names", "now"])
    assert capsys.readouterr().out.splitlines() == [
        "| file | now |", "|---|---|", "| `test_a.py` | 15 s |", "| `test_b.py` | 4 s |",
        "| the other files | 0 s |", "| all files | 20 s |"]


def test_suite_times_sums_each_files_cpu_by_hand(tmp_path, capsys):
    log = tmp_path / "cpu.jsonl"
    log.write_text('{"test": "tests/test_a.py::one", "worker": 1.25, "processes": 10.0}\n'
                   '{"test": "tests/test_b.py::two[x]", "worker": 3.0, "processes": 0.0}\n'
                   '{"test": "tests/test_a.py::three", "worker": 0.75, "processes": 2.0}\n')
    script("suite_times").main(["--cpu", str(log)])
    assert capsys.readouterr().out.splitlines() == [
        "| file | CPU-s in the worker | in its processes | both |", "|---|---|---|---|",
        "| `test_a.py` | 2 | 12 | 14 |", "| `test_b.py` | 3 | 0 | 3 |",
        "| the other files | 0 | 0 | 0 |", "| all files | 5 | 12 | 17 |"]


def test_suite_times_draws_each_workers_timeline_by_hand(tmp_path, capsys):
    # Two workers: 7 ran test_a.py then test_c.py, ending 30 s after the first test ended;
    # 9 ran test_b.py, ending at 10 s, then its core waited 20 s for worker 7.
    log = tmp_path / "cpu.jsonl"
    log.write_text(
        '{"test": "tests/test_a.py::one", "worker": 1.0, "processes": 2.0, "pid": 7, "end": 100.0}\n'
        '{"test": "tests/test_b.py::two", "worker": 4.0, "processes": 0.0, "pid": 9, "end": 104.0}\n'
        '{"test": "tests/test_a.py::three", "worker": 1.0, "processes": 0.0, "pid": 7, "end": 108.0}\n'
        '{"test": "tests/test_b.py::four", "worker": 5.0, "processes": 0.5, "pid": 9, "end": 110.0}\n'
        '{"test": "tests/test_c.py::five", "worker": 20.0, "processes": 0.0, "pid": 7, "end": 130.0}\n')
    script("suite_times").main(["--workers", str(log)])
    assert capsys.readouterr().out.splitlines() == [
        "| worker | files, in order (second each ended) | last test ended | then waited | CPU-s |",
        "|---|---|---|---|---|",
        "| 1 | `test_a.py` (8 s), `test_c.py` (30 s) | 30 s | 0 s | 24 |",
        "| 2 | `test_b.py` (10 s) | 10 s | 20 s | 10 |"]
    old = tmp_path / "old.jsonl"  # written before the lines carried pid and end
    old.write_text('{"test": "tests/test_a.py::one", "worker": 1.0, "processes": 2.0}\n')
    with pytest.raises(SystemExit) as stopped:
        script("suite_times").main(["--workers", str(old)])
    assert stopped.value.code == 2 and "has no worker timeline" in capsys.readouterr().err


def test_each_test_writes_its_cpu_seconds_where_the_suite_is_told(tmp_path):
    """tests/conftest.py, with $CPCFL_SUITE_CPU: a test that burns CPU in a process it
    runs is charged for it there, not in its worker."""
    import subprocess

    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (tests / "test_burn.py").write_text(
        "import subprocess, sys\n"
        "def test_burn():\n"
        "    subprocess.run([sys.executable, '-c', 'sum(range(30_000_000))'], check=True)\n")
    log = tmp_path / "cpu.jsonl"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), str(tests)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, CPCFL_SUITE_CPU=str(log)))
    assert proc.returncode == 0, proc.stdout[-2000:]
    (entry,) = [json.loads(line) for line in log.read_text().splitlines()]
    assert entry["test"] == "tests/test_burn.py::test_burn"
    assert entry["processes"] > 0.2 and entry["worker"] < entry["processes"]


def test_round_stages_adds_up_each_stages_time_and_puts_the_functions_back():
    """benchmarks/round_stages.py times a stage by wrapping its function: the wrapper
    returns what the function returns, counts each call, and the function is the kit's
    own again after the block."""
    from cpcfl_tf.clustered import algorithm

    stages = script("round_stages")
    real = algorithm.aggregate
    state = algorithm.ServerState(0, [[np.zeros(2, np.float32)]], 0)
    seconds, calls = {}, {}
    with stages.timed_stages(seconds, calls):
        assert algorithm.aggregate is not real
        new = algorithm.aggregate(state, [np.array([[1.0, 3.0], [3.0, 5.0]], np.float32)],
                                  np.array([0, 0]), [1.0, 3.0])
    assert algorithm.aggregate is real
    np.testing.assert_allclose(new.models[0][0], [2.5, 4.5])  # (1*[1,3] + 3*[3,5]) / 4
    assert calls == {"aggregation": 1} and seconds["aggregation"] > 0


def test_frozen_features_study_pairs_each_seeds_runs_and_judges_within_the_seeds_spread(tmp_path):
    """The summary by hand: differences +1, 0, -1 points; the margin is the default
    runs' standard deviation (2 points); TOST p = P(T_2 > 0.02 / (0.01 / sqrt 3))."""
    from scipy import stats

    study = script("frozen_features")
    result = study.summary([0.90, 0.92, 0.88], [0.91, 0.92, 0.87])
    assert result["margin"] == pytest.approx(0.02)
    assert result["difference_mean"] == pytest.approx(0.0, abs=1e-12)
    half = stats.t.ppf(0.975, 2) * 0.01 / 3 ** 0.5
    assert result["difference_interval"] == pytest.approx([-half, half])
    assert result["equivalence_p"] == pytest.approx(stats.t.sf(0.02 / (0.01 / 3 ** 0.5), 2))
    assert result["within_spread"] is True  # p = 0.037
    assert study.summary([0.90, 0.92, 0.88], [0.80, 0.83, 0.77])["within_spread"] is False
    names = [s.name for s in study.specs(3, 2)]
    assert names == ["cp-cfl-simclr-seed3", "cp-cfl-simclr-frozen-seed3",
                     "cp-cfl-simclr-seed4", "cp-cfl-simclr-frozen-seed4"]
    assert all(s.pretrain == {"seed": 3} for s in study.specs(3, 2))  # one encoder
    assert [s.federated for s in study.specs(3, 1)] == [{}, {"frozen_features": True}]
