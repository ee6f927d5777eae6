"""Reading back what the kit wrote: damage is one line naming the file and the fix, a
damaged cache entry is rebuilt, results are written with the user's umask."""
import io
import json
import os
import stat

import numpy as np
import pytest

from cpcfl_tf.plan.presets import get_preset
from cpcfl_tf.errors import UserError
from cpcfl_tf.records.files import DamagedFile, read_json, write_json
from cpcfl_tf.plan.resolve import resolve
from cpcfl_tf.methods.ssl import SSL_METHODS
from cpcfl_tf.plan.context import RunContext

SMOKE = get_preset("smoke")


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_files_get_the_permissions_the_umask_gives(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        path = write_json(tmp_path / "run.json", {"a": 1})
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == mode


@pytest.mark.parametrize("content", [b'{"rounds": [1, 2', b"\x00\x01binary", b""])
def test_a_damaged_json_is_one_line_naming_file_and_fix(tmp_path, content):
    path = tmp_path / "run.json"
    path.write_bytes(content)
    with pytest.raises(DamagedFile) as err:
        read_json(path, fix="delete it")
    message = str(err.value)
    assert "\n" not in message and str(path) in message and message.endswith("delete it")
    assert isinstance(err.value, UserError)  # scripts exit with status 2


def test_a_damaged_finished_run_stops_the_script_and_touches_nothing(tmp_path):
    from cpcfl_tf.running.runner import RunSpec, Runner

    runner = Runner("table2", SMOKE, tmp_path, context=RunContext(verbose=0))
    (tmp_path / "fedavg-none.json").write_text('{"experiment": "table2", "rou')
    (tmp_path / "ifca-none.json").write_text("kept")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    with pytest.raises(UserError, match=r"fedavg-none.json is damaged .*delete it to run it again"):
        runner.run(RunSpec("fedavg-none", "fedavg", "none"))
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CPCFL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.parametrize("damage", ["truncated encoder", "summary not json"])
def test_a_damaged_cached_encoder_is_pre_trained_again(cache, capsys, damage, encoder_cache):
    import shutil

    from cpcfl_tf.pretraining.pretrain import pretrained_encoder
    from cpcfl_tf.records.files import cache_at

    with cache_at(encoder_cache):  # the suite's smoke encoder, copied into this cache
        first = pretrained_encoder(SMOKE.pretrain, SMOKE.data, method=SSL_METHODS["simclr"], verbose=0)
    entry = shutil.copytree(first.out_dir, cache / "pretrained" / first.out_dir.name)
    if damage == "truncated encoder":
        target = entry / "encoder.keras"
        target.write_bytes(target.read_bytes()[:1000])
    else:
        target = entry / "pretrain.json"
        target.write_text("not json")
    capsys.readouterr()
    again = pretrained_encoder(SMOKE.pretrain, SMOKE.data, method=SSL_METHODS["simclr"], verbose=0)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{target.name} is damaged" in err[0]
    assert "pre-training it again" in err[0]
    assert again.out_dir == entry
    for a, b in zip(first.encoder.get_weights(), again.encoder.get_weights()):
        np.testing.assert_array_equal(a, b)  # the same seeded pre-training, rebuilt
    assert json.loads((entry / "pretrain.json").read_text())["meta"]


def test_a_damaged_supervised_encoder_is_pre_trained_again(cache, capsys):
    from cpcfl_tf.clustered.starting import StartingEncoders

    config = resolve(SMOKE.with_overrides(pretrain={"epochs": 1},
                                          federated={"pretraining": "supervised"}))
    first = StartingEncoders(context=RunContext(verbose=0)).supervised(config)
    (path,) = cache.rglob("encoder.npz")
    path.write_bytes(b"PK\x03\x04 truncated")
    again = StartingEncoders(context=RunContext(verbose=0)).supervised(config)
    assert capsys.readouterr().err.count("encoder.npz is damaged") == 1  # said once
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert len(StartingEncoders(context=RunContext(verbose=0)).supervised(config)) == len(first)


def test_cached_pretrained_encoders_are_loaded_without_reading_any_image(cache):
    from cpcfl_tf.pretraining.pretrain import load_pretrain_images
    from cpcfl_tf.clustered.starting import StartingEncoders

    loads = []

    def unlabeled(config):
        loads.append(config.data.pretrain_dataset)
        return load_pretrain_images(config.data)

    config = SMOKE.with_overrides(federated={"pretraining": "byol"})
    first = StartingEncoders(unlabeled=unlabeled, context=RunContext(verbose=0))(resolve(config))
    assert loads == ["digits"]
    again = StartingEncoders(unlabeled=unlabeled, context=RunContext(verbose=0))(resolve(config))  # a new script
    assert loads == ["digits"]
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)


def test_each_seed_pre_trains_its_own_encoder(cache):
    """The server pre-trains with the run's seed: trials sample the encoder too, and the
    runs of one seed share one cached encoder."""
    from cpcfl_tf.clustered.starting import StartingEncoders

    encoders = StartingEncoders(context=RunContext(verbose=0))
    config = SMOKE.with_overrides(federated={"pretraining": "simclr"})
    seed0, seed1 = encoders(resolve(config)), encoders(resolve(config.with_overrides(seed=1)))
    assert len(list(cache.rglob("pretrain.json"))) == 2
    assert any(not np.array_equal(a, b) for a, b in zip(seed0, seed1))
    again = encoders(resolve(config.with_overrides(federated={"num_clusters": 2})))
    assert len(list(cache.rglob("pretrain.json"))) == 2
    for a, b in zip(seed0, again):
        np.testing.assert_array_equal(a, b)


def test_one_process_at_a_time_builds_a_cache_entry(cache, capsys, monkeypatch):
    """Two scripts that start together and need the same missing encoder: the second
    waits for the first's pre-training and loads it (two threads here: each opens the
    lock itself, as two processes would); a lock whose holder was killed is free."""
    import subprocess
    import sys
    import threading

    from cpcfl_tf.plan.sections import PretrainConfig
    from cpcfl_tf.pretraining import pretrain as pt
    from cpcfl_tf.records.files import building

    trained, real = [], pt.pretrain

    def slow(*args, **kwargs):  # long enough for the other thread to reach the lock
        trained.append(threading.current_thread().name)
        threading.Event().wait(1.0)
        return real(*args, **kwargs)

    monkeypatch.setattr(pt, "pretrain", slow)
    images = np.random.default_rng(0).integers(0, 256, (16, 32, 32, 3), np.uint8)
    got = {}

    def build(name):
        got[name] = pt.pretrained_encoder(PretrainConfig(epochs=1, batch_size=8), SMOKE.data,
                                          method=SSL_METHODS["simclr"], images=images)

    threads = [threading.Thread(target=build, args=(n,), name=n) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(trained) == 1, trained  # without the lock both would pre-train
    said = capsys.readouterr().out
    assert said.count("waiting for another process to finish building") == 1, said
    for x, y in zip(got["a"].encoder.get_weights(), got["b"].encoder.get_weights()):
        np.testing.assert_array_equal(x, y)

    entry = cache / "other"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a'); "
         "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
         str(cache / ".other.lock")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    waited, inside = [], threading.Event()

    def enter():
        with building(entry, say=waited.append):
            inside.set()

    waiter = threading.Thread(target=enter)
    waiter.start()
    assert not inside.wait(0.5) and waited  # the live holder keeps it
    holder.kill()
    holder.wait()
    assert inside.wait(10)  # the kernel let go of the killed holder's lock
    waiter.join()


@pytest.mark.parametrize("kind", ["fedavg", "supervised"])
def test_an_encoder_another_process_is_building_is_waited_for_not_built_again(
        cache, monkeypatch, kind):
    """IFCA's FedAvg encoder and the supervised one: a script that finds the entry being
    built (its lock held, here by this test) waits, then reads what the holder wrote."""
    import threading

    import cpcfl_tf.clustered.centralized as centralized
    import cpcfl_tf.clustered.starting as starting
    from cpcfl_tf.records.files import building, write_weights

    def never(*args, **kwargs):
        raise AssertionError("built again although another process built it")

    monkeypatch.setattr(starting, "fedavg_encoder", never)
    monkeypatch.setattr(centralized, "supervised_encoder", never)
    asked, real = threading.Event(), starting.building

    def watched(*args, **kwargs):  # the script has read the cache and now takes the lock
        asked.set()
        return real(*args, **kwargs)

    monkeypatch.setattr(starting, "building", watched)
    if kind == "fedavg":
        config = resolve(SMOKE.with_overrides(federated={"method": "ifca",
                                                         "pretraining": "fedavg"}))
        key = starting._fedavg_key(config.requested)
        entry = file = starting._fedavg_path(key)  # the entry is the file itself
    else:
        config = resolve(SMOKE.with_overrides(federated={"pretraining": "supervised"}))
        entry = starting.StartingEncoders.pretrain_folder(config.pretraining)
        key, file = None, entry / "encoder.npz"
    entry.parent.mkdir(parents=True)
    encoders = starting.StartingEncoders(clients=lambda config: None, context=RunContext(verbose=0))
    ask = encoders.fedavg if kind == "fedavg" else encoders.supervised
    got = []
    weights = [np.arange(6.0, dtype=np.float32).reshape(2, 3)]
    with building(entry):
        script = threading.Thread(target=lambda: got.append(ask(config)))
        script.start()
        assert asked.wait(30)
        write_weights(file, weights, key=key)
    script.join(60)
    assert len(got) == 1
    np.testing.assert_array_equal(got[0][0], weights[0])


def test_fedavg_encoders_cached_before_a_field_existed_keep_their_key():
    """Fields added later stay out of the FedAvg cache key at their defaults (entries
    cached before them are found again) and enter it otherwise (their runs differ)."""
    from cpcfl_tf.clustered.starting import _fedavg_key

    config = SMOKE.with_overrides(federated={"method": "ifca", "pretraining": "fedavg"})
    key = json.loads(_fedavg_key(config))
    assert "jit_compile" not in key["federated"] and "kind" not in key["partition"]
    jit = SMOKE.with_overrides(federated={"method": "ifca", "pretraining": "fedavg",
                                          "jit_compile": True})
    assert json.loads(_fedavg_key(jit))["federated"]["jit_compile"] is True


def test_the_starting_encoders_of_a_tree_move_to_another_machines_cache(cache, tmp_path,
                                                                        monkeypatch, capsys):
    # tools/encoders.py: `status` lists the encoders the records start from and whether
    # this cache holds them; `pack` writes those entries (not a resumable checkpoint);
    # `unpack` checks every fingerprint before the other cache gets anything, keeps an
    # entry it has already, and replaces one with other bits only when told to.
    import tarfile

    from cpcfl_tf.clustered.starting import StartingEncoders, cache_entries
    from cpcfl_tf.records.record import Final, RunRecord, write_record
    from cpcfl_tf.records.files import weights_fingerprint, write_weights
    from helpers import script

    tool = script("encoders")
    config = SMOKE.with_overrides(federated={"pretraining": "simclr"})
    simclr = StartingEncoders(context=RunContext(verbose=0))(resolve(config))
    ifca = SMOKE.with_overrides(federated={"method": "ifca", "pretraining": "fedavg"})
    StartingEncoders(context=RunContext(verbose=0)).keep_fedavg(ifca, [np.arange(6.0).reshape(2, 3)])
    (fedavg_file,) = (cache / "fedavg").iterdir()
    (folder,) = (p for p in (cache / "pretrained").iterdir()
                 if not p.name.startswith("."))  # (not the hidden lock beside it)
    (folder / "checkpoint.npz").write_bytes(b"a resumable pre-training's")
    (cache / "pretrained" / "byol-cnn-unfinished").mkdir()
    fingerprints = {"simclr": weights_fingerprint(simclr),
                    "fedavg": weights_fingerprint([np.arange(6.0).reshape(2, 3)]),
                    "byol": "0123456789abcdef"}  # made elsewhere, not cached here
    (tmp_path / "results").mkdir()
    assert cache_entries() == {fingerprints["simclr"]: folder,
                               fingerprints["fedavg"]: fedavg_file}
    for name, fingerprint in fingerprints.items():
        requested = SMOKE.with_overrides(federated={"pretraining": name, "method": (
            "ifca" if name == "fedavg" else "cp-cfl")})
        write_record(tmp_path / "results" / f"{name}.json", RunRecord(
            resolve(requested).config, requested, {"data": 0, "train": 0}, [], [], Final(0.5),
            {"seconds": 1.0}, "synthetic", {"cpu": "test", "starting_encoder": fingerprint}))
    results = str(tmp_path / "results")

    capsys.readouterr()
    tool.main(["status", "--results", results])
    said = capsys.readouterr().out.splitlines()
    assert said[-1] == f"2 of 3 starting encoders in {cache}"
    assert any(line.startswith(fingerprints["byol"]) and "not in this cache" in line
               for line in said)

    archive = tmp_path / "encoders.tar"
    tool.main(["pack", "--results", results, "--out", str(archive)])
    with tarfile.open(archive) as tar:
        names = sorted(tar.getnames())
    assert names == sorted(["manifest.json", str(fedavg_file.relative_to(cache)),
                            *(str((folder / f).relative_to(cache)) for f in
                              ("encoder.keras", "pretrain.json"))])  # no weights-only copy
    only = tmp_path / "pretrained.tar"
    tool.main(["pack", "--results", results, "--out", str(only), "--only", "pretrained"])
    with tarfile.open(only) as tar:
        assert not any(n.startswith("fedavg/") for n in tar.getnames())

    other = tmp_path / "other-machine"
    monkeypatch.setenv("CPCFL_CACHE", str(other))
    tool.main(["unpack", str(archive)])
    assert {f: p.relative_to(other) for f, p in cache_entries().items()} == {
        f: p.relative_to(cache) for f, p in cache_entries(cache).items()}

    def no_images(config):
        raise AssertionError("pre-trained again")

    for a, b in zip(StartingEncoders(unlabeled=no_images, context=RunContext(verbose=0))(resolve(config)), simclr):
        np.testing.assert_array_equal(a, b)

    capsys.readouterr()
    tool.main(["unpack", str(archive)])
    assert capsys.readouterr().out.splitlines()[-1] == f"0 of 2 encoders unpacked into {other}"

    mine = other / fedavg_file.relative_to(cache)
    write_weights(mine, [np.ones(3)])  # this machine's own FedAvg encoder: other bits
    before = mine.read_bytes()
    with pytest.raises(UserError, match="holds another encoder .*; pass --force to replace it"):
        tool.main(["unpack", str(archive)])
    assert mine.read_bytes() == before
    tool.main(["unpack", str(archive), "--force"])
    assert mine.read_bytes() == fedavg_file.read_bytes()

    def retar(path, members):
        with tarfile.open(path, "w") as tar:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))

    with tarfile.open(archive) as tar:  # a manifest that lies about its encoders
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    manifest = json.loads(members["manifest.json"])
    manifest["encoders"][0]["fingerprint"] = "ffffffffffffffff"
    members["manifest.json"] = json.dumps(manifest).encode()
    lying = tmp_path / "lying.tar"
    retar(lying, members)
    monkeypatch.setenv("CPCFL_CACHE", str(tmp_path / "third-machine"))
    with pytest.raises(UserError, match="not ffffffffffffffff as its manifest says"):
        tool.main(["unpack", str(lying)])
    manifest["encoders"][0]["entry"] = "../outside"  # where no cache entry lives
    members["manifest.json"] = json.dumps(manifest).encode()
    retar(lying, members)
    with pytest.raises(UserError, match="../outside is not a cache entry"):
        tool.main(["unpack", str(lying)])
    assert cache_entries() == {} and not (tmp_path / "outside").exists()
    (tmp_path / "not.tar").write_text("hello")
    with pytest.raises(UserError, match="is not an archive of tools/encoders.py pack"):
        tool.main(["unpack", str(tmp_path / "not.tar")])
    with pytest.raises(UserError, match="none of the 3 starting encoders the records under"):
        tool.main(["pack", "--results", results, "--out", str(tmp_path / "x.tar")])
    assert not (tmp_path / "x.tar").exists()


def test_a_csv_has_every_key_of_its_rows_in_the_order_first_seen(tmp_path):
    from cpcfl_tf.records.files import write_csv

    # e.g. study rows kept across versions of a script, one of them without a later field
    path = write_csv(tmp_path / "t.csv", [{"a": 1, "b": 2}, {"a": 3, "c": 4, "b": 5}])
    assert path.read_text().splitlines() == ["a,b,c", "1,2,", "3,5,4"]
