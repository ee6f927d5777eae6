"""A federation's nodes are not trusted: the ServerApp checks every reply before it counts
and the ClientApp every model it is sent (cpcfl_tf/flower/checks.py). In one process
(helpers.InProcessGrid): a run where nodes send NaN weights, arrays of a wrong shape, a
negative and a huge example count and a cluster id outside the pool is the run in which
those replies never came."""
import numpy as np
import pytest

pytest.importorskip("flwr")

from cpcfl_tf.flower import checks  # noqa: E402
from helpers import run_in_process  # noqa: E402

RUN = {"preset": "smoke", "method": "cp-cfl", "pretraining": "simclr", "num-clusters": 2,
       "rounds": 3, "head-rounds": 1, "num-clients": 3, "seed": 0, "round-timeout": 60.0}
NODES = [{"partition-id": k, "num-partitions": 3} for k in range(3)]


def _nan(content):
    from cpcfl_tf.flower.common import from_record, to_record

    arrays = from_record(content["model"])
    arrays[0] = np.full_like(arrays[0], np.nan)
    content["model"] = to_record(arrays)


def _shape(content):
    from cpcfl_tf.flower.common import from_record, to_record

    arrays = from_record(content["model"])
    arrays[-1] = arrays[-1][:-1]
    content["model"] = to_record(arrays)


def _metric(name, value):
    def change(content):
        content["metrics"][name] = value
    return change


BAD = {("1", 0): _nan, ("1", 1): _shape, ("2", 0): _metric("num-examples", -5),
       ("2", 2): _metric("num-examples", 10 ** 9), ("3", 1): _metric("cluster-id", 7)}
"""(round, node index) -> what that node's training reply says instead of the truth."""
BAD_SCORE = {("3-evaluate", 2): _metric("accuracy", 1.7)}
"""(scoring message, node index) -> what that node's scoring reply says instead."""


def test_bad_replies_are_left_out_exactly_as_failed_nodes(tmp_path, monkeypatch, capsys):
    from cpcfl_tf.flower import client_app

    reference = run_in_process({**RUN, "out": str(tmp_path / "refused.json")}, NODES,
                               refuse={*BAD, *BAD_SCORE})

    def lying(honest, bad):
        def handler(msg, context):
            reply = honest(msg, context)
            change = bad.get((msg.metadata.group_id, context.node_id - 100))
            if change is not None and not reply.has_error():
                change(reply.content)
            return reply
        return handler

    monkeypatch.setattr(client_app, "train", lying(client_app.train, BAD))
    monkeypatch.setattr(client_app, "evaluate", lying(client_app.evaluate, BAD_SCORE))
    capsys.readouterr()
    record = run_in_process({**RUN, "out": str(tmp_path / "lied.json")}, NODES)
    said = capsys.readouterr().out
    for key in ("cluster_ids", "replies", "failed_partitions", "accuracy"):
        assert [r.get(key) for r in record["rounds"]] == [r.get(key) for r in reference["rounds"]]
    assert record["final"]["accuracy"] == reference["final"]["accuracy"]
    assert record["final"]["client_accuracy"] == reference["final"]["client_accuracy"]
    assert sorted(record["final"]["client_accuracy"]) == ["0", "1"]  # node 2's 1.7 left out
    assert [r["failed_partitions"] for r in record["rounds"]] == [[0, 1], [0, 2], [1, 2]]
    for line in ("node 100 failed train 1: its reply was left out: weight array 0 holds "
                 "non-finite values",
                 "node 101 failed train 1: its reply was left out: weight array",
                 "node 100 failed train 2: its reply was left out: example count -5 is not a "
                 "positive integer",
                 "node 102 failed train 2: its reply was left out: example count 1000000000 is "
                 "more than the node's",
                 "node 101 failed train 3: its reply was left out: cluster id 7 is outside the "
                 "pool 0..1",
                 "node 102 failed evaluate 3: its reply was left out: accuracy 1.7 is outside "
                 "[0, 1]"):
        assert line in said, said


def test_a_node_refuses_a_model_of_another_shape(monkeypatch):
    """The ClientApp checks the server's models against its own template and answers with
    an error instead of training on them."""
    import time

    from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
    from flwr.common import Metadata

    from cpcfl_tf.flower import client_app
    from cpcfl_tf.flower.common import models_to_records

    context = Context(run_id=1, node_id=100, node_config={"partition-id": 0,
                                                          "num-partitions": 3},
                      state=RecordDict(), run_config=dict(RUN))
    client_app._node(context)  # builds the node's template
    like = client_app._template_weights[tuple(sorted(RUN.items()))]
    bad = [w.copy() for w in like]
    bad[1] = bad[1][..., :-1] if bad[1].ndim else bad[1]
    content = RecordDict({"config": ConfigRecord({"round": 0, "attempt": 0, "num-clients": 3,
                                                  "client-id": 0}),
                          **models_to_records({0: bad, 1: like})})
    message = Message(content, metadata=Metadata(
        run_id=1, message_id="m1", src_node_id=1, dst_node_id=100, reply_to_message_id="",
        group_id="1", created_at=time.time(), ttl=60.0, message_type=MessageType.TRAIN))
    reply = client_app.train(message, context)
    assert reply.has_error()
    assert "the server sent model 0 with weight array 1 has shape" in reply.error.reason


@pytest.mark.parametrize("value,most,said", [
    (50, 50, None), (50.0, 60, None), (0, None, "not a positive integer"),
    (-5, None, "not a positive integer"), (2.5, None, "not a positive integer"),
    (float("nan"), None, "not a positive integer"), (51, 50, "more than the node's 50"),
    ("x", None, "not a number")])
def test_an_example_count_is_a_positive_integer_within_the_nodes(value, most, said):
    problem = checks.count_problem(value, most)
    assert (problem is None) if said is None else said in problem


def test_the_other_checks_by_hand():
    like = [np.zeros((2, 3), np.float32), np.zeros(3, np.float32)]
    assert checks.weights_problem([w + 1 for w in like], like) is None
    assert "2 weight arrays" not in (checks.weights_problem(like[:1], like) or "")
    assert checks.weights_problem(like[:1], like) == "1 weight arrays where the model has 2"
    assert "float64" in checks.weights_problem([like[0].astype(np.float64), like[1]], like)
    inf = [like[0], np.array([0, np.inf, 0], np.float32)]
    assert checks.weights_problem(inf, like) == "weight array 1 holds non-finite values"
    assert checks.cluster_problem(1, 2) is None and checks.cluster_problem(1, 3, 1) is None
    assert "outside the pool 0..1" in checks.cluster_problem(2, 2)
    assert "outside the pool" in checks.cluster_problem(-1, 2)
    assert "not the model 0" in checks.cluster_problem(1, 2, expected=0)
    assert checks.accuracy_problem(0.0) is None and checks.accuracy_problem(1) is None
    for bad in (1.01, -0.1, float("nan"), "high"):
        assert checks.accuracy_problem(bad) is not None
    assert checks.client_problem(3, 3) is None
    assert "as client 4" in checks.client_problem(4, 3)


def test_a_pretraining_reply_is_checked_like_a_training_reply(monkeypatch, capsys):
    """The federated pre-training's round: of four replies, one with NaN parts, one of a
    wrong shape and one claiming more images than its share of the deal are left out; the
    good one is the round's only upload."""
    from types import SimpleNamespace

    from cpcfl_tf.flower import remote
    from cpcfl_tf.flower.common import to_record

    global_weights = [np.zeros((3, 2), np.float32), np.zeros(2, np.float32)]
    sent = {0: [w + 1 for w in global_weights],
            1: [np.full((3, 2), np.nan, np.float32), np.zeros(2, np.float32)],
            2: [np.zeros((2, 2), np.float32), np.zeros(2, np.float32)],
            3: [w + 1 for w in global_weights], 4: [w + 1 for w in global_weights],
            5: [w + 1 for w in global_weights]}
    counts = {0: 40, 1: 40, 2: 40, 3: 41, 4: 40, 5: 40}
    losses = {0: 3.5, 1: 3.5, 2: 3.5, 3: 3.5, 4: float("nan")}  # 5 sends none

    def send(grid, contents, kind, group, timeout):  # node 10 + k holds client k
        return [SimpleNamespace(metadata=SimpleNamespace(src_node_id=10 + k), content={
            "metrics": {"client-id": k, "num-examples": counts[k],
                        **({"loss": losses[k]} if k in losses else {})},
            "model": to_record(sent[k])}) for k in (node - 10 for node in contents)], []

    monkeypatch.setattr(remote, "send", send)
    grid = SimpleNamespace(get_node_ids=lambda: [10, 11, 12, 13, 14, 15])
    nodes = remote.PretrainNodes(grid, {10 + k: k for k in range(6)}, 1.0, None,
                                 dict.fromkeys(range(6), 40))
    replies = nodes.train(global_weights, 0, np.arange(6))
    assert replies.counts == [40] and replies.failed == [1, 2, 3, 4, 5] and replies.reached == 6
    np.testing.assert_array_equal(replies.uploads[0][0], sent[0][0])
    said = capsys.readouterr().out
    assert "node 11 failed pretrain 1: its reply was left out: weight array 0 holds" in said
    assert "node 12 failed pretrain 1: its reply was left out: weight array 0 has shape" in said
    assert "node 13 failed pretrain 1: its reply was left out: example count 41 is more" in said
    assert "node 14 failed pretrain 1: its reply was left out: loss nan is not a finite" in said
    assert "node 15 failed pretrain 1: its reply was left out: loss None is not a finite" in said
    assert "[cpcfl] pretrain round 1: client losses 0 3.5" in said  # the one counted


def test_every_tamper_a_node_can_rehearse_is_caught_by_the_servers_checks():
    # node config tamper=NAME (client_app.TAMPERS) rehearses an untrusted node on a real
    # federation (tests/test_flower.py sends NaN weights over loopback): each must be a
    # reply the server's checks refuse, for the reason its name says.
    from cpcfl_tf.flower.client_app import TAMPERS

    model = [np.ones((3, 2), np.float32), np.zeros(2, np.float32)]
    honest = {"cluster-id": 1, "num-examples": 40, "client-id": 0}
    said = {"nan-weights": "non-finite", "wrong-shape": "shape (3, 1)",
            "negative-count": "-5 is not a positive integer",
            "huge-count": "more than the node's 40", "foreign-cluster": "outside the pool 0..1"}
    assert set(TAMPERS) == set(said)
    for name, tamper in TAMPERS.items():
        weights, metrics = tamper(list(model), dict(honest), 2)
        problem = checks.first(checks.cluster_problem(metrics["cluster-id"], 2),
                               checks.count_problem(metrics["num-examples"], 40)
                               ) or checks.weights_problem(weights, model)
        assert problem is not None and said[name] in problem, (name, problem)
    assert checks.weights_problem(model, model) is None
