"""tests/parallel.py, the suite on every core: every file runs once, failures show."""
import subprocess
import sys

from helpers import ROOT

RUNNER = ROOT / "tests" / "parallel.py"
sys.path.insert(0, str(RUNNER.parent))
import parallel  # noqa: E402


def test_every_test_file_runs_in_exactly_one_process():
    groups = parallel.jobs()
    files = [f for group in groups for f in group]
    assert sorted(files) == sorted(p.name for p in RUNNER.parent.glob("test_*.py"))
    assert groups[0] == ["test_flower.py"]  # the longest starts first
    assert groups[-1] == parallel.FAST  # the quick files share one process


def test_a_failing_file_fails_the_run_and_shows_its_output(tmp_path):
    (tmp_path / "test_good.py").write_text("def test_one():\n    assert True\n")
    (tmp_path / "test_new.py").write_text("def test_two():\n    assert True\n")
    (tmp_path / "test_bad.py").write_text("def test_three():\n    assert 1 == 2, 'ONE IS NOT TWO'\n")

    def run(*args):
        return subprocess.run([sys.executable, str(RUNNER), "--folder", str(tmp_path), "-n", "2",
                               *args], capture_output=True, text=True, timeout=300)

    failed = run()
    assert failed.returncode == 1
    assert "ONE IS NOT TWO" in failed.stdout  # a failing file's whole output
    assert "test_good.py: 1 passed" in failed.stdout
    assert "3 pytest processes, 2 at a time: 1 failed" in failed.stdout
    passed = run("-k", "one or two")
    assert passed.returncode == 0, passed.stdout
    assert "3 pytest processes, 2 at a time: all passed" in passed.stdout
    assert run("-k", "nothing_matches").returncode == 5  # as pytest says it
