"""Interrupted at any moment: SIGKILL while a cache entry, a checkpoint or a result is
being written, or at a random moment, and the resumed run ends as an uninterrupted one."""
import json
import os
import subprocess
import sys

from helpers import script


def test_a_run_killed_at_any_moment_resumes_to_the_uninterrupted_record(tmp_path, monkeypatch):
    tool = script("kill_resume")
    drawn = tool.plans
    # The random moment is set far beyond the run's end (a loaded machine's seconds per
    # round, then a fast attempt): it must still kill, at the latest writing the result.
    monkeypatch.setattr(tool, "plans", lambda *a: [
        "moment:1:1000" if p.startswith("moment") else p for p in drawn(*a)])
    tool.main(["--preset", "smoke", "--kills", "4", "--out", str(tmp_path)])
    summary = json.loads((tmp_path / "kill_resume.json").read_text())
    assert summary["kills_survived"] == 4 and summary["final_exit"] == 0
    assert [k["kind"] for k in summary["kills"]] == ["cache entry", "checkpoint", "result",
                                                     "result"]
    assert summary["identical"] is True and summary["leftovers"] == []
    assert "identical to" in (tmp_path / "kill_resume.md").read_text()


def test_partial_files_of_dead_writers_are_removed_and_live_ones_kept(tmp_path):
    from cpcfl_tf.records.files import PARTIAL, prepare_out_dir, write_json

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / f".run.json{PARTIAL}{gone.pid}-x1.json"
    alive = tmp_path / f".run.json{PARTIAL}{os.getpid()}-x2.json"
    other = tmp_path / f".other.json{PARTIAL}{gone.pid}-x3.json"
    for path in (dead, alive, other):
        path.write_text("half")
    unpacking = tmp_path / f".unpack{PARTIAL}{gone.pid}-x4"  # tools/encoders.py's folder
    (unpacking / "pretrained").mkdir(parents=True)
    write_json(tmp_path / "run.json", {"ok": 1})  # cleans what was left for run.json
    assert not dead.exists() and alive.exists() and other.exists()
    prepare_out_dir(tmp_path)  # cleans the whole folder
    assert not other.exists() and not unpacking.exists() and alive.exists()
    assert json.loads((tmp_path / "run.json").read_text()) == {"ok": 1}
