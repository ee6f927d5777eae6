"""The command-line contract: bad input -> one stderr line, exit 2, nothing written."""
import json
import os
import subprocess
import sys

import pytest

from helpers import ROOT


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
