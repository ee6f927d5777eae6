"""Every committed table is what its script makes of the committed run records: each
script is run again over a copy of its folder (every run "done before"; training and
pre-training are forbidden) and must write the same ``.csv`` and ``.md`` bytes."""
import shutil

import pytest

from helpers import ROOT, script

# Scripts whose tables come from their run records alone (others also read cached
# encoders or time things: datasets' relevance scores, linear_eval, pretraining_cost).
FROM_RECORDS = ("table2", "clusters", "encoder_training", "heads", "supervised", "clients",
                "resnet", "trials", "local_optimizer", "heterogeneity")
TABLES = sorted(folder for folder in (ROOT / "results").glob("*/*")
                if folder.name in FROM_RECORDS and (folder / f"{folder.name}.csv").exists())


def _forbidden(what):
    def stop(*args, **kwargs):
        raise AssertionError(f"{what}: a committed run is missing or its config changed")
    return stop


def test_tables_are_found():
    assert {f.name for f in TABLES} >= {"table2", "heads", "clusters", "clients"}


@pytest.mark.parametrize("folder", TABLES, ids=lambda f: str(f.relative_to(ROOT / "results")))
def test_a_committed_table_is_regenerated_byte_for_byte_from_its_records(folder, tmp_path,
                                                                          monkeypatch):
    import cpcfl_tf.contrastive.pretrain as pretrain
    import cpcfl_tf.federated.centralized as centralized
    import cpcfl_tf.federated.simulator as simulator
    from cpcfl_tf.federated.starting import StartingEncoders

    for module, name in ((simulator, "run_federated"), (centralized, "run_centralized"),
                         (pretrain, "pretrain")):
        monkeypatch.setattr(module, name, _forbidden(f"{module.__name__}.{name}"))
    monkeypatch.setattr(StartingEncoders, "__call__", _forbidden("a starting encoder"))
    copy = tmp_path / folder.name
    shutil.copytree(folder, copy,
                    ignore=shutil.ignore_patterns("*.csv", "*.md", "*.png", ".*"))
    script(folder.name).main(["--preset", folder.parent.name, "--out", str(copy)])
    for table in sorted(folder.glob("*.csv")) + sorted(folder.glob("*.md")):
        assert (copy / table.name).read_text() == table.read_text(), table.name
