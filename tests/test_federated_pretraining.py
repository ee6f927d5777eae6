"""Federated self-supervised pre-training (issue 43): the deals, FedAvg of the method's
model, FedEMA, their starts and their refusals."""
from __future__ import annotations

import json
import shlex

import numpy as np
import pytest

from cpcfl_tf.plan.presets import get_preset
from cpcfl_tf.data.unlabeled import check_deal, deal_unlabeled, group_shares
from cpcfl_tf.errors import UserError
from cpcfl_tf.methods.federated import METHODS, START_LABELS
from cpcfl_tf.methods.ssl import FEDERATED_SSL, FEDERATED_STARTS, SSL_METHODS
from cpcfl_tf.plan.resolve import resolve
from cpcfl_tf.plan.resolve import pretraining_of
from cpcfl_tf.plan.context import RunContext


def smoke(start: str, deal: str = "iid", **settings):
    algorithm = start.split("-")[0]
    options = {algorithm: {"batch_size": 32, "rounds": 2, **settings}}
    return get_preset("smoke").with_overrides(
        federated={"pretraining": start}, partition={"unlabeled": deal},
        pretrain={"options": options})


# -- registry and config ---------------------------------------------------------------
def test_every_method_has_a_fedavg_start_and_fedema_takes_byol():
    assert {m for f, m in FEDERATED_STARTS.values() if f.name == "fed"} == set(SSL_METHODS)
    assert [s for s, (f, _) in FEDERATED_STARTS.items() if f.name == "fedema"] == ["fedema-byol"]
    assert START_LABELS["fed-simclr"] == "FedSimCLR" and START_LABELS["fedema-byol"] == "FedEMA-BYOL"
    for start in FEDERATED_STARTS:  # CP-CFL and the baselines can start from each
        assert start in METHODS["cp-cfl"].starts and start in METHODS["fedavg"].starts


@pytest.mark.parametrize("overrides, says", [
    (dict(federated={"pretraining": "fed-simclr"}), "set partition.unlabeled=iid or groups"),
    (dict(federated={"pretraining": "simclr"}, partition={"unlabeled": "iid"}),
     "start from fed-simclr"),
    (dict(federated={"pretraining": "fedema-simclr"}, partition={"unlabeled": "iid"}),
     "use fedema-byol, or fed-simclr"),
    (dict(federated={"pretraining": "fed-simclr"}, partition={"unlabeled": "iid"},
          pretrain={"lr_schedule": "cosine"}), "set pretrain.lr_schedule=constant"),
    (dict(federated={"pretraining": "fed-byol"}, partition={"unlabeled": "iid"},
          pretrain={"options": {"byol": {"target_schedule": "cosine"}}}),
     "drop byol.target_schedule"),
    (dict(federated={"pretraining": "fed-simclr"}, partition={"unlabeled": "elsewhere"}),
     "choose one of server, iid, groups"),
])
def test_a_start_that_cannot_run_is_refused_in_one_line(overrides, says):
    with pytest.raises(UserError, match=says) as err:
        get_preset("quick").with_overrides(**overrides)
    assert "\n" not in str(err.value)


def test_more_clients_than_batches_is_refused_by_arithmetic():
    # 50,000 images, batch 128: 390 clients fit, 391 do not (before any image is read).
    with pytest.raises(UserError, match="use at most 390 clients"):
        check_deal(50_000, 391, 128, "fashion_mnist_idx:train[:50000]")
    check_deal(50_000, 390, 128, "x")
    with pytest.raises(UserError, match="use at most 21 clients"):
        resolve(smoke("fed-simclr").with_overrides(partition={"num_clients": 27,
                                                              "class_counts": (2, 2, 1, 1)}))


def test_the_groups_deal_needs_labels_to_deal_by():
    paper = get_preset("paper")  # STL-10's unlabelled split has none
    with pytest.raises(UserError, match="set partition.unlabeled=iid"):
        resolve(paper.with_overrides(federated={"pretraining": "fed-simclr"},
                                     partition={"unlabeled": "groups"}))


def test_records_name_the_federated_settings_and_read_back():
    from cpcfl_tf.plan.config import Config

    config = smoke("fedema-byol", "groups")
    stored = config.to_dict()
    assert stored["partition"]["unlabeled"] == "groups"
    assert stored["pretrain"]["options"]["fedema"] == {
        "rounds": 2, "local_epochs": 1, "participation": 1.0, "batch_size": 32, "tau": 0.7,
        "scaler": None}
    assert Config.from_dict(json.loads(json.dumps(stored))) == config
    assert "unlabeled" not in get_preset("smoke").to_dict()["partition"]  # at its default


# -- the deals -------------------------------------------------------------------------
def test_the_iid_deal_is_seeded_disjoint_and_deals_every_image():
    rows = deal_unlabeled("iid", 1000, 7, seed=3, batch_size=100)
    again = deal_unlabeled("iid", 1000, 7, seed=3, batch_size=100)
    assert all(np.array_equal(a, b) for a, b in zip(rows, again))
    joined = np.concatenate(rows)
    assert len(joined) == len(set(joined)) == 1000
    assert {len(r) for r in rows} == {142, 143}
    other = deal_unlabeled("iid", 1000, 7, seed=4, batch_size=100)
    assert not np.array_equal(rows[0], other[0])


def test_the_groups_deal_follows_each_clients_classes():
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 4, 4000)
    # Two clients of classes {0, 1} (20/5 and 5/20), one of {2, 3}, one of {3}.
    weights = np.array([[20, 5, 0, 0], [5, 20, 0, 0], [0, 0, 10, 10], [0, 0, 0, 30]])
    rows = deal_unlabeled("groups", 4000, 4, seed=1, batch_size=10, labels=labels,
                          weights=weights)
    joined = np.concatenate(rows)
    assert len(joined) == len(set(joined)) == 4000  # every image of a held class, once
    for k, r in enumerate(rows):
        held = set(np.flatnonzero(weights[k]))
        assert set(labels[r]) == held
    sizes = np.bincount(labels, minlength=4)
    n0 = np.sum(labels[rows[0]] == 0)
    assert abs(n0 - sizes[0] * 20 / 25) <= 1  # in proportion to the client's own counts
    assert np.sum(labels[rows[3]] == 3) == sizes[3] - np.sum(labels[rows[2]] == 3)
    assert abs(np.sum(labels[rows[3]] == 3) - sizes[3] * 30 / 40) <= 1
    shares = group_shares(sizes, weights)
    assert (shares.sum(axis=0) == sizes).all()


def test_the_groups_deal_refuses_a_client_short_of_a_batch_before_drawing():
    labels = np.repeat(np.arange(2), [1000, 20])
    with pytest.raises(UserError, match="client 1 20 unlabeled images"):
        deal_unlabeled("groups", 1020, 2, seed=0, batch_size=32, labels=labels,
                       weights=np.array([[1, 0], [0, 1]]))


def test_clients_unlabeled_images_come_from_the_pretraining_split_only(tmp_path):
    from cpcfl_tf.running.runner import Runner

    config = smoke("fed-simclr", "groups")
    runner = Runner("t", config, tmp_path / "out", context=RunContext(dry_run=True))
    dealt = runner.data.client_unlabeled(config)
    partition, train, _ = runner.data.partition(config)
    assert len(dealt) == config.partition.num_clients
    assert all(d.dtype == np.uint8 and d.ndim == 4 for d in dealt)  # images, no labels
    pool = runner.data.unlabeled(config)
    keys = {x.tobytes() for x in pool}
    assert all(x.tobytes() in keys for d in dealt for x in d[:5])  # from digits:train[:697]
    assert sum(len(d) for d in dealt) == len(pool)


# -- the algorithms --------------------------------------------------------------------
def test_fedavg_of_one_client_is_that_clients_own_pretraining(tmp_path):
    """One client, one round of two local epochs: the global encoder equals the method's
    own step run alone on the client's images in the same batch order."""
    import tensorflow as tf

    from cpcfl_tf.pretraining.federated_pretrain import federated_pretrain
    from cpcfl_tf.pretraining.pretrain import build_contrastive_model

    config = smoke("fed-simsiam", "iid", rounds=1, local_epochs=2).with_overrides(
        partition={"num_clients": 1, "num_groups": 1})
    images = np.random.default_rng(0).integers(0, 255, (70, 32, 32, 3), dtype=np.uint8)
    result = federated_pretrain(pretraining_of(config), [images], tmp_path / "fed", verbose=0)

    model = build_contrastive_model(config.pretrain, (32, 32, 3), method=SSL_METHODS["simsiam"],
                                    seed=config.pretrain_seed)
    step = model.make_step(False)
    # The augmentation's streams as a client round sets them: from (seed, round, client).
    rng = np.random.default_rng([config.pretrain_seed, 0, 0, 0x617567])
    for variable in model.augmenter.non_trainable_variables:
        variable.assign(np.array([rng.integers(2 ** 31), 0], dtype=np.int64))
    for epoch in range(2):
        order = np.random.default_rng([config.pretrain_seed, 0, 0, epoch]).permutation(70)
        for i in range(70 // 32):
            step(tf.constant(images[order[i * 32:(i + 1) * 32]]))
    for a, b in zip(result.encoder.get_weights(), model.encoder.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_fedema_mu_matches_numpy():
    from cpcfl_tf.pretraining.fedavg_ssl import ClientState, get_parts
    from cpcfl_tf.pretraining.fedema import FedEMA
    from cpcfl_tf.pretraining.pretrain import build_contrastive_model

    config = smoke("fedema-byol")
    model = build_contrastive_model(config.pretrain, (32, 32, 3), method=SSL_METHODS["byol"], seed=0)
    algorithm = FedEMA(FEDERATED_SSL["fedema"].resolve(None))
    shared = algorithm.shared(model)
    rng = np.random.default_rng(5)
    base = get_parts(shared)
    previous = [w + rng.normal(0, 0.01, w.shape).astype(w.dtype) for w in base]
    globals_ = [[w + rng.normal(0, s, w.shape).astype(w.dtype) for w in base]
                for s in (0.02, 0.05)]
    trainable = {id(v) for part in shared for v in part.trainable_weights}
    is_trainable = [id(v) in trainable for part in shared for v in part.weights]
    encoder_arrays = len(model.encoder.weights)
    encoder_trainable = is_trainable[:encoder_arrays]

    def numpy_distance(g):
        return np.sqrt(sum(np.sum((g[i].astype(np.float64) - previous[i]) ** 2)
                           for i in range(encoder_arrays) if encoder_trainable[i]))

    state = ClientState({"previous": previous})
    lam = 0.7 / numpy_distance(globals_[0])  # the auto-scaler: mu starts at tau
    for g in globals_:
        record = algorithm.local_start(model, g, state)
        mu = min(lam * numpy_distance(g), 1.0)
        assert record["mu"] == pytest.approx(mu, rel=1e-9)
        now = get_parts(shared)
        for i, t in enumerate(is_trainable):
            want = mu * previous[i].astype(np.float64) + (1 - mu) * g[i] if t else g[i]
            np.testing.assert_allclose(now[i], want, rtol=1e-6, atol=1e-7)
    assert state.numbers["scaler"] == pytest.approx(lam)
    assert 0.7 < record["mu"] <= 1.0  # the second global is further: a larger mu


def test_the_server_receives_online_weights_and_counts_only(tmp_path, monkeypatch):
    from cpcfl_tf.pretraining import fedavg_ssl
    from cpcfl_tf.pretraining.federated_pretrain import federated_pretrain
    from cpcfl_tf.pretraining.pretrain import build_contrastive_model

    seen = []
    real = fedavg_ssl.FedAvgSSL.average

    def spy(uploads, counts):
        seen.append((uploads, counts))
        return real(uploads, counts)

    monkeypatch.setattr(fedavg_ssl.FedAvgSSL, "average", staticmethod(spy))
    config = smoke("fed-byol", rounds=1).with_overrides(
        partition={"num_clients": 3, "num_groups": 3})
    images = [np.full((40 + 10 * k, 32, 32, 3), k, np.uint8) for k in range(3)]
    federated_pretrain(pretraining_of(config), images, tmp_path / "fed", verbose=0)
    model = build_contrastive_model(config.pretrain, (32, 32, 3), method=SSL_METHODS["byol"], seed=0)
    online = [w.shape for p in model.online_parts for w in p.get_weights()]
    (uploads, counts), = seen
    assert counts == [40, 50, 60]
    assert all([w.shape for w in u] == online for u in uploads)  # no target, nothing else


def test_an_interrupted_federated_pretraining_resumes_bit_for_bit(tmp_path, monkeypatch):
    from cpcfl_tf.pretraining import federated_pretrain as fp

    config = smoke("fedema-byol", rounds=3).with_overrides(
        partition={"num_clients": 3, "num_groups": 3})
    rng = np.random.default_rng(1)
    images = [rng.integers(0, 255, (40, 32, 32, 3), dtype=np.uint8) for _ in range(3)]
    whole = fp.federated_pretrain(pretraining_of(config), images, tmp_path / "whole", verbose=0)

    real, saves = fp._save, []

    def stop_after_two(*args, **kwargs):
        real(*args, **kwargs)
        saves.append(1)
        if len(saves) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(fp, "_save", stop_after_two)
    with pytest.raises(KeyboardInterrupt):
        fp.federated_pretrain(pretraining_of(config), images, tmp_path / "cut", verbose=0)
    monkeypatch.setattr(fp, "_save", real)
    resumed = fp.federated_pretrain(pretraining_of(config), images, tmp_path / "cut", verbose=0)
    assert [h["round"] for h in resumed.history] == [1, 2, 3]
    for a, b in zip(whole.encoder.get_weights(), resumed.encoder.get_weights()):
        np.testing.assert_array_equal(a, b)
    summary = json.loads((tmp_path / "cut" / "pretrain.json").read_text())["federated"]
    assert summary["bytes_up"] > summary["bytes_down"] > 0
    assert summary["client_steps"] == 3 * 3 * (40 // 32)


def _status(runner, spec) -> str:
    """Where ``spec``'s starting encoder would come from now, as its start says."""
    run = runner.plan_of(spec)
    return run.start.status(runner.encoders, run)


def test_cp_cfl_starts_from_a_federated_encoder(tmp_path):
    from cpcfl_tf.records.files import weights_fingerprint
    from cpcfl_tf.running.runner import Runner, RunSpec

    base = smoke("fed-simclr", "groups").with_overrides(federated={"rounds": 2})
    runner = Runner("t", base, tmp_path / "out",
                    context=RunContext(verbose=0, knn_every=1, tensorboard=tmp_path / "tb"))
    spec = RunSpec("cp-cfl-fed-simclr", "cp-cfl", "fed-simclr")
    assert "to pre-train federated (2 rounds)" in _status(runner, spec)
    record = runner.run(spec)
    made = runner.encoders.federated(runner.plan_of(spec))
    assert [0 <= h["knn_accuracy"] <= 1 for h in made.history] == [True, True]  # the monitor
    assert list((tmp_path / "tb" / "pretrain" / made.out_dir.name).iterdir())  # TensorBoard
    encoder = runner.encoders(runner.plan_of(spec))
    assert record.environment["starting_encoder"] == weights_fingerprint(encoder)
    assert record.config.federated.pretraining == "fed-simclr"
    assert "cached" in _status(runner, spec)


# -- the study -------------------------------------------------------------------------
def test_the_study_judges_each_federated_encoder_against_both_references(tmp_path,
                                                                          monkeypatch):
    from helpers import script

    from cpcfl_tf.evidence import federated_pretraining as evidence

    study = script("federated_pretraining")
    rows = (study.ROWS[0], study.ROWS[1], study.ROWS[3])
    monkeypatch.setattr(study, "ROWS", rows)  # the runs the script makes
    monkeypatch.setattr(evidence, "ROWS", rows)  # and the rows its summary reads
    out = tmp_path / "out"
    argv = ["--preset", "smoke", "--out", str(out), "--linear-epochs", "2",
            "--set", "federated.rounds=2",
            "--set", 'pretrain.options={"fed": {"batch_size": 32}}']
    study.main(argv)
    stored = json.loads((out / "federated_pretraining.json").read_text())
    assert set(stored["differences"]) == {
        "cp-cfl-fed-simclr-groups - ifca-none", "cp-cfl-fed-simclr-groups - cp-cfl-simclr",
        "cp-cfl-simclr - ifca-none"}
    assert all(d["n"] == 2 for d in stored["differences"].values())
    federated = [e for e in stored["encoders"].values() if e["start"] == "fed-simclr"]
    assert len(federated) == 2 and all(e["deal"] == "groups" for e in federated)
    made = json.loads(next((out / "encoders").glob("fed-simclr-*.json")).read_text())
    assert made["federated"]["deal"] == "groups" and made["federated"]["bytes_up"] > 0
    row = next(r for r in stored["rows"] if r["row"] == "cp-cfl-fed-simclr-groups")
    assert row["pretrain_megabytes"] > 0 and row["client_pretrain_images"] > 0
    text = (out / "federated_pretraining.md").read_text()
    assert "CP-CFL (FedSimCLR) (groups) minus IFCA (None)" in text and "Partial" not in text
    # The summary names the machine its runs name (rebuilt elsewhere, it says the same):
    # a record planted from another machine makes two, the most common one given.
    other = json.loads((out / "seed0-ifca-none.json").read_text())
    other["environment"]["cpu_id"] = "family 1 model 2; flags 00000000"
    (out / "seed0-ifca-none.json").write_text(json.dumps(other))
    study.main([*argv, "--report"])
    summary = json.loads((out / "federated_pretraining.json").read_text())["environment"]
    made_here = json.loads((out / "seed1-ifca-none.json").read_text())["environment"]
    assert summary == {**{k: made_here[k] for k in stored["environment"]}, "machines": 2}
    (out / "seed1-ifca-none.json").unlink()  # a study under way: --report runs nothing
    interrupted = out / ".seed1-ifca-none.ckpt.npz"  # its run's checkpoint, left as it is
    interrupted.write_bytes(b"rounds so far")
    study.main([*argv, "--report"])
    assert interrupted.read_bytes() == b"rounds so far"
    partial = json.loads((out / "federated_pretraining.json").read_text())
    assert all(d["n"] == 1 for d in partial["differences"].values())
    assert not (out / "seed1-ifca-none.json").exists()
    text = (out / "federated_pretraining.md").read_text()
    assert "**Partial: seeds 0 of 0-1.**" in text
    # the command that makes the rest repeats this one's options, --resume for --report
    assert f"`python experiments/federated_pretraining.py {shlex.join(argv)} --resume`" in text


def test_the_study_refuses_a_deal_the_data_cannot_host_and_writes_nothing(tmp_path):
    from test_experiments import run

    out = tmp_path / "out"
    proc = run("federated_pretraining", "--preset", "smoke", "--out", str(out))  # 128 > 697/9
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "use at most 5 clients" in lines[0], proc.stderr
    assert not out.exists()


@pytest.mark.parametrize("given, kept", [(None, "true"), ("false", "false")])
def test_every_process_asks_for_gpu_memory_growth_unless_told_not_to(given, kept):
    """Importing the kit (as the scripts, the Flower apps and each Simulation Engine
    actor do) turns on memory growth before TensorFlow touches a GPU; on a CPU it is a
    no-op."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TF_FORCE_GPU_ALLOW_GROWTH"}
    if given:
        env["TF_FORCE_GPU_ALLOW_GROWTH"] = given
    code = "import os, cpcfl_tf.flower.client_app; print(os.environ['TF_FORCE_GPU_ALLOW_GROWTH'])"
    if not given:  # and TensorFlow then runs as ever on this CPU (the other case skips it)
        code += ("; import tensorflow as tf; print(len(tf.config.list_physical_devices('GPU')),"
                 " float(tf.reduce_sum(tf.ones(3))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**env, "TF_CPP_MIN_LOG_LEVEL": "3"}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ([kept] if given else [kept, "0", "3.0"])  # no GPU here


def test_a_client_round_depends_on_its_own_inputs_only():
    """What lets a Flower node (its own process, its own model) compute the simulator's
    round: a round's result depends on the global weights, the client's state and images,
    and (seed, round, client), not on the rounds the same model ran before."""
    from cpcfl_tf.pretraining.fedavg_ssl import ClientState
    from cpcfl_tf.pretraining.federated_pretrain import LocalTrainer

    config = smoke("fed-simclr")
    rng = np.random.default_rng(2)
    images = [rng.integers(0, 255, (40, 32, 32, 3), dtype=np.uint8) for _ in range(2)]
    first, alone = LocalTrainer(pretraining_of(config), (32, 32, 3)), LocalTrainer(pretraining_of(config), (32, 32, 3))
    start = first.initial()
    first.round(start, ClientState(), images[0], 0, 0)
    after_another, _ = first.round(start, ClientState(), images[1], 0, 1)
    on_its_own, _ = alone.round(start, ClientState(), images[1], 0, 1)
    for a, b in zip(after_another, on_its_own):
        np.testing.assert_array_equal(a, b)
    # A client short of one batch (a Flower node's folder): refused in one line, not a
    # round with no step.
    batch = first.settings["batch_size"]
    with pytest.raises(UserError, match=f"client 1 has {batch - 1} unlabeled images, less "
                                        f"than a batch of {batch}"):
        first.round(start, ClientState(), images[1][:batch - 1], 0, 1)


def test_the_studys_findings_are_written_from_its_verdicts_and_means():
    from cpcfl_tf.evidence import federated_pretraining as study

    def row(name, linear, knn, pre_mb, merged=0):
        return {"row": name, "linear_accuracy": linear, "knn_accuracy": knn, "seeds": 5,
                "pretrain_megabytes": pre_mb, "fl_megabytes": 100.0,
                "seeds_without_groups": merged}

    summary = {"rows": [row("ifca-none", None, None, None),
                        row("cp-cfl-simclr", 0.8, 0.8, 0.0),
                        row("cp-cfl-fed-simclr-iid", 0.7, 0.85, 25.0, merged=2)],
               "differences": {"cp-cfl-fed-simclr-iid - ifca-none": {"verdict": "holds"},
                               "cp-cfl-fed-simclr-iid - cp-cfl-simclr": {"verdict": "opposite"},
                               "cp-cfl-simclr - ifca-none": {"verdict": "not shown"}}}
    assert study.findings(summary) == [
        "CP-CFL from the server's SimCLR is not told apart from IFCA (None) by the claims' "
        "rule (the reference the federated encoders are held to).",
        "CP-CFL from FedSimCLR (iid deal) is ahead of IFCA (None) and behind CP-CFL from the "
        "server's SimCLR by the claims' rule. Its encoder scores below the server's in "
        "linear accuracy and at or above it in kNN accuracy (means). In 2 of 5 seeds its run "
        "ended without the true groups (ARI below 1). Its pre-training sends 25% of the "
        "bytes the federated rounds send after it."]
    summary["rows"].append(row("cp-cfl-fed-simclr-groups", 0.6, 0.9, 25.0))
    summary["differences"]["cp-cfl-fed-simclr-groups - cp-cfl-fed-simclr-iid"] = {
        "verdict": "opposite"}
    assert study.findings(summary)[-1] == (
        "Non-IID unlabeled images (the groups deal against the iid deal, FedSimCLR): CP-CFL "
        "from the groups deal's encoder is behind the iid deal's by the claims' rule; its "
        "encoder scores below the iid deal's in linear accuracy (means).")


# -- the server's stages against hand-worked values (issue 56) ---------------------------

def _round_of(uploads, counts, reached, failed=(), defence=None):
    """One federated pre-training round whose clients sent ``uploads`` with ``counts``
    (``reached`` clients were sent the global parts), through the one round loop, under
    ``defence`` (default: the paper's mean)."""
    import types

    from cpcfl_tf.aggregation import Defence
    from cpcfl_tf.pretraining.fedavg_ssl import FedAvgSSL
    from cpcfl_tf.pretraining.federated_pretrain import Uploads, new_totals, pretrain_rounds

    results = [{"seconds": 1.0, "steps": 2, "loss": 0.5, "embedding_std": 0.1}
               for _ in uploads]
    clients = types.SimpleNamespace(train=lambda weights, r, chosen: Uploads(
        uploads, list(counts), results, reached, list(failed)))
    trainer = types.SimpleNamespace(settings={"rounds": 1, "participation": 1.0,
                                              "batch_size": 16},
                                    seed=0, algorithm=FedAvgSSL({}),
                                    defence=defence or Defence())
    start = [np.zeros((4, 5), np.float32), np.zeros(3, np.float32)]  # 80 + 12 bytes
    totals, entries = new_totals(), []
    weights = pretrain_rounds(trainer, clients, reached, start, totals,
                              after=lambda r, entry, _: entries.append(entry))
    return weights, totals, entries


def test_the_server_averages_by_image_count_and_counts_bytes_of_replies_only():
    """Three clients reached, two replied (10 and 30 images, all ones and all fives):
    the average is (10 * 1 + 30 * 5) / 40 = 4 everywhere (an equal average would be 3);
    92 bytes went down to each of the 3 clients reached, 92 + 8 came up from each of the
    2 that replied (the failed one sent nothing)."""
    uploads = [[np.full((4, 5), v, np.float32), np.full(3, v, np.float32)] for v in (1, 5)]
    weights, totals, _ = _round_of(uploads, [10, 30], reached=3, failed=[2])
    for w in weights:
        np.testing.assert_allclose(w, 4.0)
    assert weights[0].dtype == np.float32
    assert totals["bytes_down"] == 3 * 92 and totals["bytes_up"] == 2 * (92 + 8)
    assert totals["client_steps"] == 4 and totals["images_trained"] == 4 * 16


@pytest.mark.parametrize("members", [2, 3, 4])
def test_a_federated_pretraining_round_takes_the_runs_defence(members):
    """One client of a round sends every weight as 1e30 and claims 2**40 images; the
    honest ones send small values and 10 images each. The paper's count-weighted mean is
    the bad client's; the median and the trimmed mean (beta 0.2: one of three or four is
    cut) are NumPy's median and SciPy's trim_mean of the uploads from three clients on;
    the norm bound scales the bad update to the bound (the mean then counts the bound
    update by its claimed images). A round of fewer than three is named too few to
    defend."""
    from scipy.stats import trim_mean

    from cpcfl_tf.aggregation import Defence

    rng = np.random.default_rng(members)
    honest = [[rng.normal(size=(4, 5)).astype(np.float32), rng.normal(size=3).astype(np.float32)]
              for _ in range(members - 1)]
    bad = [np.full((4, 5), 1e30, np.float32), np.full(3, 1e30, np.float32)]
    uploads, counts = [*honest, bad], [10] * (members - 1) + [2 ** 40]
    mean, _, entries = _round_of(uploads, counts, reached=members)
    assert all(np.allclose(w, 1e30, rtol=1e-3) for w in mean)
    assert "too_few_to_defend" not in entries[0]
    stacked = [np.stack([u[i] for u in uploads]) for i in range(2)]
    for how, expected in (("median", [np.median(a, axis=0) for a in stacked]),
                          ("trimmed-mean", [trim_mean(a, 1.5 / members, axis=0)
                                            for a in stacked])):
        if members < 3:
            continue
        got, _, entries = _round_of(uploads, counts, reached=members, defence=Defence(how))
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6)
            assert np.abs(g).max() < 10
        assert "too_few_to_defend" not in entries[0]
    got, _, entries = _round_of(uploads, counts, reached=members,
                                defence=Defence("median", update_norm=2.0))
    delta = np.concatenate([w.ravel() for w in got])  # from a global of zeros
    assert np.linalg.norm(delta) <= 2.0 + 1e-5
    assert entries[0].get("too_few_to_defend") is (True if members < 3 else None)
    got, _, _ = _round_of(uploads, counts, reached=members, defence=Defence(update_norm=2.0))
    assert np.linalg.norm(np.concatenate([w.ravel() for w in got])) <= 2.0 + 1e-5


def test_a_federated_pretraining_names_its_defence_in_its_key_only_when_it_has_one():
    """The defence is the clustered rounds' settings: at the paper's mean the cache key
    (and so every cached encoder's folder) is what it was; a median is another
    pre-training; a round sampling fewer than three clients refuses a robust aggregation
    without a norm bound in one line."""
    from cpcfl_tf.aggregation import Defence
    from cpcfl_tf.pretraining.federated_pretrain import federated_folder, identity

    config = smoke("fed-simclr").with_overrides(federated={"method": "fedavg"})
    plain = pretraining_of(config)
    assert plain.federated.defence == Defence() and "defence" not in identity(plain)
    robust = config.with_overrides(federated={"aggregation": "median"})
    assert identity(pretraining_of(robust))["defence"] == {"aggregation": "median"}
    assert federated_folder(pretraining_of(robust)) != federated_folder(plain)
    resolve(robust)  # nine clients a round: the median holds
    few = robust.with_overrides(pretrain={"options": {"fed": {
        "batch_size": 32, "rounds": 2, "participation": 0.2}}})
    with pytest.raises(UserError, match="averages the 2 clients it samples; set "
                                        "federated.update_norm too"):
        resolve(few)
    resolve(few.with_overrides(federated={"update_norm": 5.0}))


def test_fedavg_of_two_clients_is_their_rounds_averaged_by_image_count(tmp_path):
    """Two clients of 48 and 96 images, one round: the global encoder is the NumPy
    average of each client's own round (run alone from the same global weights), weighted
    1/3 and 2/3."""
    from cpcfl_tf.pretraining.fedavg_ssl import ClientState
    from cpcfl_tf.pretraining.federated_pretrain import LocalTrainer, federated_pretrain

    config = smoke("fed-simsiam", "iid", rounds=1, local_epochs=1).with_overrides(
        partition={"num_clients": 2, "num_groups": 2})
    rng = np.random.default_rng(4)
    images = [rng.integers(0, 255, (n, 32, 32, 3), dtype=np.uint8) for n in (48, 96)]
    result = federated_pretrain(pretraining_of(config), images, tmp_path / "fed", verbose=0)
    trainer = LocalTrainer(pretraining_of(config), (32, 32, 3))
    start = trainer.initial()
    sent = [trainer.round(start, ClientState(), images[k], 0, k)[0] for k in (0, 1)]
    encoder = len(result.encoder.get_weights())
    for i, got in enumerate(result.encoder.get_weights()):
        want = (48 * sent[0][i].astype(np.float64) + 96 * sent[1][i]) / 144
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert not np.allclose(sent[0][0], sent[1][0])  # the two clients' rounds differ
    assert encoder < len(sent[0])  # the projector and predictor travel too


def test_fedema_with_a_fixed_scaler_uses_it():
    """``scaler`` set: mu = min(scaler * divergence, 1) from the first moving average on
    (the auto-scaler would give tau = 0.7 there); here scaler = 0.4 / d0, so mu is 0.4."""
    from cpcfl_tf.pretraining.fedavg_ssl import ClientState, get_parts, trainable_mask
    from cpcfl_tf.pretraining.fedema import FedEMA
    from cpcfl_tf.pretraining.pretrain import build_contrastive_model

    config = smoke("fedema-byol")
    model = build_contrastive_model(config.pretrain, (32, 32, 3), method=SSL_METHODS["byol"], seed=0)
    rng = np.random.default_rng(6)
    base = get_parts(FedEMA.shared(model))
    previous = [w + rng.normal(0, 0.01, w.shape).astype(w.dtype) for w in base]
    global_ = [w + rng.normal(0, 0.03, w.shape).astype(w.dtype) for w in base]
    mask = trainable_mask([model.encoder])
    d0 = np.sqrt(sum(np.sum((global_[i].astype(np.float64) - previous[i]) ** 2)
                     for i in range(len(mask)) if mask[i]))
    algorithm = FedEMA(FEDERATED_SSL["fedema"].resolve({"scaler": 0.4 / d0}))
    state = ClientState({"previous": previous})
    assert algorithm.local_start(model, global_, state)["mu"] == pytest.approx(0.4, rel=1e-9)
    assert state.numbers["scaler"] == pytest.approx(0.4 / d0)


def test_fedbyols_target_stays_the_clients_own_from_round_to_round():
    """A client's first round starts its target from the global online parts (as BYOL
    starts its target), later rounds from the target it kept: never reset to the global
    model, whatever the global model is."""
    from cpcfl_tf.pretraining.fedavg_ssl import ClientState, FedAvgSSL, get_parts
    from cpcfl_tf.pretraining.pretrain import build_contrastive_model

    config = smoke("fed-byol")
    model = build_contrastive_model(config.pretrain, (32, 32, 3), method=SSL_METHODS["byol"], seed=0)
    algorithm = FedAvgSSL({})
    targets = [t for t, _ in model.target_pairs()]
    online = get_parts([o for _, o in model.target_pairs()])
    global_ = [w + 1.0 for w in get_parts(algorithm.shared(model))]
    state = ClientState()
    algorithm.local_start(model, global_, state)  # first round: the global online parts
    first = get_parts(targets)
    np.testing.assert_array_equal(first[0], global_[0])
    kept = [w - 2.0 for w in first]
    state.weights["target"] = kept  # what the client kept after its round
    algorithm.local_start(model, [w + 3.0 for w in global_], state)
    for got, want in zip(get_parts(targets), kept):
        np.testing.assert_array_equal(got, want)
    assert len(online) == len(first)


def test_the_federated_cache_key_names_the_partition_it_deals_over():
    """Two runs with one fixed pre-training seed but other data seeds draw other
    partitions, so other clients hold other images: two encoders, two cache folders."""
    from cpcfl_tf.pretraining.federated_pretrain import federated_folder

    config = smoke("fed-simclr", "groups").with_overrides(pretrain={"seed": 7})
    other = config.with_overrides(seed=1)
    assert config.pretrain_seed == other.pretrain_seed == 7
    assert federated_folder(pretraining_of(config)) != federated_folder(pretraining_of(other))
    assert federated_folder(pretraining_of(config)) == federated_folder(
        pretraining_of(config.with_overrides(seed=0)))


def test_the_committed_studys_encoders_keep_their_cache_folders():
    """The quick federated pre-training study keeps its encoders' scores by cache folder
    (``encoders.json``): every run of the study still names one of those folders, from
    the plan's pre-training, so none is pre-trained or scored again."""
    import json
    import sys

    from cpcfl_tf.clustered.starting import StartingEncoders
    from cpcfl_tf.plan.presets import get_preset
    from cpcfl_tf.plan.resolve import resolve
    from helpers import ROOT

    sys.path.insert(0, str(ROOT / "experiments"))
    try:
        from federated_pretraining import SEEDS, specs_for
    finally:
        sys.path.remove(str(ROOT / "experiments"))
    kept = json.loads((ROOT / "results/quick/federated_pretraining/encoders.json").read_text())
    config = get_preset("quick")
    named = set()
    for spec in specs_for([config.seed + s for s in range(SEEDS["quick"])]):
        p = resolve(spec.config(config)).pretraining
        if p is not None:  # random weights: no encoder to score
            named.add((StartingEncoders.federated_folder(p) if p.federated
                       else StartingEncoders.pretrain_folder(p)).name)
    assert named == set(kept) and len(named) == 20


def test_what_a_client_keeps_round_trips_through_a_checkpoints_arrays():
    # A client's state is each stage's own, by name (BYOL's target, FedEMA's previous
    # weights and lambda); a checkpoint stores it as named arrays, as it always has
    # (target.0, previous.1, scaler), and reads it back whole.
    from cpcfl_tf.pretraining.fedavg_ssl import ClientState

    target = [np.arange(6.0).reshape(2, 3), np.ones(2)]
    previous = [np.zeros(3), np.full(4, 2.0), np.eye(2)]
    state = ClientState({"target": target, "previous": previous}, {"scaler": 0.25})
    arrays = state.arrays()
    assert list(arrays) == ["target.0", "target.1", "previous.0", "previous.1", "previous.2",
                            "scaler"]
    back = ClientState.from_arrays(dict(reversed(list(arrays.items()))))
    assert back.numbers == {"scaler": 0.25}
    for name, weights in (("target", target), ("previous", previous)):
        assert len(back.weights[name]) == len(weights)
        for got, want in zip(back.weights[name], weights):
            np.testing.assert_array_equal(got, want)
    assert ClientState.from_arrays({}) == ClientState()
