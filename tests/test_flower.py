"""A real Flower federation on loopback (``-k flower``): 1 SuperLink + 3 SuperNodes as
processes serving one run, each node with its own data folder (the smoke partition
exported), N = 2, one SuperNode killed in the last of two rounds; the Simulation Engine;
and the ServerApp and ClientApp in one process (``helpers.InProcessGrid``) for what they
compute. Skipped when the ``[flower]`` extra is not installed."""
import os
import time

import pytest

pytest.importorskip("flwr")
pytestmark = pytest.mark.flower

from cpcfl_tf.methods import clustering
from cpcfl_tf.flower.loopback import LoopbackFederation, wait_for_file  # noqa: E402
from cpcfl_tf.plan.resolve import pretraining_of, resolve  # noqa: E402
from helpers import run_in_process, script, simulated  # noqa: E402

RUN = {"preset": "smoke", "method": "cp-cfl", "pretraining": "simclr", "num-clusters": 2,
       "num-clients": 3, "head-rounds": 1, "seed": 0}


@pytest.fixture(scope="module")
def env():
    """The processes' environment: the suite's encoder cache, so the SuperLink's
    ServerApp loads the encoder the simulator side pre-trained."""
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")


UNREGISTERED, WITHOUT_CA = 3, 4
"""The secured federation's two nodes that must not join: one whose key the SuperLink
does not know, one not given the CA (its key registered)."""

DUPLICATE = 5
"""A registered node with the CA given client 0's folder too: two nodes claim one client;
the server keeps the first to answer and leaves the other out, naming it."""

TAMPERING = 1
"""The node (client 1) that sends NaN weights in round 2 (node config ``tamper``): a
registered node can still lie, and the server must leave its reply out."""


@pytest.fixture(scope="module")
def federation(tmp_path_factory, env):
    """A secured federation, as docs/flower.md deploys one across machines: one SuperLink
    with TLS and SuperNode authentication (credentials made by the kit's command) and 3
    SuperNodes, each with its key registered, the CA, and its own data folder (node config
    ``data-path``: the smoke partition of 3 clients, exported with each client's share of
    :data:`KILLED`'s unlabeled deal in ``unlabeled/``; client 1 :data:`TAMPERING`); and
    two more SuperNodes that must
    be kept out (:data:`UNREGISTERED`, :data:`WITHOUT_CA`), given client 0's folder; and a
    registered one with client 0's folder too (:data:`DUPLICATE`), which joins and must
    be refused by the server's roster.
    Stopped (every process group gone) after the module."""
    from cpcfl_tf.flower.credentials import make

    root = tmp_path_factory.mktemp("sites")
    sites = root / "clients"
    script("export_partition").main(["--preset", "smoke", "--out", str(sites),
                                     "--set", "partition.num_clients=3",
                                     "--set", "federated.pretraining=fed-simclr",
                                     *(f"--set={s}" for s in KILLED["set"].split())])
    configs = [f'data-path="{p}"' for p in sorted(p for p in sites.iterdir() if p.is_dir())]
    good = [*configs[:TAMPERING], f'{configs[TAMPERING]} tamper="nan-weights" tamper-round=2',
            *configs[TAMPERING + 1:]]
    credentials = make(root / "credentials", nodes=6)
    with LoopbackFederation.start([*good, configs[0], configs[0], configs[0]],
                          tmp_path_factory.mktemp("federation"), env=env,
                          credentials=credentials, unregistered=[UNREGISTERED],
                          without_ca=[WITHOUT_CA]) as fed:
        yield fed
    _stopped(fed)


def _group_alive(pid):
    try:
        os.killpg(pid, 0)
        return True
    except ProcessLookupError:
        return False


def _stopped(fed):
    for proc in [fed.superlink, *fed.supernodes]:
        assert proc.poll() is not None
        deadline = time.monotonic() + 20  # killed children are reaped by init
        while _group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _group_alive(proc.pid), f"processes of group {proc.pid} outlived the test"


def _first_pretrain_round(run):
    """Each client's loss in the simulator's first round of ``run``'s federated
    pre-training, as the ServerApp prints the nodes' (for a failure's message)."""
    from cpcfl_tf.clustered.clients import unlabeled_for
    from cpcfl_tf.flower.common import run_config
    from cpcfl_tf.pretraining.fedavg_ssl import ClientState
    from cpcfl_tf.pretraining.federated_pretrain import LocalTrainer

    config = run_config({**run, "rounds": 1})
    images = unlabeled_for(config)
    trainer = LocalTrainer(pretraining_of(config), tuple(images[0].shape[1:]))
    start = trainer.initial()
    return ", ".join(f"{k} {trainer.round(start, ClientState.from_arrays({}), x, 0, k)[1]['loss']!r}"
                     for k, x in enumerate(images))


def _simulated(rounds, out, dropped=None, run=RUN):
    return simulated(run, rounds, out, dropped)


KILLED = {**RUN, "pretraining": "fed-simclr", "node-data": "own", "max-examples": 10 ** 6,
          "set": "partition.unlabeled=groups pretrain.options.fed.batch_size=64 "
                 "pretrain.options.fed.rounds=1"}
"""The loopback run: one round of FedSimCLR on the nodes' own unlabeled folders first
(the killed-node test checks that its encoder makes a killed node's missing reply change
a live client's accuracy). The operator bounds the counts the nodes report
(``max-examples``), so each weighs as reported, as the simulator weighs it (without it a
count weighs at most the nodes' lower median: tests/test_flower_nodes.py)."""


FEDEMA = {**RUN, "pretraining": "fedema-byol",
          "set": "partition.unlabeled=iid pretrain.options.fedema.batch_size=64 "
                 "pretrain.options.fedema.rounds=2"}


PACFL = {**RUN, "method": "pacfl", "pretraining": "none", "head-rounds": 0}


FEDGROUP = {**RUN, "method": "fedgroup", "pretraining": "none", "head-rounds": 0}


def test_fedgroup_groups_the_nodes_as_the_simulator(tmp_path):
    # FedGroup's cold start clusters the nodes' round-1 updates on the server (decomposed
    # cosines, k-means++), and each node is scored with its group's model. The rule is the
    # simulator's: the same groups, scores and bytes. The ServerApp and ClientApp run in
    # this process (helpers.InProcessGrid); the loopback run below carries the same kinds
    # of message over the wire.
    ids, accuracy, _, sim_final = _simulated(1, tmp_path / "sim", run=FEDGROUP)
    record = run_in_process({**FEDGROUP, "rounds": 1, "out": str(tmp_path / "result.json")},
                            [{"partition-id": k, "num-partitions": 3} for k in range(3)])
    assert [r["cluster_ids"] for r in record["rounds"]] == ids
    final = record["final"]["client_accuracy"]
    assert [final[str(k)] for k in range(3)] == pytest.approx(list(accuracy[-1]), abs=1e-6)
    assert (record["final"]["bytes_down"], record["final"]["bytes_up"]) == (
        sim_final.bytes_down, sim_final.bytes_up)


@pytest.mark.parametrize("method", ["fedper", "fedrep", "lg-fedavg", "ditto", "fedavg-ft"])
def test_a_personalized_method_runs_as_the_simulator_with_each_nodes_part_in_its_state(
        tmp_path, monkeypatch, method):
    # Each node keeps its part (FedPer's and FedRep's head, LG-FedAvg's encoder, Ditto's
    # personal model) in its context.state, never sent: the shared arrays go both ways,
    # the part every client starts from only until the node has trained once. FedAvg+FT's
    # nodes fine-tune before they are scored. Two rounds: the second trains from the part
    # the first kept, so the simulator's scores, cluster ids and bytes hold only if it was.
    from cpcfl_tf.clustered.algorithm import kept_arrays, unsent_arrays
    from cpcfl_tf.clustered.pool import template_for
    from cpcfl_tf.flower import client_app, in_process
    from cpcfl_tf.flower.common import run_config

    # Batches of 8 of a client's 20 examples: the batch order matters. FedRep: its head's
    # epoch, then its encoder's.
    run = {**RUN, "method": method, "set": "federated.batch_size=8" + (
        " federated.local_epochs=2" if method == "fedrep" else "")}
    ids, accuracy, _, sim_final = _simulated(2, tmp_path / "sim", run=run)
    plan = resolve(run_config({**run, "rounds": 2}))
    weights = template_for(plan, (32, 32, 3), 10).get_weights()
    num_encoder = len(template_for(plan, (32, 32, 3), 10).get_layer("encoder").weights)
    wire = len(weights) - len(unsent_arrays(plan, num_encoder, len(weights)))
    part = len(kept_arrays(plan, num_encoder, len(weights)))
    seen, grids, last = [], [], {}
    real = in_process.InProcessGrid.send_and_receive

    def spy(self, messages, timeout=None):
        grids.append(self)
        replies = real(self, messages, timeout)
        for sent, reply in zip(messages, replies):
            content = sent.content
            models = [len(r) for k, r in content.array_records.items() if k != "part"]
            back = len(reply.content["model"]) if reply.has_content() and \
                "model" in reply.content else None
            seen.append((str(sent.metadata.message_type), sent.metadata.dst_node_id,
                         models, "part" in content, back))
            last[sent.metadata.dst_node_id] = sent
        return replies

    monkeypatch.setattr(in_process.InProcessGrid, "send_and_receive", spy)
    record = run_in_process({**run, "rounds": 2, "out": str(tmp_path / "result.json")},
                            [{"partition-id": k, "num-partitions": 3} for k in range(3)])
    assert [r["cluster_ids"] for r in record["rounds"]] == ids
    # Bit for bit: each client's accuracy, and their mean in client order (mean_accuracy).
    assert [r["accuracy"] for r in record["rounds"]] == [float(a.mean()) for a in accuracy]
    final = record["final"]["client_accuracy"]
    assert [final[str(k)] for k in range(3)] == [float(a) for a in accuracy[-1]]
    assert (record["final"]["bytes_down"], record["final"]["bytes_up"]) == (
        sim_final.bytes_down, sim_final.bytes_up)
    assert record["final"].get("bytes_kept", 0) == sim_final.bytes_kept == 3 * sum(
        weights[i].nbytes for i in kept_arrays(plan, num_encoder, len(weights)))
    modelled = [s for s in seen if s[2]]  # the train and evaluate messages
    assert modelled and all(m == [wire] for s in modelled for m in [s[2]]), modelled
    assert all(s[4] in (None, wire) for s in modelled)  # replies: the shared arrays only
    trained: set = set()
    for kind, node, _, with_part, _ in modelled:  # the starting part until a node trained
        assert with_part == (part > 0 and node not in trained), (kind, node, seen)
        if "train" in kind:
            trained.add(node)
    states = [c.state.array_records.get(client_app._PART) for c in grids[-1].contexts.values()]
    assert all(s is None if part == 0 else len(s) == part for s in states), states
    if part:  # a node that lost its state is refused, in one line, not scored
        from flwr.app import RecordDict

        node, grid = 100, grids[-1]
        grid.contexts[node].state = RecordDict()
        (reply,) = real(grid, [last[node]])
        assert reply.has_error() and "holds none (its state was lost)" in reply.error.reason


def test_flower_federation_runs_the_simulators_rounds_and_survives_a_killed_supernode(
        tmp_path, federation):
    # One run (each ClientApp message starts a Python process with TensorFlow: runs are
    # slow to start), of nodes that read their own folders: the simulator's run of the
    # partition and unlabeled deal they were exported from. First one round of FedSimCLR
    # on the nodes' unlabeled folders (the encoder must be the simulator's, bit for bit);
    # then round 1 draws at random with the encoder frozen (t < Tc), round 2 selects by
    # loss; SuperNode 2 is killed in round 2, and client 1 sends NaN weights there. The
    # simulator, told that client 2's round-2 reply never comes and client 1's is left
    # out, must give the same run.
    ids, accuracy, encoder, sim_final = _simulated(2, tmp_path / "sim", run=KILLED,
                                                   dropped={2: [TAMPERING, 2]})
    # With this encoder the live clients' accuracy tells the runs apart: a federation
    # that waited for, or averaged in, client 2's reply or client 1's NaN would fail the
    # checks below.
    _, alive, _, _ = _simulated(2, tmp_path / "alive", run=KILLED)
    assert list(alive[-1][:2]) != list(accuracy[-1][:2])
    log = federation.workdir / "supernode-2.log"
    before = log.read_text().count("Receiving: train message")  # of earlier runs
    # The timeout is a loaded machine's: under CI's other workers a node's round, its
    # process's TensorFlow import included, may take over a minute. The killed node's
    # round ends sooner, when the SuperLink marks the node unavailable.
    run_id = federation.run({**KILLED, "rounds": 2, "round-timeout": 150.0, "min-nodes": 4,
                             "out": str(tmp_path / "result.json")})
    deadline = time.monotonic() + 400
    while log.read_text().count("Receiving: train message") < before + 3:  # 1 + 2 rounds
        assert time.monotonic() < deadline, "SuperNode 2 never got round 2's train message"
        assert federation.superlink.poll() is None, "the SuperLink died"
        time.sleep(0.2)
    federation.kill_supernode(2)  # in the middle of round 2
    record = wait_for_file(tmp_path / "result.json", federation, timeout=540)
    from cpcfl_tf.records.files import weights_fingerprint

    # Secured: the node whose key the SuperLink does not know and the node without the
    # CA were kept out (each process ended, saying why), and the run went on without them.
    refused = federation.refused()
    assert set(refused) == {UNREGISTERED, WITHOUT_CA}, refused
    assert "Failed to activate SuperNode" in refused[UNREGISTERED]
    assert "CERTIFICATE_VERIFY_FAILED" in refused[WITHOUT_CA]
    assert sorted(record["nodes"].values()) == [0, 1, 2]
    assert [record["node_data"][str(k)]["name"] for k in range(3)] == [
        "client-000", "client-001", "client-002"]  # by folder name: SuperNode k is client k
    # On a mismatch, the ServerApp's lines (rounds, and each failed node's reason) say why.
    assert record["environment"]["starting_encoder"] == weights_fingerprint(encoder), \
        federation.server_lines(run_id)
    assert [r["cluster_ids"] for r in record["rounds"]] == ids, federation.server_lines(run_id)
    first, second = record["rounds"]
    assert first["replies"] == 3 and first["failed_partitions"] == []
    # The dead node and the one that sent NaN are left out of round 2 and keep their
    # cluster ids; client 0 trains on.
    assert second["replies"] == 1 and second["failed_partitions"] == [TAMPERING, 2]
    assert [second["cluster_ids"][k] for k in (TAMPERING, 2)] == [
        first["cluster_ids"][k] for k in (TAMPERING, 2)]
    node_of = {client: node for node, client in record["nodes"].items()}
    named = f"node {node_of[2]} failed train 2: "  # its error (or timeout), named
    lied = (f"node {node_of[TAMPERING]} failed train 2: its reply was left out: model: "
            "weight array 0 holds non-finite values")
    lines = federation.server_lines(run_id, until=named)
    assert any(named in line for line in lines), lines
    assert any(lied in line for line in lines), lines
    # Two nodes with client 0's folder (DUPLICATE): the first to answer the roster is
    # client 0, the other is named and left out.
    assert len([line for line in lines if "failed query 0: its reply was left out: data "
                f"folder client-000 is node {node_of[0]}'s already" in line]) == 1, lines
    # Every round is scored (T = 2: each is a quarter), on the nodes' own test data, as
    # the simulator scores it; the dead node answers no evaluation in round 2.
    # (Seen once in a CI run, not since, alone or under load: round 2's accuracy off by
    # three test images; most likely the server's pool drawn while Flower's heartbeat
    # thread drew from Python's random, which cpcfl_tf/models/seeding.py now rules out.
    # The message carries what tells the readings apart.)
    assert [r["accuracy"] for r in record["rounds"]] == pytest.approx(
        [accuracy[0].mean(), accuracy[1][:2].mean()], abs=1e-6), "\n".join([
            f"nodes' final accuracies {record['final']['client_accuracy']}; the simulator's "
            f"with client 2 dead {list(accuracy[-1])}, with all alive {list(alive[-1])}",
            *federation.server_lines(run_id)])
    final = record["final"]["client_accuracy"]
    assert set(final) == {"0", "1"}
    assert [final["0"], final["1"]] == pytest.approx(list(accuracy[1][:2]), abs=1e-6)
    assert record["final"]["accuracy"] == record["rounds"][-1]["accuracy"]
    # Both drivers count the pool down to every participant, also in the Tc round 1.
    assert (record["final"]["bytes_down"], record["final"]["bytes_up"]) == (
        sim_final.bytes_down, sim_final.bytes_up)
    assert sim_final.bytes_down == 2 * 3 * RUN["num-clusters"] * sim_final.model_bytes


def test_the_launchers_wait_ends_naming_the_servers_error_when_its_run_ends_without_a_result(
        tmp_path, federation):
    # A ServerApp that raises ends the run without a result: the launcher's wait ends
    # within seconds of the SuperLink saying so, with the ServerApp's error in one line,
    # not after the run's timeout (rounds x round-timeout + 600 s). Here: FedRep at the
    # smoke preset's one local epoch, which the method refuses (the launcher's own
    # command refuses it before starting anything: the next test).
    from cpcfl_tf.errors import UserError

    out = tmp_path / "result.json"
    run_id = federation.run({**KILLED, "method": "fedrep", "num-clusters": 1, "head-rounds": 0,
                             "out": str(out)})
    started = time.monotonic()
    with pytest.raises(UserError, match=r"^the ServerApp ended without a result: UserError: "
                       r"fedrep trains the head, then the encoder: federated.local_epochs "
                       rf"must be at least 2, got 1 \(flwr log {run_id}; logs in "):
        wait_for_file(out, federation, timeout=900, run_id=run_id)
    assert time.monotonic() - started < 120 and not out.exists()


def test_the_simulation_engine_runs_the_simulators_rounds(tmp_path, env):
    # `flwr run . local` with 3 virtual SuperNodes, as a Flower user runs it: one process
    # serves every partition (the ClientApp keeps one run's data and model, not one
    # partition's), and the run is the simulator's. Its first stage pre-trains the
    # encoder on the nodes' dealt unlabeled images (FedEMA-BYOL, two rounds: the second
    # needs what each node kept from the first, BYOL's target, FedEMA's previous weights
    # and lambda, in its context.state); every client round is the simulator's
    # computation, so the encoder is the simulator's bit for bit. Then PACFL: before
    # training every node sends its data subspace (a second query, the only one that
    # loads data); the server clusters them and from then on sends each node its own
    # cluster's model only. (The same ServerApp and ClientApp as on the Deployment
    # Engine: only the transport differs; the suite's Deployment-Engine run of this
    # stage, at 3123e7d, gave the simulator's encoder too.)
    pytest.importorskip("ray", reason='the Simulation Engine needs pip install -e ".[flower-sim]"')
    from cpcfl_tf.flower.simulation import simulate
    from cpcfl_tf.methods.federated import METHODS
    from cpcfl_tf.records.files import weights_fingerprint

    run = {**PACFL, "pretraining": "fedema-byol", "set": FEDEMA["set"]}
    ids, accuracy, encoder, sim_final = _simulated(1, tmp_path / "sim", run=run)
    record = simulate({**run, "rounds": 1, "out": str(tmp_path / "out" / "result.json")}, 3,
                      tmp_path / "engine", env=env)
    log = (tmp_path / "engine" / "flwr-run.log").read_text()
    said = "\n".join(line for line in log.splitlines()
                     if "[cpcfl]" in line or "ERROR" in line or "Traceback" in line)
    for r in (1, 2):  # a node left out of either round would give another encoder
        assert f"fedema-byol round {r}/2: 3 replies, 0 failed" in log, log[-3000:]
    if record["environment"]["starting_encoder"] != weights_fingerprint(encoder):
        pytest.fail(f"the engine's encoder is not the simulator's; the simulator's first "
                    f"round, client by client: {_first_pretrain_round(run)}\n{said}")
    assert [r["cluster_ids"] for r in record["rounds"]] == ids
    final = record["final"]["client_accuracy"]
    assert [final[str(k)] for k in range(3)] == pytest.approx(list(accuracy[-1]), abs=1e-6)
    basis = METHODS["pacfl"].options["basis"]
    assert sim_final.bytes_other == 3 * 32 * 32 * 3 * basis * 4  # three clients' d x p float32
    assert (record["final"]["bytes_down"], record["final"]["bytes_up"],
            record["final"]["bytes_other"]) == (sim_final.bytes_down, sim_final.bytes_up,
                                                sim_final.bytes_other)
    assert sim_final.bytes_down == 1 * 3 * sim_final.model_bytes  # one model per node


def test_a_simulation_starts_its_own_superlink_and_refuses_a_run_another_one_took(
        tmp_path, monkeypatch):
    # `flwr run . local` hands the run to any SuperLink already answering on its local
    # port (39091 by default): one another simulation started with its own environment,
    # or a Deployment process that got the port. simulate() gives each run a free port
    # of its own and refuses a result its own SuperLink did not make.
    import json
    import socket
    from pathlib import Path
    from types import SimpleNamespace

    from cpcfl_tf.errors import UserError
    from cpcfl_tf.flower import loopback, simulation

    seen = []

    def flwr_run(command, *, env, **_):
        seen.append(int(env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"]))
        with socket.socket() as s:  # the port was free when the command was made
            s.bind((loopback.HOST, seen[-1]))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"final": {}}))
        if started:  # what Flower's managed SuperLink logs in the Flower home it serves
            log = Path(env["FLWR_HOME"]) / "local-superlink" / "superlink.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text("INFO flwr | Created run 42 in federation @none/default\n")
        return SimpleNamespace(stdout="", stderr="")

    monkeypatch.setattr(simulation.subprocess, "run", flwr_run)
    out = tmp_path / "out" / "result.json"
    started = True
    assert simulation.simulate({**RUN, "out": str(out)}, 3, tmp_path / "a") == {"final": {}}
    started = False
    out.unlink()
    with pytest.raises(UserError, match="the run went to a SuperLink this call did not "
                                        "start .*; run it again"):
        simulation.simulate({**RUN, "out": str(out)}, 3, tmp_path / "b")
    assert len(seen) == 2


def test_the_server_leaves_out_nodes_started_for_another_number_of_partitions(monkeypatch,
                                                                              capsys):
    # Under the Simulation Engine a node's config carries num-partitions = num-supernodes
    # (Flower's contract; the engine run above reads partition-id from the same config).
    # The run config's num-clients is the operator's word: a node that says otherwise is
    # left out, named; the run stops only when every node does.
    from types import SimpleNamespace

    from cpcfl_tf.errors import UserError
    from cpcfl_tf.flower import remote

    from flwr.app import ConfigRecord, RecordDict

    def node(n, declared):
        return SimpleNamespace(metadata=SimpleNamespace(src_node_id=n), content=RecordDict(
            {"identity": ConfigRecord({"partition-id": n, "num-partitions": declared})}))

    monkeypatch.setattr(remote, "send", lambda *args: ([node(0, 4), node(1, 3)], []))
    assert remote.roster(None, [0, 1], 1.0, 3, own=False)[0] == {1: 1}
    assert ("node 0 failed query 0: its reply was left out: num-partitions 4 is not the "
            "run's num-clients 3 (under the Simulation Engine: num-supernodes)"
            in capsys.readouterr().out)
    monkeypatch.setattr(remote, "send", lambda *args: ([node(0, 4)], []))
    with pytest.raises(UserError, match="start the SuperNodes with partition-id=K "
                                        "num-partitions=3 \\(under the Simulation Engine "
                                        "num-supernodes=3\\)"):
        remote.roster(None, [0], 1.0, 3, own=False)
    assert remote.roster(None, [0], 1.0, 4, own=False)[0] == {0: 0}  # the same number


def test_a_node_answers_what_its_method_asks_first():
    import numpy as np
    from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
    from flwr.common import Metadata

    from cpcfl_tf.clustered.clients import clients_for
    from cpcfl_tf.flower.client_app import query
    from cpcfl_tf.flower.common import from_record, run_config

    meta = Metadata(run_id=1, message_id="m", src_node_id=1, dst_node_id=5,
                    reply_to_message_id="", group_id="0", created_at=time.time(), ttl=60.0,
                    message_type=MessageType.QUERY)
    pacfl = {"num-clients": 3, "method": "pacfl", "pretraining": "none"}
    clients = clients_for(run_config(pacfl))

    def ask(run, what, **question):  # the question as the server sends it (the rule's)
        context = Context(run_id=1, node_id=5, node_config={"partition-id": 1},
                          state=RecordDict(), run_config=run)
        content = RecordDict({"config": ConfigRecord({"ask": what, **question,
                                                      "client-id": 1})})
        reply = query(Message(content, metadata=meta), context).content
        assert dict(reply["metrics"]) == {"client-id": 1}
        return from_record(reply["answer"])[0]

    oracle = {**pacfl, "method": "oracle"}
    assert ask(oracle, "group").tolist() == [int(clients.groups[1])]
    np.testing.assert_array_equal(ask(pacfl, "subspace", basis=3),
                                  clustering.data_subspace(clients.train.images[1], 3))


def test_a_scored_round_scores_each_node_with_its_model_or_the_one_it_would_choose(
        monkeypatch):
    # The server sends a node its cluster's model; one that has not taken part yet the
    # model planned for it, else the pool, from which the node scores the model of lowest
    # loss on its own training data (the simulator's rule). Rounds the simulator does not
    # score send nothing; a node that does not answer is a failed partition of the round.
    from types import SimpleNamespace

    import numpy as np
    from flwr.app import Context, Message, MessageType, RecordDict
    from flwr.common import Metadata

    from cpcfl_tf.clustered import algorithm
    from cpcfl_tf.clustered.backends import client_losses
    from cpcfl_tf.clustered.pool import build_template, initial_pool
    from cpcfl_tf.flower import client_app, remote
    from cpcfl_tf.flower.common import from_record, run_config

    run = {"num-clients": 3, "method": "ifca", "pretraining": "none", "num-clusters": 3,
           "rounds": 8, "set": "federated.eval_every=3"}
    plan = resolve(run_config(run))
    pool = initial_pool(plan, build_template(plan, (32, 32, 3), 10), None, seed=0, attempt=0)
    # Model k all but always says class (3, 0, 5)[k]: client 1 holds 2, 0 and 8 of those.
    pool = [[*m[:-1], 20 * np.eye(10, dtype=np.float32)[c]] for m, c in zip(pool, (3, 0, 5))]
    contexts = {10 + k: Context(run_id=1, node_id=10 + k, node_config={"partition-id": k},
                                state=RecordDict(), run_config=run) for k in range(3)}
    sent = {}

    def evaluate(node, content):
        meta = Metadata(run_id=1, message_id="m", src_node_id=1, dst_node_id=node,
                        reply_to_message_id="", group_id="e", created_at=time.time(),
                        ttl=60.0, message_type=MessageType.EVALUATE)
        return client_app.evaluate(Message(content, metadata=meta), contexts[node])

    def send(grid, contents, kind, group, timeout):  # nodes 10, 11 answer; 12 is silent
        sent.clear()
        sent.update(contents)
        return [evaluate(node, content) for node, content in contents.items()
                if node != 12], []

    monkeypatch.setattr(remote, "send", send)
    grid = SimpleNamespace(get_node_ids=lambda: [10, 11, 12])
    nodes = remote.Nodes(grid, {10: 0, 11: 1, 12: 2}, 3, 1.0, plan)
    trained = algorithm.Replies(np.array([0]), np.array([2]), np.array([1.0]), [], [])
    assigned = np.array([2, -1, -1])  # client 0 took part; 1 and 2 have not yet
    assert [r for r in range(1, 9) if plan.federated.scored(r)] == [2, 3, 4, 6, 8]  # quarters, 3s, last
    assert "accuracy" not in nodes.observe(pool, assigned, trained, 1) and not sent

    record = nodes.observe(pool, assigned, trained, 3)
    assert sorted(sent[10].array_records) == ["model-2"]  # its cluster's model
    assert sorted(sent[11].array_records) == ["model-0", "model-1", "model-2"]
    assert record["failed_partitions"] == [2] and sorted(nodes.scores) == [0, 1]
    assert record["accuracy"] == pytest.approx(np.mean([nodes.scores[0], nodes.scores[1]]))
    _, data, _, backend, _ = client_app._node(contexts[11])
    assert int(client_losses(backend, pool, data)[0].argmin()) == 2
    alone = [evaluate(11, RecordDict({"config": sent[11]["config"],
                                      f"model-{n}": sent[11][f"model-{n}"]})) for n in range(3)]
    assert [a.content["metrics"]["accuracy"] for a in alone] == pytest.approx([0.1, 0, 0.4])
    assert nodes.scores[1] == alone[2].content["metrics"]["accuracy"]

    nodes.observe(pool, assigned, trained, 4, planned=np.array([0, 1, 0]))
    assert sorted(sent[11].array_records) == ["model-1"]
    got = from_record(sent[11]["model-1"])
    assert all(np.array_equal(a, b) for a, b in zip(got, pool[1]))  # the planned model


def test_a_rounds_accuracy_is_the_mean_in_client_order_whatever_order_the_replies_came_in():
    # The simulator averages its clients' accuracies in client order; summed in the
    # order the replies came in, the mean can differ in its last bit (0.45, 0.5, 0.6 do).
    from types import SimpleNamespace

    import numpy as np

    from cpcfl_tf.clustered import algorithm
    from cpcfl_tf.flower import remote
    from cpcfl_tf.flower.common import run_config

    plan = resolve(run_config({"num-clients": 3, "method": "fedavg", "pretraining": "none",
                               "num-clusters": 1, "rounds": 1, "head-rounds": 0}))
    grid = SimpleNamespace(get_node_ids=lambda: [10, 11, 12])
    nodes = remote.Nodes(grid, {10: 0, 11: 1, 12: 2}, 3, 1.0, plan)
    came = {2: 0.6, 1: 0.5, 0: 0.45}  # the last node's reply first
    nodes.evaluate = lambda *args, **kw: (dict(came), [])
    trained = algorithm.Replies(np.array([0, 1, 2]), np.zeros(3, np.int64), np.ones(3), [], [])
    record = nodes.observe([[]], np.zeros(3, np.int64), trained, 1)
    in_client_order = float(np.array([0.45, 0.5, 0.6]).mean())
    assert float(np.mean(list(came.values()))) != in_client_order  # the order shows here
    assert record["accuracy"] == in_client_order
    assert remote.mean_accuracy(came) == in_client_order


def test_a_message_for_another_client_is_refused_by_the_node_it_reached():
    # The server names the client in every message after the roster (its id; for a node
    # with its own data also the folder's name) and the node checks it against its own
    # config: a misdelivered message is an error reply, not one client's model trained or
    # scored on another client's data.
    import time

    from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
    from flwr.common import Metadata

    from cpcfl_tf.flower import client_app, remote

    def reply(handler, kind, node_config, settings):
        meta = Metadata(run_id=1, message_id="m", src_node_id=1, dst_node_id=5,
                        reply_to_message_id="", group_id="1", created_at=time.time(),
                        ttl=60.0, message_type=kind)
        context = Context(run_id=1, node_id=5, node_config=node_config, state=RecordDict(),
                          run_config={"num-clients": 3})
        message = Message(RecordDict({"config": ConfigRecord(settings)}), metadata=meta)
        got = handler(message, context)
        return got.error.reason if got.has_error() else None

    partition = {"partition-id": 1}
    for handler, kind, extra in ((client_app.train, MessageType.TRAIN,
                                  {"round": 0, "attempt": 0, "num-clients": 3}),
                                 (client_app.evaluate, MessageType.EVALUATE, {}),
                                 (client_app.query, MessageType.QUERY, {"ask": "group"})):
        reason = reply(handler, kind, partition, {**extra, "client-id": 2})
        assert "a message for client 2 (2) reached the node of 1" in reason
    # The right addressee passes; a node with its own data checks the folder's name.
    def context(node_config):
        return Context(run_id=1, node_id=5, node_config=node_config, state=RecordDict(),
                       run_config={"num-clients": 3})

    assert client_app._addressed({"client-id": 1}, context(partition)) is None
    assert client_app._addressed({"client-id": 0, "name": "site-a"},
                                 context({"data-path": "/data/site-a"})) is None
    names = {0: "site-a", 1: "site-b"}
    own = {"data-path": "/data/site-a"}
    assert remote.addressee(1, names) == {"client-id": 1, "name": "site-b"}
    assert remote.addressee(1, None) == {"client-id": 1}
    reason = reply(client_app.evaluate, MessageType.EVALUATE, own, remote.addressee(1, names))
    assert "a message for client 1 (site-b) reached the node of site-a" in reason


def test_flower_loopback_rejects_bad_input_before_starting_anything(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "cpcfl_tf.flower.loopback", "--preset", "huge",
                           "--out", str(tmp_path / "out")], capture_output=True, text=True,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), timeout=120)
    assert proc.returncode == 2
    lines = [l for l in proc.stderr.splitlines() if l.startswith("error:")]
    assert len(lines) == 1 and "unknown preset 'huge'" in lines[0]
    assert not (tmp_path / "out").exists()
    # What the ServerApp's plan would refuse is refused here too, before any process.
    from cpcfl_tf.errors import UserError
    from cpcfl_tf.flower import loopback

    with pytest.raises(UserError, match="^fedrep trains the head, then the encoder: "
                                        "federated.local_epochs must be at least 2, got 1$"):
        loopback.main(["--method", "fedrep", "--out", str(tmp_path / "plan")])
    assert not (tmp_path / "plan").exists()


def test_the_servers_error_is_its_tracebacks_last_line_and_the_status_flwr_ls_gives():
    from cpcfl_tf.flower.loopback import error_line, run_status

    log = ("INFO :      Start `flwr-serverapp` process\nERROR :     ServerApp raised an "
           "exception\nTraceback (most recent call last):\n  File \"x.py\", line 1, in "
           "main\ncpcfl_tf.errors.UserError: no data: give --data DIR\nERROR :     Exit "
           "Code: 201\n")
    assert error_line(log) == "UserError: no data: give --data DIR"
    assert error_line("ValueError: bad\nstill going\n") == "ValueError: bad"
    chained = ("KeyError: 'x'\n\nDuring handling of the above exception, another exception "
               "occurred:\n\nTraceback (most recent call last):\nflwr.x.RunError: the last\n")
    assert error_line(chained) == "RunError: the last"
    assert error_line("only this\n") == "only this" and error_line("") == "its log is empty"
    assert run_status('{"success": true, "runs": [{"run-id": "7", "status": '
                      '"finished:failed"}]}') == "finished:failed"
    assert run_status('{"success": false, "error-message": "no run"}') == ""
    assert run_status("not json") == ""


QUERY = """
import sys, time
from flwr.app import Context, Message, MessageType, RecordDict
from flwr.common import Metadata
from cpcfl_tf.flower.client_app import query

meta = Metadata(run_id=1, message_id="m", src_node_id=1, dst_node_id=5, reply_to_message_id="",
                group_id="0", created_at=time.time(), ttl=60.0, message_type=MessageType.QUERY)
def ask(**node_config):
    context = Context(run_id=1, node_id=5, node_config=node_config, state=RecordDict(),
                      run_config={"num-clients": 3, "set": "federated.batch_size=2"})
    reply = query(Message(RecordDict(), metadata=meta), context)
    return reply.error.reason if reply.has_error() else dict(reply.content["identity"])
print(ask(**{"partition-id": 2}), "|", ask(**{"partition-id": 3}), "|",
      ask(**{"data-path": sys.argv[1]}), "|", "tensorflow" in sys.modules)
"""


def test_the_roster_query_loads_neither_data_nor_tensorflow(tmp_path):
    # Every message starts a ClientApp process; the roster query is one per node, and
    # importing TensorFlow there was seconds of CPU per node for one integer. A node with
    # its own data counts its files (names only); a bad partition id is an error reply
    # with one line in the node's log, not a traceback.
    import subprocess
    import sys

    for split, count in (("train", 3), ("test", 1)):
        for k in range(count):
            (tmp_path / "site" / split / "7").mkdir(parents=True, exist_ok=True)
            (tmp_path / "site" / split / "7" / f"{k}.png").write_bytes(b"")
    proc = subprocess.run([sys.executable, "-c", QUERY, str(tmp_path / "site")],
                          capture_output=True, text=True,
                          env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == (
        "{'partition-id': 2} | partition-id 3 is outside 0..2 (run config num-clients) | "
        "{'name': 'site', 'num-train': 3, 'num-test': 1} | False")
    refused = [line for line in proc.stderr.splitlines() if line.startswith("[cpcfl]")]
    assert refused == ["[cpcfl] node refused query: partition-id 3 is outside 0..2 "
                       "(run config num-clients)"]
    assert "Traceback" not in proc.stderr


def test_the_run_config_takes_any_setting_as_the_scripts_set_does():
    from cpcfl_tf.errors import UserError
    from cpcfl_tf.flower.common import run_config

    config = run_config({**RUN, "set": "federated.local_epochs=1 federated.jit_compile=true"})
    assert (config.federated.local_epochs, config.federated.jit_compile) == (1, True)
    assert config.federated.num_clusters == 2  # the named keys still apply
    assert run_config(RUN) == run_config({**RUN, "set": ""})
    # split as a shell would: quoted settings (the loopback joins with shlex.join)
    quoted = "'federated.local_epochs=1' federated.jit_compile=true"
    assert run_config({**RUN, "set": quoted}) == config
    with pytest.raises(UserError, match="run config set: No closing quotation"):
        run_config({**RUN, "set": "'federated.local_epochs=1"})
    with pytest.raises(UserError, match="federated.jit_compile takes true or false"):
        run_config({**RUN, "set": "federated.jit_compile=maybe"})
    # the simulator keeps each client's Adam state between rounds; a ClientApp cannot
    with pytest.raises(UserError, match="optimizer_state 'client' is not available on Flower"):
        run_config({**RUN, "set": "federated.local_optimizer=adam "
                                  "federated.optimizer_state=client"})
    # refused before any node is waited for: no federation runs these
    with pytest.raises(UserError, match="centralized baseline, not a federation"):
        run_config({**RUN, "method": "centralized"})
    with pytest.raises(UserError, match="pre-training 'fedavg' is not available on Flower; "
                                        "use one of none, simclr, .*supervised, fed-simclr"):
        run_config({**RUN, "method": "ifca", "pretraining": "fedavg"})


def test_the_loopback_passes_set_through_flwr_run_config_parsing():
    """``LoopbackFederation.run`` quotes each value with JSON; Flower's own parser of
    ``--run-config`` must give the ``set`` string back whole."""
    from flwr.common.config import parse_config_args

    from cpcfl_tf.flower.loopback import run_config_line

    settings = {**RUN, "set": "federated.local_epochs=1 federated.jit_compile=true"}
    assert parse_config_args([run_config_line(settings)]) == settings


def test_the_repository_root_is_the_flower_app_and_its_bundle_carries_the_kit(tmp_path):
    # `flwr run .` at the root: Flower builds a bundle (FAB) of the kit's code, nothing
    # else (no results, caches, tests or docs).
    import subprocess
    import zipfile
    from pathlib import Path

    from cpcfl_tf.flower.loopback import APP_DIR

    root = Path(__file__).resolve().parents[1]
    assert APP_DIR == root
    proc = subprocess.run(["flwr", "build", "--app", str(root)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (fab,) = tmp_path.glob("*.fab")
    names = zipfile.ZipFile(fab).namelist()
    kit = {str(p.relative_to(root)) for p in (root / "cpcfl_tf").rglob("*.py")}
    assert kit <= set(names)
    assert set(names) - kit <= {"pyproject.toml", ".info/CONTENT"}


def test_the_apps_run_config_defaults_are_the_servers():
    # `flwr run --run-config` overrides what pyproject.toml declares; every key the
    # ServerApp and ClientApp read must be declared there, with the same default.
    import tomllib
    from pathlib import Path

    from cpcfl_tf.flower.common import DEFAULTS

    root = Path(__file__).resolve().parents[1]
    declared = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    assert declared == DEFAULTS


def test_the_server_averages_each_cluster_by_the_nodes_example_counts(monkeypatch):
    """Nodes of unequal data (as with their own folders): the ServerApp reads each reply's
    ``num-examples`` and the cluster's model becomes the |D_u|-weighted average, computed
    here in NumPy; the unweighted mean would be another model."""
    from types import SimpleNamespace

    import numpy as np

    from flwr.app import MetricRecord, RecordDict

    from cpcfl_tf.clustered import algorithm
    from cpcfl_tf.flower import remote
    from cpcfl_tf.flower.common import run_config, to_record

    run = resolve(run_config({"num-clients": 3, "method": "ifca", "pretraining": "none",
                              "num-clusters": 2, "rounds": 2}))
    rng = np.random.default_rng(0)
    pool = [[rng.normal(size=(3, 2)).astype(np.float32), rng.normal(size=2).astype(np.float32)]
            for _ in range(2)]
    trained = {k: [a + k + 1 for a in pool[0]] for k in range(3)}
    counts, clusters = {0: 10, 1: 30, 2: 7}, {0: 0, 1: 0, 2: 1}

    def send(grid, contents, kind, group, timeout):  # node 10 + k holds client k
        return [SimpleNamespace(metadata=SimpleNamespace(src_node_id=10 + k), content=RecordDict({
            "metrics": MetricRecord({"client-id": k, "cluster-id": clusters[k],
                                     "num-examples": counts[k]}),
            "model": to_record(trained[k])})) for k in (node - 10 for node in contents)], []

    monkeypatch.setattr(remote, "send", send)
    grid = SimpleNamespace(get_node_ids=lambda: [10, 11, 12])
    nodes = remote.Nodes(grid, {10: 0, 11: 1, 12: 2}, 3, 1.0, run)
    plan = algorithm.plan_round(run, 0, 0, 0, 3)
    replies = nodes.train(pool, plan)
    assert replies.sizes.tolist() == [10, 30, 7]
    state = algorithm.aggregate(algorithm.ServerState(0, pool, 1), replies.weights,
                                replies.cluster_ids, replies.sizes)
    for got, one, two in zip(state.models[0], trained[0], trained[1]):
        np.testing.assert_allclose(got, (10 * one + 30 * two) / 40, rtol=1e-6)
        assert not np.allclose(got, (one + two) / 2)
    for got, three in zip(state.models[1], trained[2]):
        np.testing.assert_allclose(got, three, rtol=1e-6)



def test_a_node_without_a_batch_of_unlabeled_images_is_refused_for_a_federated_pretraining(
        tmp_path):
    from flwr.app import Context, RecordDict

    from cpcfl_tf.errors import UserError
    from cpcfl_tf.flower import client_app

    site = tmp_path / "site"
    for split in ("train", "test"):
        (site / split / "7").mkdir(parents=True)
        (site / split / "7" / "0.png").write_bytes(b"")
    run = {**FEDEMA, "set": "partition.unlabeled=iid"}

    def identity():
        return client_app._identity(Context(run_id=1, node_id=5, state=RecordDict(),
                                            node_config={"data-path": str(site)},
                                            run_config=run))

    with pytest.raises(UserError, match="no unlabeled images in .*site/unlabeled"):
        identity()  # the roster's reply is then an error: the node is left out
    (site / "unlabeled").mkdir()
    with pytest.raises(UserError, match="no unlabeled images"):
        identity()  # an empty folder as well
    for k in range(2):
        (site / "unlabeled" / f"{k}.png").write_bytes(b"")
    with pytest.raises(UserError, match="site/unlabeled holds 2 unlabeled images, less than a "
                                        "batch of 128; add images or use a smaller batch_size"):
        identity()  # fewer than one batch (FedEMA's default 128): no round could train
    run = {**FEDEMA, "set": "partition.unlabeled=iid pretrain.options.fedema.batch_size=2"}
    assert identity() == {"name": "site", "num-train": 1, "num-test": 1, "num-unlabeled": 2}
    assert "num-unlabeled" not in client_app._identity(Context(
        run_id=1, node_id=5, state=RecordDict(), node_config={"data-path": str(site)},
        run_config=RUN))  # a run without a federated pre-training does not ask


def test_the_servers_pretraining_stage_is_the_simulators_and_leaves_a_failed_node_out(
        tmp_path, capsys):
    # The ServerApp's first stage runs the simulator's loop (federated_pretrain.pretrain_rounds)
    # with the nodes as its clients. A node that fails round 2 is left out of that round:
    # the global parts are the others' average, as the loop's own clients give when that
    # client is dropped, and the ServerApp says so.
    import dataclasses

    import numpy as np

    from cpcfl_tf.pretraining import federated_pretrain as fp
    from cpcfl_tf.pretraining.fedavg_ssl import ClientState, set_parts
    from cpcfl_tf.clustered.clients import unlabeled_for
    from cpcfl_tf.flower.common import run_config
    from cpcfl_tf.records.files import weights_fingerprint

    run = {**RUN, "method": "fedavg", "pretraining": "fed-simclr", "num-clusters": 1,
           "head-rounds": 0, "rounds": 1,
           "set": "partition.unlabeled=iid pretrain.options.fed.batch_size=64 "
                  "pretrain.options.fed.rounds=2"}
    nodes = [{"partition-id": k, "num-partitions": 3} for k in range(3)]
    record = run_in_process({**run, "out": str(tmp_path / "result.json")}, nodes,
                            refuse={("pretrain-2", 1)})
    printed = capsys.readouterr().out
    assert "fed-simclr round 1/2: 3 replies, 0 failed" in printed
    assert "fed-simclr round 2/2: 2 replies, 1 failed" in printed

    class Dropping(fp.LocalClients):  # the loop's own clients, client 1 gone in round 2
        def train(self, weights, round_, chosen):
            replies = super().train(weights, round_, chosen[(chosen != 1) | (round_ == 0)])
            return dataclasses.replace(replies, reached=len(chosen))

    config = run_config(run)
    images = unlabeled_for(config)
    trainer = fp.LocalTrainer(pretraining_of(config), images[0].shape[1:])
    states = [ClientState() for _ in images]
    weights = fp.pretrain_rounds(trainer, Dropping(trainer, images, states), 3, trainer.initial(),
                            fp.new_totals())
    set_parts(trainer.shared, weights)
    assert record["environment"]["starting_encoder"] == weights_fingerprint(
        trainer.model.encoder.get_weights())
    # Without the failure the loop gives another encoder: the check above can fail.
    full = fp.LocalTrainer(pretraining_of(config), images[0].shape[1:])
    set_parts(full.shared, fp.pretrain_rounds(full, fp.LocalClients(full, images, [
        ClientState() for _ in images]), 3, full.initial(), fp.new_totals()))
    assert weights_fingerprint(full.model.encoder.get_weights()) != \
        record["environment"]["starting_encoder"]
    assert np.isfinite(record["final"]["accuracy"])
