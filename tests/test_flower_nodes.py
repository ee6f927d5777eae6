"""Flower nodes that bring their own data (``data-path``): the folder format, the export
tool, and a run of such nodes against the simulator on the same partition, with one node
whose data is bad."""
import numpy as np
import pytest

from cpcfl_tf.data.folders import list_node_folder, read_node_folder
from cpcfl_tf.errors import UserError
from helpers import script, simulated

CLASSES = tuple(str(k) for k in range(10))


def _touch(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"")


def test_a_node_folder_is_listed_in_file_order_with_the_runs_class_indices(tmp_path):
    for split, files in (("train", [("7", "00002"), ("3", "00000"), ("7", "00001")]),
                         ("test", [("3", "00000")])):
        for label, name in files:
            _touch(tmp_path / split / label / f"{name}.png")
    listed = list_node_folder(tmp_path, CLASSES)
    # by file name across classes (the partition's row order), labels by the run's names
    assert [(p.split("/")[-1], k) for p, k in listed["train"]] == [
        ("00000.png", 3), ("00001.png", 7), ("00002.png", 7)]
    assert [k for _, k in listed["test"]] == [3]


def test_a_node_folder_without_splits_is_split_by_a_seeded_draw(tmp_path):
    for k in range(10):
        _touch(tmp_path / str(k % 2) / f"{k:05d}.png")
    listed = list_node_folder(tmp_path, CLASSES)
    assert (len(listed["train"]), len(listed["test"])) == (8, 2)
    assert listed == list_node_folder(tmp_path, CLASSES)  # the same draw every time
    assert not set(listed["train"]) & set(listed["test"])


def _unknown_class(root):
    _touch(root / "train" / "cat" / "0.png")
    _touch(root / "test" / "3" / "0.png")


def _stray_image(root):
    _touch(root / "0.png")


def _no_training_images(root):
    (root / "train" / "1").mkdir(parents=True)
    _touch(root / "test" / "1" / "0.png")


@pytest.mark.parametrize("make,message", [
    (None, "no folder .*site \\(node config data-path\\)"),
    (_unknown_class, "site/train/cat is a class the run does not know; its classes are 0, 1,"),
    (_stray_image, "site/0.png is in no class subfolder"),
    (_no_training_images, "has 0 training and 1 test images; a node needs at least one of each"),
])
def test_bad_node_data_is_refused_in_one_line(tmp_path, make, message):
    root = tmp_path / "site"
    if make is not None:
        root.mkdir()
        make(root)
    with pytest.raises(UserError, match=message) as err:
        list_node_folder(root, CLASSES)
    assert "\n" not in str(err.value)


def test_the_export_writes_each_clients_images_as_the_simulator_holds_them(tmp_path, capsys):
    from cpcfl_tf.plan.presets import get_preset
    from cpcfl_tf.clustered.clients import clients_for

    out = tmp_path / "clients"
    script("export_partition").main(["--preset", "smoke", "--out", str(out),
                                     "--set", "partition.num_clients=3"])
    clients = clients_for(get_preset("smoke").with_overrides(partition={"num_clients": 3}))
    folders = sorted(p for p in out.iterdir() if p.is_dir())
    assert [p.name for p in folders] == ["client-000", "client-001", "client-002"]
    for u, folder in enumerate(folders):
        data = read_node_folder(list_node_folder(folder, CLASSES), 10, 32)
        for split, arrays in (("train", clients.train), ("test", clients.test)):
            np.testing.assert_array_equal(data[split].images, arrays.images[u])
            np.testing.assert_array_equal(data[split].labels, arrays.labels[u])
    assert (out / "partition.json").exists()
    printed = capsys.readouterr().out
    assert f"--node-config 'data-path=\"{folders[0].resolve()}\"'" in printed
    assert f"--run-config \"node-data='own' min-nodes={len(folders)} ...\"" in printed
    with pytest.raises(UserError, match="is not empty"):
        script("export_partition").main(["--preset", "smoke", "--out", str(out)])


RUN = {"preset": "smoke", "method": "ifca", "pretraining": "none", "num-clusters": 2,
       "num-clients": 3, "head-rounds": 0, "seed": 0}


def test_nodes_with_their_own_data_run_the_simulators_rounds_and_a_bad_one_is_left_out(
        tmp_path, capsys):
    # The smoke partition exported as one folder per client; a node per folder, plus one
    # whose folder holds a class the run does not know. The server learns the clients from
    # the nodes (names and counts), leaves the bad node out with its reason, and the run
    # is the simulator's on the same partition. The ServerApp and ClientApp run in this
    # process (helpers.InProcessGrid); tests/test_flower.py runs such nodes as SuperNodes.
    pytest.importorskip("flwr")
    from helpers import run_in_process

    out = tmp_path / "clients"
    script("export_partition").main(["--preset", "smoke", "--out", str(out),
                                     "--set", "partition.num_clients=3"])
    _touch(tmp_path / "zz-bad" / "train" / "cat" / "0.png")
    _touch(tmp_path / "zz-bad" / "test" / "cat" / "0.png")
    folders = [*sorted(p for p in out.iterdir() if p.is_dir()), tmp_path / "zz-bad"]
    ids, accuracy, _, sim_final = simulated(RUN, 1, tmp_path / "sim")
    capsys.readouterr()
    record = run_in_process({**RUN, "rounds": 1, "min-nodes": 4, "node-data": "own",
                             "out": str(tmp_path / "result.json")},
                            [{"data-path": str(p)} for p in folders])
    printed = capsys.readouterr()
    counts = [[len(list((p / split).rglob("*.png"))) for split in ("train", "test")]
              for p in folders[:3]]
    assert record["node_data"] == {str(k): {"name": p.name, "num_train": n, "num_test": m}
                                   for k, (p, (n, m)) in enumerate(zip(folders, counts))}
    assert sorted(record["nodes"].values()) == [0, 1, 2]
    assert record["config"]["partition"]["num_clients"] == 3
    assert record["config"]["partition"]["kind"] == "own"  # nothing was drawn
    # No max-examples: a reply weighs at most the lower median of the nodes' reports.
    assert record["count_caps"] == {"train": sorted(n for n, _ in counts)[1]}
    assert [(r["replies"], r["failed_partitions"]) for r in record["rounds"]] == [(3, [])]
    assert [r["cluster_ids"] for r in record["rounds"]] == ids
    final = record["final"]["client_accuracy"]
    assert [final[str(k)] for k in range(3)] == pytest.approx(list(accuracy[-1]), abs=1e-6)
    assert "[cpcfl] round 1/1" in printed.out  # the ServerApp's own account
    assert record["final"]["bytes_down"] == sim_final.bytes_down
    # the bad node: one line per message it refused, no traceback
    refused = [line for line in printed.err.splitlines() if "[cpcfl]" in line]
    assert refused and all("node refused query: " in line and "zz-bad/train/cat is a class "
                           "the run does not know" in line for line in refused)
    assert "Traceback" not in printed.err


def test_nodes_with_their_own_data_are_not_held_to_the_servers_split_sizes():
    # The ServerApp's config for nodes with their own data (partition.kind own): as many
    # nodes as come, whatever the preset's client and pre-training splits could be drawn
    # for; the simulator has nothing to draw from such a config, and says so.
    from cpcfl_tf.data.partition import partition_clients
    from cpcfl_tf.flower.common import run_config
    from cpcfl_tf.plan.resolve import resolve

    for start, extra in (("none", ""), ("fed-simclr", "partition.unlabeled=iid")):
        config = run_config({**RUN, "pretraining": start, "set": extra})
        own = {"num_clients": 50, "num_groups": 1}
        with pytest.raises(UserError, match="50 clients"):
            resolve(config.with_overrides(partition=own))  # drawn from smoke's splits: too many
        assert resolve(config.with_overrides(partition={**own, "kind": "own"})
                       ).config.partition.kind == "own"
    # The groups the nodes' group=G may name (the oracle's models): the run config's.
    assert config.with_overrides(partition={"kind": "own"}).partition.num_groups == 3
    with pytest.raises(UserError, match="nothing to draw; run them with") as err:
        partition_clients(np.zeros(10, int), np.zeros(10, int), num_classes=10,
                          num_clients=2, num_groups=1, kind="own")
    assert "\n" not in str(err.value)


def test_without_max_examples_a_nodes_own_count_weighs_at_most_the_lower_median(monkeypatch):
    """A node with its own data claims 2**62 training examples and 2**63 - 1 unlabeled
    images in the roster and in its replies. Without max-examples each reply weighs at
    most the lower median of the nodes' reports (of 20, 30 and the claim: 30; of two
    nodes, the smaller), in the clustered rounds and in a federated pre-training's
    rounds; with max-examples (the operator's bound) or partition nodes there is no cap."""
    import types

    from flwr.app import ArrayRecord, MetricRecord, RecordDict

    from cpcfl_tf.clustered import algorithm
    from cpcfl_tf.flower import remote
    from cpcfl_tf.flower.common import run_config
    from cpcfl_tf.plan.resolve import resolve

    huge = 2 ** 62
    node_data = {"0": {"name": "a", "num_train": 20, "num_test": 5},
                 "1": {"name": "b", "num_train": 30, "num_test": 5},
                 "2": {"name": "c", "num_train": huge, "num_test": 5}}
    unlabeled = {0: 64, 1: 96, 2: 2 ** 63 - 1}
    assert remote.count_caps(node_data, unlabeled, None) == {"train": 30, "unlabeled": 96}
    two = {k: node_data[k] for k in ("1", "2")}
    assert remote.count_caps(two, {}, None) == {"train": 30}
    assert remote.count_caps(node_data, unlabeled, 10 ** 6) is None
    assert remote.count_caps(None, {}, None) is None

    grid = types.SimpleNamespace(get_node_ids=lambda: [100, 101, 102])
    client_of = {100: 0, 101: 1, 102: 2}
    model = [np.zeros(3, np.float32)]

    def reply(node, count, **metrics):
        return types.SimpleNamespace(metadata=types.SimpleNamespace(src_node_id=node),
                                     content=RecordDict({
                                         "metrics": MetricRecord({"client-id": client_of[node],
                                                                  "num-examples": count,
                                                                  **metrics}),
                                         "model": ArrayRecord(numpy_ndarrays=model)}))

    config = run_config({"method": "fedavg", "pretraining": "none", "num-clusters": 1,
                         "head-rounds": 0, "num-clients": 3})
    run = resolve(config, checked=True)
    plan = algorithm.plan_round(run, 0, 0, 0, 3)
    counts = {100: 20, 101: 30, 102: huge}
    monkeypatch.setattr(remote, "send", lambda *args: (
        [reply(n, c, **{"cluster-id": 0}) for n, c in counts.items()], []))
    examples = {0: 20, 1: 30, 2: huge}
    for cap, sizes in ((30, [20, 30, 30]), (None, [20, 30, huge])):
        nodes = remote.Nodes(grid, client_of, 3, 1.0, run, {0: "a", 1: "b", 2: "c"},
                             examples, {0: 5, 1: 5, 2: 5}, cap=cap)
        assert nodes.train([model], plan).sizes.tolist() == sizes

    images = {100: 64, 101: 96, 102: 2 ** 63 - 1}
    monkeypatch.setattr(remote, "send", lambda *args: ([reply(
        n, c, steps=c // 32, loss=0.5, embedding_std=0.1, seconds=1.0)
        for n, c in images.items()], []))
    trainer = types.SimpleNamespace(settings={"batch_size": 32, "local_epochs": 1},
                                    algorithm=types.SimpleNamespace(reported=()))
    for cap, weights in ((96, [64, 96, 96]), (None, [64, 96, 2 ** 63 - 1])):
        pretraining = remote.PretrainNodes(grid, client_of, 1.0, {0: "a", 1: "b", 2: "c"},
                                           {0: 64, 1: 96, 2: 2 ** 63 - 1}, trainer, cap)
        assert pretraining.train(model, 0, np.arange(3)).counts == weights


def test_the_oracle_runs_with_nodes_that_bring_their_own_data_in_two_groups(monkeypatch):
    """Issue 86: with nodes' own data the server set one group, so a node of group 1 was
    refused. Now the oracle's groups are the run config's partition.num_groups: four
    nodes answering groups 0, 1, 1, 0 are all kept and assigned to the model of their
    group (N = 2); a group outside the run's is still refused, and the other methods'
    own-data runs keep the one group they had."""
    import types

    from flwr.app import ArrayRecord, MetricRecord, RecordDict

    from cpcfl_tf.clustered import algorithm
    from cpcfl_tf.flower import remote
    from cpcfl_tf.flower.common import run_config
    from cpcfl_tf.flower.server_app import own_data_config
    from cpcfl_tf.plan.resolve import resolve

    requested = run_config({"method": "oracle", "pretraining": "none", "num-clients": 4,
                            "head-rounds": 0, "node-data": "own",
                            "set": "partition.num_groups=2"})
    config = own_data_config(requested, 4)
    assert (config.partition.kind, config.partition.num_groups) == ("own", 2)
    run = resolve(config, checked=True)
    assert run.num_models == 2
    groups = {100: 0, 101: 1, 102: 1, 103: 0, 104: 2}
    client_of = {node: node - 100 for node in groups}

    def answer(node):
        return types.SimpleNamespace(metadata=types.SimpleNamespace(src_node_id=node),
                                     content=RecordDict({
                                         "metrics": MetricRecord({"client-id": client_of[node]}),
                                         "answer": ArrayRecord(numpy_ndarrays=[
                                             np.array([groups[node]], np.int64)])}))

    monkeypatch.setattr(remote, "send", lambda *args: ([answer(n) for n in groups], []))
    answers = remote.ask_first(None, client_of, run, 5, 1.0, {k: f"s{k}" for k in range(5)},
                               image_shape=(32, 32, 3), num_groups=config.partition.num_groups)
    assert [None if a is None else int(a[0]) for a in answers] == [0, 1, 1, 0, None]
    assert algorithm.initial_assignment(run, 5, answers)[:4].tolist() == [0, 1, 1, 0]
    other = own_data_config(run_config({"method": "ifca", "pretraining": "none",
                                        "node-data": "own"}), 3)
    assert other.partition.num_groups == 1
