"""The encoders shipped with the quick results (results/quick/encoders/encoders.tar): the
ones README's first command starts from, put in the cache by one command."""
import io
import json
import tarfile

import pytest

from cpcfl_tf.plan.presets import get_preset
from cpcfl_tf.plan.resolve import resolve
from cpcfl_tf.errors import UserError
from cpcfl_tf.methods.ssl import SSL_METHODS
from helpers import ROOT, script
from cpcfl_tf.plan.context import RunContext

ARCHIVE = ROOT / "results" / "quick" / "encoders" / "encoders.tar"


def _manifest(path=ARCHIVE):
    with tarfile.open(path) as tar:
        return json.load(tar.extractfile("manifest.json"))["encoders"]


def test_the_shipped_encoders_are_those_the_quick_table2_records_start_from():
    from cpcfl_tf.pretraining.pretrain import pretrain_folder

    assert ARCHIVE.stat().st_size <= 15 * 2 ** 20
    records = [json.loads(p.read_text()) for p in sorted((ROOT / "results/quick/table2")
                                                         .glob("*.json"))]
    started = {r["environment"]["starting_encoder"] for r in records
               if r["pretraining"] in SSL_METHODS}
    shipped = _manifest()
    assert {e["fingerprint"] for e in shipped} == started and len(started) == 3
    config = get_preset("quick")
    assert sorted(e["entry"] for e in shipped) == sorted(
        f"pretrained/{pretrain_folder(config.pretrain, config.data, SSL_METHODS[m], 0).name}"
        for m in ("simclr", "byol", "simsiam"))


def test_unpacked_they_are_found_by_every_script_without_pre_training(tmp_path, monkeypatch):
    from cpcfl_tf.clustered.starting import StartingEncoders
    from cpcfl_tf.records.files import weights_fingerprint

    monkeypatch.setenv("CPCFL_CACHE", str(tmp_path / "cache"))
    script("encoders").main(["unpack", str(ARCHIVE)])

    def no_images(config):
        raise AssertionError("pre-trained again")

    fingerprints = {e["entry"].split("/")[1].split("-")[0]: e["fingerprint"]
                    for e in _manifest()}
    encoders = StartingEncoders(unlabeled=no_images, context=RunContext(verbose=0))
    for method, fingerprint in fingerprints.items():
        config = get_preset("quick").with_overrides(federated={"pretraining": method})
        assert weights_fingerprint(encoders(resolve(config))) == fingerprint


def test_a_damaged_shipped_encoder_is_refused_in_one_line_and_nothing_is_cached(tmp_path,
                                                                               monkeypatch):
    damaged = tmp_path / "encoders.tar"
    with tarfile.open(ARCHIVE) as tar, tarfile.open(damaged, "w") as out:
        hit = False
        for member in tar.getmembers():
            data = tar.extractfile(member).read()
            if member.name.endswith("encoder.keras") and not hit:
                data, hit = data[:len(data) // 2] + bytes(64) + data[len(data) // 2 + 64:], True
            member.size = len(data)
            out.addfile(member, io.BytesIO(data))
    cache = tmp_path / "cache"
    monkeypatch.setenv("CPCFL_CACHE", str(cache))
    with pytest.raises(UserError, match="git checkout it"):
        script("encoders").main(["unpack", str(damaged)])
    assert not (cache / "pretrained").exists()
