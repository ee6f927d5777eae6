"""A federation's nodes are not trusted: the ServerApp reads every reply through one parser
per kind (cpcfl_tf/flower/checks.py) and the ClientApp checks every model it is sent.

The property test runs the ServerApp and the ClientApp in one process
(helpers.InProcessGrid) and lets one node put one bad value in one field of one reply
(the roster, the first question, a pre-training round, a training round, a scored
round): the run finishes, a value the field may not hold leaves that node's reply out,
and the server's cluster models, cluster ids, failures and accuracies equal those of the
run in which that reply never came. The nodes' honest replies are kept by message and
replayed (:class:`Replayed`), so an example costs the server's work only, as long as the
server sends what the reference run sent (a server that did not would train afresh, and
differ)."""
import copy
import hashlib
import math

import numpy as np
import pytest

from hypothesis import HealthCheck, given, settings, strategies as st

pytest.importorskip("flwr")

from cpcfl_tf.flower import checks  # noqa: E402
from helpers import run_in_process  # noqa: E402

NODES = [{"partition-id": k, "num-partitions": 3} for k in range(3)]
CPCFL = {"preset": "smoke", "method": "cp-cfl", "pretraining": "simclr", "num-clusters": 2,
         "rounds": 2, "head-rounds": 1, "num-clients": 3, "seed": 0, "round-timeout": 60.0}
"""CP-CFL from the server's (the suite's cached) SimCLR encoder: round 1 in the Tc phase
(the model drawn), round 2 by loss; both rounds scored."""
FEDSIMCLR = {**CPCFL, "pretraining": "fed-simclr", "rounds": 1, "head-rounds": 0,
             "set": "partition.unlabeled=iid pretrain.options.fed.batch_size=64 "
                    "pretrain.options.fed.rounds=1"}
"""One round of FedSimCLR on the nodes first."""
PACFL = {**CPCFL, "method": "pacfl", "pretraining": "none", "head-rounds": 0, "rounds": 1}
"""PACFL: each node's data subspace is asked first."""

# (run, message group, the reply's fields the server reads)
KINDS = {
    "roster": (CPCFL, "0", ("partition-id", "num-partitions")),
    "first": (PACFL, "0-subspace", ("client-id", "answer")),
    "pretrain": (FEDSIMCLR, "pretrain-1", ("client-id", "num-examples", "steps", "loss",
                                       "embedding_std", "seconds", "model")),
    "train": (CPCFL, "2", ("client-id", "cluster-id", "num-examples", "model")),
    "train-tc": (CPCFL, "1", ("cluster-id", "model")),
    "score": (CPCFL, "2-evaluate", ("accuracy", "num-examples", "client-id")),
}
VALUES = ("inf", "-inf", "nan", "huge", "negative", "0.9", "string", "missing", "extra",
          "dtype", "shape")
HUGE = 10 ** 18
"""An integer that fits the wire's int64, beyond every count; 1e30 for an array."""
ARRAY_FIELDS = {"model", "answer"}


def _digest(content) -> str:
    """What a message holds, as one hash (the key its reply is kept by)."""
    from flwr.app import ArrayRecord

    h = hashlib.blake2b(digest_size=16)
    for name in sorted(content.keys()):
        record = content[name]
        h.update(f"{name}:{type(record).__name__}".encode())
        if isinstance(record, ArrayRecord):
            for key in record.keys():
                a = record[key]
                h.update(f"{key}{a.shape}{a.dtype}".encode())
                h.update(a.data)
        else:
            h.update(repr(sorted(record.items())).encode())
    return h.hexdigest()


class Replayed:
    """The ClientApp's handlers with each reply kept by (node, message) and replayed as a
    fresh copy; ``tamper(group, node index, content)`` may change the copy."""

    def __init__(self):
        self.kept, self.tamper = {}, None

    def wrap(self, handler):
        from flwr.app import Message

        def replayed(msg, context):
            key = (context.node_id, msg.metadata.message_type, msg.metadata.group_id,
                   _digest(msg.content))
            if key not in self.kept:
                self.kept[key] = handler(msg, context)
            kept = self.kept[key]
            if kept.has_error():
                return Message(kept.error, reply_to=msg)
            content = copy.deepcopy(kept.content)
            if self.tamper is not None:
                self.tamper(msg.metadata.group_id, context.node_id - 100, content)
            return Message(content, reply_to=msg)
        return replayed


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    """``run(config, tamper=None, refuse=())``: the in-process federation over the
    replayed nodes; returns its record and the server's final cluster models."""
    from cpcfl_tf.clustered import algorithm
    from cpcfl_tf.flower import client_app

    from cpcfl_tf.clustered import starting
    from cpcfl_tf.plan.identity import config_key

    out = tmp_path_factory.mktemp("checks") / "record.json"
    replay = Replayed()
    encoders, load = {}, starting.StartingEncoders

    class Loaded:  # the server's encoder, read from the cache once per config
        def __init__(self, **kwargs):
            self.kwargs = kwargs

        def __call__(self, run):
            key = config_key(run.requested)
            if key not in encoders:
                encoders[key] = load(**self.kwargs)(run)
            return encoders[key]
    handlers = {name: replay.wrap(getattr(client_app, name))
                for name in ("train", "evaluate", "query")}
    references = {}

    def run(config, tamper=None, refuse=()):
        ended = {}
        rounds = algorithm.run_rounds

        def kept(*args, **kwargs):
            ended["state"], progress = rounds(*args, **kwargs)
            return ended["state"], progress

        replay.tamper = tamper
        with pytest.MonkeyPatch.context() as patch:
            for name, handler in handlers.items():
                patch.setattr(client_app, name, handler)
            patch.setattr(algorithm, "run_rounds", kept)
            patch.setattr(starting, "StartingEncoders", Loaded)
            record = run_in_process({**config, "out": str(out)}, NODES, refuse=refuse)
        return record, ended["state"].models

    def without(config, group, node):
        key = (id(config), group, node)
        if key not in references:
            references[key] = run(config, refuse={(group, node)})
        return references[key]

    run.without = without
    return run


def _expected_valid(kind: str, field: str, value: str) -> bool:
    """Whether the field may hold the value (the reply then counts), by the protocol's
    definition of each field, not the parser's."""
    if value == "extra":
        return False  # a field the server does not know
    if value == "missing":
        return field == "num-partitions"  # the only optional one
    if field in ARRAY_FIELDS:  # finite values of the right shape and dtype count
        return value in ("huge", "negative", "0.9")
    number = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan, "huge": float(HUGE),
              "negative": -1.0, "0.9": 0.9}.get(value)
    if number is None:  # a string, a bool (dtype), a list (shape)
        return False
    if field == "accuracy":
        return 0 <= number <= 1
    if field == "loss":
        return math.isfinite(number)
    if field == "embedding_std":
        return math.isfinite(number) and number >= 0
    if field == "seconds":
        return 0 <= number <= CPCFL["round-timeout"]
    return False  # ids, counts, steps: each has one true integer value; these are not it


def _spoil(content, field: str, value: str) -> None:
    """Put ``value`` in ``field`` of a reply's content, as a node could send it."""
    from flwr.app import ArrayRecord, ConfigRecord

    if field in ARRAY_FIELDS:
        if value == "missing":
            del content[field]
            return
        if value == "string":
            content[field] = ConfigRecord({"0": "weights"})
            return
        arrays = content[field].to_numpy_ndarrays()
        first = arrays[0]
        filled = {"inf": np.inf, "-inf": -np.inf, "nan": np.nan, "huge": 1e30,
                  "negative": -1.0, "0.9": 0.9}
        if value in filled:
            arrays[0] = np.full_like(first, filled[value])
        elif value == "extra":
            arrays.append(np.zeros(2, first.dtype))
        elif value == "dtype":
            arrays[0] = first.astype(np.float64 if first.dtype != np.float64 else np.float32)
        elif value == "shape":
            arrays[0] = first.reshape(-1)[:-1]
        content[field] = ArrayRecord(numpy_ndarrays=arrays)
        return
    name = "identity" if "identity" in content.keys() else "metrics"
    items = dict(content[name])
    if value == "missing":
        del items[field]
    elif value == "extra":
        items["extra-key"] = 1
    else:
        items[field] = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan, "huge": HUGE,
                        "negative": -1, "0.9": 0.9, "string": "x", "dtype": True,
                        "shape": [1, 1]}[value]
    # A MetricRecord takes numbers only; a node may send any record: a ConfigRecord
    # carries the string and the bool.
    kind = type(content[name])
    try:
        content[name] = kind(items)
    except TypeError:
        content[name] = ConfigRecord(items)


CASES = st.sampled_from(sorted(KINDS)).flatmap(lambda kind: st.tuples(
    st.just(kind), st.sampled_from(KINDS[kind][2]), st.sampled_from(VALUES),
    st.sampled_from(range(len(NODES)))))


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(case=CASES)
def test_one_bad_value_in_any_field_leaves_out_that_reply_and_nothing_else(federation, case):
    kind, field, value, node = case
    config, group, _ = KINDS[kind]

    def tamper(at, index, content):
        if (at, index) == (group, node):
            _spoil(content, field, value)

    record, models = federation(config, tamper)
    if not _expected_valid(kind, field, value):
        reference, reference_models = federation.without(config, group, node)
        for key in ("cluster_ids", "replies", "failed_partitions", "accuracy"):
            assert ([r.get(key) for r in record["rounds"]]
                    == [r.get(key) for r in reference["rounds"]]), (case, key)
        assert record["final"]["client_accuracy"] == reference["final"]["client_accuracy"]
        for model, same in zip(models, reference_models):
            for a, b in zip(model, same):
                np.testing.assert_array_equal(a, b)
    elif kind in ("train", "train-tc", "score"):  # counted: the node is in its round
        r = int(group.split("-")[0]) - 1
        assert node not in record["rounds"][r]["failed_partitions"], case
        if kind == "score":
            assert record["final"]["client_accuracy"][str(node)] == pytest.approx(0.9)


def _honest(kind: str):
    """An honest reply of ``kind`` by hand (client 1 of 3, N = 2, 40 training and 60 test
    examples, FedSimCLR's batch of 64 and one local epoch), and the server's parse of it."""
    from flwr.app import ConfigRecord, MetricRecord, RecordDict

    from cpcfl_tf.flower.common import to_record

    model = [np.ones((3, 2), np.float32), np.zeros(2, np.float32)]
    if kind == "roster":
        return (RecordDict({"identity": ConfigRecord({"partition-id": 1, "num-partitions": 3})}),
                lambda c: checks.identity(c, num_clients=3, own=False))
    if kind == "first":
        like = np.zeros((12, 3), np.float32)
        return (RecordDict({"metrics": MetricRecord({"client-id": 1}),
                            "answer": to_record([like + 0.5])}),
                lambda c: checks.answered(c, client=1, like=like))
    if kind == "pretrain":
        return (RecordDict({"metrics": MetricRecord({
            "client-id": 1, "num-examples": 130, "steps": 2, "loss": 4.2, "embedding_std": 0.05,
            "seconds": 1.5}), "model": to_record(model)}),
            lambda c: checks.pretrained(c, client=1, most=130, like=model, batch_size=64,
                                        local_epochs=1, timeout=CPCFL["round-timeout"]))
    if kind in ("train", "train-tc"):
        return (RecordDict({"metrics": MetricRecord({"client-id": 1, "cluster-id": 1,
                                                     "num-examples": 40}),
                            "model": to_record(model)}),
                lambda c: checks.trained(c, client=1, num_models=2,
                                         expected=1 if kind == "train-tc" else None, most=40,
                                         models=[model, model]))
    return (RecordDict({"metrics": MetricRecord({"accuracy": 0.5, "num-examples": 60,
                                                 "client-id": 1})}),
            lambda c: checks.scored(c, client=1, most=60))


GRID = [(kind, field, value) for kind, (_, _, names) in sorted(KINDS.items())
        for field in names for value in VALUES]


def test_every_field_of_every_reply_refuses_every_value_it_may_not_hold():
    """The whole grid the property test samples, at the parser: each reply kind's every
    field with each bad value, refused exactly when the protocol says the field may not
    hold it; the honest reply is read as sent."""
    wrong = []
    for kind in KINDS:
        content, parse = _honest(kind)
        parse(content)  # the honest reply passes
    for kind, field, value in GRID:
        content, parse = _honest(kind)
        _spoil(content, field, value)
        try:
            parse(content)
            refused = False
        except checks.Refused:
            refused = True
        if refused == _expected_valid(kind, field, value):
            wrong.append((kind, field, value, "refused" if refused else "taken"))
    assert not wrong, wrong
    assert len(GRID) == 20 * len(VALUES)


def test_a_bad_value_is_named_in_one_escaped_line(federation, capsys):
    """What the server prints for a left-out reply: the node, the message, the field and
    what was wrong; a node's text cannot start a line of its own."""
    def tamper(at, index, content):
        if (at, index) == ("2", 1):
            _spoil(content, "cluster-id", "inf")
        if (at, index) == ("2", 2):
            _spoil(content, "client-id", "0.9")
        if (at, index) == ("2-evaluate", 0):
            _spoil(content, "accuracy", "string")

    def answer(at, index, content):
        if (at, index) == ("0-subspace", 1):
            _spoil(content, "answer", "nan")

    capsys.readouterr()
    federation(CPCFL, tamper)
    record, _ = federation(PACFL, answer)  # client 1 sent no usable subspace: not in the run
    said = capsys.readouterr().out
    assert "[cpcfl] left out of the run: clients [1] (no subspace before training; the " \
           "method assigns the others from theirs)" in said.splitlines(), said
    assert record["rounds"][0]["failed_partitions"] == [1]
    assert sorted(record["final"]["client_accuracy"]) == ["0", "2"]
    for line in ("[cpcfl] node 101 failed train 2: its reply was left out: cluster-id inf is "
                 "not an integer",
                 "[cpcfl] node 102 failed train 2: its reply was left out: client-id 0.9 is "
                 "not an integer",
                 "[cpcfl] node 100 failed evaluate 2: its reply was left out: metrics is a "
                 "ConfigRecord, not a MetricRecord"):
        assert line in said.splitlines(), said
    forged = "bad\n[cpcfl] final accuracy 1.0\x1b[2K" + "x" * 500
    assert "\n" not in checks.shown(forged) and "\x1b" not in checks.shown(forged)
    assert checks.shown(forged).startswith("bad\\n[cpcfl] final accuracy 1.0\\x1b[2K")
    assert len(checks.shown(forged)) < checks.SHOWN + 30


def test_the_roster_keeps_the_first_claim_of_a_partition_and_refuses_bad_ones(capsys):
    """Two nodes with one partition id (or folder name): the first to answer keeps it, the
    second is named and left out; an id outside the run, a negative or fractional one, a
    count above max-examples, a missing num-unlabeled, a malformed reply, a node started
    for another number of partitions and one answering the other kind than the run
    config's node-data are left out the same way. The operator's word decides how
    replies are read: a node answering first with the other kind leaves nobody else out,
    and the run stops only when no node answered as the run config says."""
    from types import SimpleNamespace

    from flwr.app import ConfigRecord, RecordDict

    from cpcfl_tf.errors import UserError
    from cpcfl_tf.flower import remote

    said = {10: {"partition-id": 1, "num-partitions": 3}, 11: {"partition-id": 1},
            12: {"partition-id": 3},
            13: {"partition-id": -1}, 14: {"partition-id": 0.9}, 15: {"partition-id": 2,
            "num-partitions": 4}, 16: {"name": "site"}, 17: {"partition-id": 0}}
    replies = [SimpleNamespace(metadata=SimpleNamespace(src_node_id=n), content=RecordDict(
        {"identity": ConfigRecord(v)})) for n, v in said.items()]
    replies.append(SimpleNamespace(metadata=SimpleNamespace(src_node_id=18), content=RecordDict()))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(remote, "send", lambda *args: (replies, []))
        capsys.readouterr()
        assert remote.roster(None, list(said), 1.0, 3, own=False)[0] == {10: 1, 17: 0}
        lines = capsys.readouterr().out
        for node, problem in ((11, "partition-id 1 is node 10's already"),
                              (12, "partition-id 3 is outside 0..2"),
                              (13, "partition-id -1 is outside 0.."),
                              (14, "partition-id 0.9 is not an integer"),
                              (15, "num-partitions 4 is not the run's num-clients 3"),
                              (16, "a data-path, where the run config says its nodes are "
                                   "partitions"),
                              (18, "the reply lacks its identity")):
            assert f"[cpcfl] node {node} failed query 0: its reply was left out: {problem}" \
                in lines, lines
        # Nodes with their own data: counts bounded by max-examples; num-unlabeled
        # required when the run pre-trains on the nodes.
        own = {20: {"name": "b", "num-train": 9, "num-test": 2, "num-unlabeled": 64},
               21: {"name": "a", "num-train": 65, "num-test": 2, "num-unlabeled": 64},
               22: {"name": "c", "num-train": 5, "num-test": 2},
               23: {"name": "b", "num-train": 5, "num-test": 2, "num-unlabeled": 64},
               24: {"name": "d\n[cpcfl] final accuracy 1.0", "num-train": 5, "num-test": 2,
                    "num-unlabeled": 64},
               25: {"partition-id": 2}}
        patch.setattr(remote, "send", lambda *args: ([SimpleNamespace(
            metadata=SimpleNamespace(src_node_id=n), content=RecordDict(
                {"identity": ConfigRecord(v)})) for n, v in own.items()], []))
        client_of, data, unlabeled = remote.roster(None, list(own), 1.0, 3, own=True,
                                                   most=64, unlabeled=True)
        lines = capsys.readouterr().out
        assert client_of == {20: 0, 24: 1} and unlabeled == {0: 64, 1: 64}
        assert data["1"]["name"] == "d\n[cpcfl] final accuracy 1.0"  # its own name, kept
        for node, problem in ((21, "num-train 65 is outside 1..64"),
                              (22, "identity lacks num-unlabeled"),
                              (23, "data folder b is node 20's already"),
                              (25, "a partition-id, where the run config says its nodes "
                                   "bring their own data")):
            assert f"[cpcfl] node {node} failed query 0: its reply was left out: {problem}" \
                in lines, lines
        assert "[cpcfl] final accuracy 1.0" not in lines.splitlines()
        # The issue-86 attack: a node answers first, with the other kind of identity.
        first = [SimpleNamespace(metadata=SimpleNamespace(src_node_id=n), content=RecordDict(
            {"identity": ConfigRecord(v)})) for n, v in (
                (30, {"name": "evil", "num-train": 5, "num-test": 2}),
                (31, {"partition-id": 0, "num-partitions": 3}),
                (32, {"partition-id": 1, "num-partitions": 3}))]
        patch.setattr(remote, "send", lambda *args: (first, []))
        assert remote.roster(None, [30, 31, 32], 1.0, 3, own=False)[0] == {31: 0, 32: 1}
        assert "node 30 failed query 0: its reply was left out: a data-path" \
            in capsys.readouterr().out
        # No node as the run config says (every one started for 4 partitions): stop,
        # naming how the nodes are to be started.
        patch.setattr(remote, "send", lambda *args: (replies[5:6], []))
        with pytest.raises(UserError, match="no node answered the roster as the run config "
                                            "says .*partition-id=K num-partitions=3"):
            remote.roster(None, [15], 1.0, 3, own=False)


def test_a_node_refuses_a_model_of_another_shape():
    """The ClientApp checks the server's models against its own template and answers with
    an error instead of training on them."""
    import time

    from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
    from flwr.common import Metadata

    from cpcfl_tf.flower import client_app
    from cpcfl_tf.flower.common import models_to_records

    run = CPCFL
    context = Context(run_id=1, node_id=100, node_config={"partition-id": 0,
                                                          "num-partitions": 3},
                      state=RecordDict(), run_config=dict(run))
    client_app._node(context)  # builds the node's template
    like = client_app._template_weights[tuple(sorted(run.items()))]
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


def test_the_field_checks_by_hand():
    like = [np.zeros((2, 3), np.float32), np.zeros(3, np.float32)]
    assert checks.weights_problem([w + 1 for w in like], like) is None
    assert checks.weights_problem(like[:1], like) == "1 weight arrays where the model has 2"
    assert "float64" in checks.weights_problem([like[0].astype(np.float64), like[1]], like)
    inf = [like[0], np.array([0, np.inf, 0], np.float32)]
    assert checks.weights_problem(inf, like) == "weight array 1 holds non-finite values"
    assert checks.integer(np.int64(2), "x", 0, 2) == 2 and checks.integer(0, "x", 0) == 0
    for bad in (3, -1, 2.0, 0.9, math.inf, math.nan, True, "1", [1], None, 10 ** 30):
        with pytest.raises(checks.Refused):
            checks.integer(bad, "x", 0, 2)
    assert checks.real(1, "x", 0, 1) == 1.0 and checks.real(np.float32(0.5), "x") == 0.5
    for bad in (1.01, -0.1, math.nan, math.inf, -math.inf, "0.5", False, [0.5]):
        with pytest.raises(checks.Refused):
            checks.real(bad, "x", 0, 1)
    # A folder name of 1 to 255 characters; FedEMA's mu, optional, in [0, 1].
    from flwr.app import ConfigRecord, MetricRecord, RecordDict

    from cpcfl_tf.flower.common import to_record

    def folder(name):
        return RecordDict({"identity": ConfigRecord({"name": name, "num-train": 3,
                                                     "num-test": 1})})
    assert checks.identity(folder("x" * 255), num_clients=3, own=True).name == "x" * 255
    for bad in ("", "x" * 256):
        with pytest.raises(checks.Refused, match="is not a folder name"):
            checks.identity(folder(bad), num_clients=3, own=True)
    parts = [np.zeros(2, np.float32)]

    def pretrained(**extra):
        return checks.pretrained(RecordDict({"metrics": MetricRecord({
            "client-id": 0, "num-examples": 64, "steps": 1, "loss": 1.0, "embedding_std": 0.1,
            "seconds": 2.0, **extra}), "model": to_record(parts)}), client=0, most=64,
            like=parts, batch_size=64, local_epochs=1, reported=("mu",), timeout=60.0)
    assert pretrained(mu=0.5).results["mu"] == 0.5 and "mu" not in pretrained().results
    for bad in (1.5, -0.1, math.nan):
        with pytest.raises(checks.Refused, match="mu"):
            pretrained(mu=bad)


def test_a_run_whose_rule_asks_first_stops_only_when_no_client_answered(capsys):
    """PACFL needs the clients' subspaces: without any usable one the run stops in one
    line (UserError); one usable answer is enough for the others to be left out."""
    from types import SimpleNamespace

    from flwr.app import MetricRecord, RecordDict

    from cpcfl_tf.errors import UserError
    from cpcfl_tf.flower import remote
    from cpcfl_tf.flower.common import run_config, to_record
    from cpcfl_tf.plan.resolve import resolve

    run = resolve(run_config(PACFL))
    good = np.eye(8 * 8 * 3, run.federated.options["basis"], dtype=np.float32)  # orthonormal

    def answers(*arrays):
        return lambda *args: ([SimpleNamespace(metadata=SimpleNamespace(src_node_id=10 + k),
                                               content=RecordDict({
                                                   "metrics": MetricRecord({"client-id": k}),
                                                   "answer": to_record([a])}))
                               for k, a in enumerate(arrays)], [])
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(remote, "send", answers(good[:-1], good * np.nan, good + 1))
        with pytest.raises(UserError, match="no client sent its subspace before training"):
            remote.ask_first(None, {10: 0, 11: 1, 12: 2}, run, 3, 1.0, image_shape=(8, 8, 3),
                             num_groups=3)
        lines = capsys.readouterr().out
        assert "node 12 failed query 0-subspace: its reply was left out: answer: the basis " \
               "is not orthonormal" in lines, lines
        patch.setattr(remote, "send", answers(good[:-1], good, good[:, :1]))
        got = remote.ask_first(None, {10: 0, 11: 1, 12: 2}, run, 3, 1.0,
                               image_shape=(8, 8, 3), num_groups=3)
        assert got[0] is None and got[2] is None and np.array_equal(got[1], good)
    assert "[cpcfl] left out of the run: clients [0, 2]" in capsys.readouterr().out


def test_every_tamper_a_node_can_rehearse_is_caught_by_the_servers_checks():
    # node config tamper=NAME (client_app.TAMPERS) rehearses an untrusted node on a real
    # federation (tests/test_flower.py sends NaN weights over loopback): each must be a
    # reply the server's parser refuses, for the reason its name says; huge-weights is a
    # finite model of the right shapes, which counts (robust aggregation is the defence).
    from flwr.app import MetricRecord, RecordDict

    from cpcfl_tf.flower.client_app import TAMPERS
    from cpcfl_tf.flower.common import to_record

    model = [np.ones((3, 2), np.float32), np.zeros(2, np.float32)]
    honest = {"cluster-id": 1, "num-examples": 40, "client-id": 0}
    said = {"nan-weights": "non-finite", "wrong-shape": "shape (3, 1)",
            "negative-count": "num-examples -5 is outside 1..40",
            "huge-count": "num-examples 1000000000 is outside 1..40",
            "foreign-cluster": "cluster-id 2 is outside 0..1", "huge-weights": None}
    assert set(TAMPERS) == set(said)
    for name, tamper in TAMPERS.items():
        weights, metrics = tamper(list(model), dict(honest), 2)
        content = RecordDict({"metrics": MetricRecord(metrics), "model": to_record(weights)})
        try:
            reply = checks.trained(content, client=0, num_models=2, expected=None, most=40,
                                   models=[model, model])
        except checks.Refused as err:
            assert said[name] is not None and said[name] in str(err), (name, err)
        else:
            assert said[name] is None, name
            assert np.abs(reply.weights[0]).max() == np.float32(1e30)
