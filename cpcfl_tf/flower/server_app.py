"""The ServerApp: every federated method of the kit over real nodes.

Per round the server sends each node the pool of N models when clients choose by loss
(IFCA, CP-CFL, FedAvg as N = 1; in the Tc phase the node trains the head of the model
drawn for it, with the encoder frozen), or only the model it assigned the node (oracle,
FeSEM, CFL, FL+HC, PACFL). It receives trained weights, the cluster id and the number of
examples, and aggregates with :func:`cpcfl_tf.clustered.algorithm.run_rounds` -- the
simulator's own round, seeded the same way, so with the same seeds a federation assigns
the same cluster ids. Before training it asks what a method needs once
(:attr:`~cpcfl_tf.clustered.methods.Method.asks_first`: the oracle's true groups, PACFL's data
subspaces); the record's ``bytes_other`` counts the subspaces.

Clients: a node started with ``partition-id`` is that client of the run's seeded
partition; nodes started with ``data-path`` bring their own data, and the server learns
them from the roster: each reports its folder's name and example counts, and the clients
are the nodes that answered, numbered by folder name (``num-clients`` is then how many
nodes to wait for). A node whose data is bad answers the roster with an error and is left
out, as a node that died.

Failures: a node whose reply is an error or does not come within ``round-timeout``
seconds is left out of that round (its cluster is the average of the members that did
reply, or keeps its weights if none did) and keeps its previous cluster id; it is asked
again in later rounds while the SuperLink lists it as connected. Each round's record
lists the partitions that failed it (to train or to be scored).

Evaluation: in the rounds the simulator scores (``federated.eval_every``, the quarters,
the last), every node scores its cluster's model on its own test data and sends its
accuracy; a round's accuracy is the mean over the nodes that answered, the final one the
last round's. Besides those accuracies the server sees weights, counts and cluster ids.
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp

from cpcfl_tf.config import FederatedConfig
from cpcfl_tf.errors import UserError
from cpcfl_tf.clustered import algorithm
from cpcfl_tf.flower import checks
from cpcfl_tf.flower.common import (class_names, from_record, models_to_records, run_config,
                                   to_record)
from cpcfl_tf.clustered.methods import METHODS, plugins_used
from cpcfl_tf.pretraining.methods import FEDERATED_STARTS
from cpcfl_tf.record import write_record
from cpcfl_tf.results import prepare_out_dir
from cpcfl_tf.run_plan import check_data, resolve

app = ServerApp()


def _wait_for_nodes(grid: Grid, count: int, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= count or time.monotonic() > deadline:
            return nodes
        time.sleep(1.0)


def _send(grid: Grid, contents: dict[int, RecordDict], kind: str, group: str,
          timeout: float) -> tuple[list[Message], list[int]]:
    """Send ``contents[node]`` to every node; return the good replies and failed nodes
    (an error reply's reason is printed: e.g. a node's bad data)."""
    messages = [Message(content, dst_node_id=node, message_type=kind, group_id=group)
                for node, content in contents.items()]
    replies = list(grid.send_and_receive(messages, timeout=timeout))
    errors = [r for r in replies if r.has_error()]
    # An error reply the SuperLink writes (an unavailable node) comes from the SuperLink:
    # name the node the message was for.
    for node, reply in zip(_meant(messages, errors), errors):
        print(f"[cpcfl] node {node} failed {kind} {group}: {reply.error.reason}", flush=True)
    good = [r for r in replies if not r.has_error()]
    answered = {r.metadata.src_node_id for r in good}
    # A node that sent nothing before the timeout (a killed node the SuperLink has not
    # yet marked unavailable, as on a loaded machine) is named too.
    for node in sorted(set(contents) - answered - set(_meant(messages, errors))):
        print(f"[cpcfl] node {node} failed {kind} {group}: no reply within {timeout:g} s",
              flush=True)
    return good, sorted(set(contents) - answered)


def _checked(replies: list[Message], kind: str, round_, problem_of
             ) -> tuple[list[Message], list[int]]:
    """The replies for which ``problem_of(reply, node)`` finds nothing wrong (one that
    lacks a record, or holds no arrays, is malformed), and the nodes of the others, each
    named in one line with what was wrong: they are left out as failed nodes."""
    kept, left = [], []
    for reply in replies:
        node = reply.metadata.src_node_id
        try:
            problem = problem_of(reply, node)
        except (KeyError, TypeError, ValueError) as err:
            problem = f"a malformed reply ({type(err).__name__}: {err})"
        if problem is None:
            kept.append(reply)
        else:
            print(f"[cpcfl] node {node} failed {kind} {round_}: its reply was left out: "
                  f"{problem}", flush=True)
            left.append(node)
    return kept, left


def _meant(messages: list[Message], errors: list[Message]) -> list[int]:
    """The nodes the error replies ``errors`` are about (the SuperLink writes some)."""
    meant = {m.object_id: m.metadata.dst_node_id for m in messages}
    return [meant.get(r.metadata.reply_to_message_id, r.metadata.src_node_id) for r in errors]


def _check_partitions(grid: Grid, nodes: list[int], num_clients: int, timeout: float) -> None:
    replies, _ = _send(grid, {n: RecordDict() for n in nodes}, MessageType.QUERY, "0-probe",
                       timeout)
    declared = {int(r.content["identity"]["num-partitions"]) for r in replies
                if "num-partitions" in r.content["identity"]}
    if declared - {num_clients}:
        raise UserError(f"the nodes were started for {', '.join(map(str, sorted(declared)))} "
                        f"partitions (node config num-partitions; under the Simulation Engine "
                        f"num-supernodes) but the run has num-clients={num_clients}: make "
                        "them equal")


def _ask_first(grid: Grid, client_of: dict[int, int], fl, num_clients: int, timeout: float,
               names: dict[int, str] | None = None) -> list[np.ndarray] | None:
    """Every client's answer, by client id, to what the method's rule asks once before
    training (:mod:`cpcfl_tf.clustered.rules`: the oracle's true groups, PACFL's data subspaces);
    every client must answer. None when the rule asks nothing."""
    rule = METHODS[fl.method].rule
    if rule.asks is None:
        return None
    contents = {node: RecordDict({"config": ConfigRecord({"ask": rule.asks,
                                                          **rule.question(fl),
                                                          **_addressee(client, names)})})
                for node, client in client_of.items()}
    answers, _ = _send(grid, contents, MessageType.QUERY, f"0-{rule.asks}", timeout)
    by_client = {int(r.content["metrics"]["client-id"]): r for r in answers}
    missing = sorted(set(range(num_clients)) - set(by_client))
    if missing:
        raise UserError(f"clients {missing} did not send their {rule.asks} before training; "
                        f"the method needs every client's: start a SuperNode for each of "
                        f"the {num_clients} clients (min-nodes = num-clients)"
                        + rule.node_needs)
    return [from_record(by_client[c].content["answer"])[0] for c in range(num_clients)]


def _addressee(client: int, names: dict[int, str] | None) -> dict:
    """Whom a message is for, as the node checks it (``client_app._addressed``): the
    client id and, for a node with its own data, its folder name."""
    return {"client-id": client, **({} if names is None else {"name": names[client]})}


def _roster(grid: Grid, nodes: list[int], timeout: float
            ) -> tuple[dict[int, int], dict[str, dict] | None, dict[int, int]]:
    """Who the clients are: node id -> client id, and, when the nodes brought their own
    data, client id -> the folder name and example counts they reported (``None`` for
    partition ids) and client id -> its unlabeled images, where a federated pre-training
    asked for them. A node that cannot serve (its data is bad) is left out, its reason
    printed."""
    replies, failed = _send(grid, {n: RecordDict() for n in nodes}, MessageType.QUERY, "0",
                            timeout)
    if failed:
        print(f"[cpcfl] left out: nodes {failed} (no roster reply)", flush=True)
    said = {r.metadata.src_node_id: r.content["identity"] for r in replies}
    if not said:
        raise UserError("no node answered the roster query (their reasons are above)")
    own = {n for n, m in said.items() if "name" in m}
    if own and own != set(said):
        raise UserError("some nodes have a partition-id and some a data-path: start every "
                        "SuperNode the same way")
    if not own:
        return {n: int(m["partition-id"]) for n, m in said.items()}, None, {}
    names = sorted((str(m["name"]), n) for n, m in said.items())
    repeated = sorted({a for (a, _), (b, _) in zip(names, names[1:]) if a == b})
    if repeated:
        raise UserError(f"several nodes have data folders named {', '.join(repeated)}: the "
                        "clients are numbered by folder name, give each node its own")
    return ({node: k for k, (_, node) in enumerate(names)},
            {str(k): {"name": name, "num_train": int(said[node]["num-train"]),
                      "num_test": int(said[node]["num-test"])}
             for k, (name, node) in enumerate(names)},
            {k: int(said[node]["num-unlabeled"]) for k, (_, node) in enumerate(names)
             if "num-unlabeled" in said[node]})


class _Nodes:
    """The ServerApp's :class:`~cpcfl_tf.clustered.algorithm.Federation`: one SuperNode per
    client, reached through the Grid. A node that fails a round is left out of it."""

    def __init__(self, grid: Grid, client_of: dict[int, int], num_clients: int,
                 timeout: float, fl: FederatedConfig, names: dict[int, str] | None = None,
                 examples: dict[int, int] | None = None):
        self.grid, self.client_of, self.timeout, self.fl = grid, client_of, timeout, fl
        self.names = names
        """Client id -> data folder name, for nodes with their own data."""
        self.examples = examples or {}
        """Client id -> its training examples (the roster's count, or its partition's
        size): the most a reply's ``num-examples`` may say."""
        self.num_clients, self.assigns = num_clients, METHODS[fl.method].server_assigns
        self.scores: dict[int, float] = {}
        """The last scored round's accuracy per client that answered (the last round is
        always scored: the final)."""

    def train(self, models, plan: algorithm.RoundPlan) -> algorithm.Replies:
        online = set(self.grid.get_node_ids())  # a node the SuperLink lost is not asked
        row = {int(c): k for k, c in enumerate(plan.participants)}
        contents = {}
        for node, client in self.client_of.items():
            if node not in online or client not in row:
                continue
            settings = {"round": plan.round, "attempt": plan.attempt,
                        "num-clients": self.num_clients, **_addressee(client, self.names)}
            if self.assigns:  # the node's own model only, and which one it is
                cluster = int(plan.drawn[row[client]])
                contents[node] = RecordDict({
                    "config": ConfigRecord({**settings, "cluster": cluster}),
                    **models_to_records({cluster: models[cluster]})})
                continue
            # The whole pool, also in the Tc phase, where the node trains the model drawn
            # for it: the paper's (N+1)S per client and round, as the simulator counts.
            contents[node] = RecordDict({
                "config": ConfigRecord(settings),
                **models_to_records({n: models[n] for n in range(plan.num_models)})})
        replies, failed = _send(self.grid, contents, MessageType.TRAIN, str(plan.round + 1),
                                self.timeout)
        checked, left = _checked(replies, "train", plan.round + 1,
                                 lambda reply, node: self._problem(reply, node, plan, row,
                                                                   models))
        failed = sorted({*failed, *left})  # their cluster ids kept, as a failed node's
        # In client order, as the simulator's replies come, not in order of arrival: a rule
        # that clusters the replies (FedGroup's k-means++) would otherwise name its
        # clusters by who answered first, and sums would add in another order.
        replies = sorted(checked, key=lambda r: int(r.content["metrics"]["client-id"]))
        metrics = [r.content["metrics"] for r in replies]
        trained = [from_record(r.content["model"]) for r in replies]
        asked = {self.client_of[n] for n in contents}
        return algorithm.Replies(
            np.array([int(m["client-id"]) for m in metrics], np.int64),
            np.array([int(m["cluster-id"]) for m in metrics], np.int64),
            np.array([float(m["num-examples"]) for m in metrics]),
            [np.stack([w[i] for w in trained]) for i in range(len(trained[0]))] if trained
            else [],
            sorted({self.client_of[n] for n in failed} | (set(row) - asked)))

    def _problem(self, reply: Message, node: int, plan: algorithm.RoundPlan, row: dict,
                 models) -> str | None:
        """What is wrong with a node's training reply (None: it may count): the client it
        names, the cluster id (inside the pool; the model the node was given where the
        server assigned it or drew it for the Tc phase), the example count and the
        weights against the model of that cluster."""
        client = self.client_of[node]
        metrics, arrays = reply.content["metrics"], from_record(reply.content["model"])
        drawn = plan.drawn[row[client]] if plan.drawn is not None and client in row else None
        return checks.first(
            checks.client_problem(metrics["client-id"], client),
            checks.cluster_problem(metrics["cluster-id"], plan.num_models,
                                   None if drawn is None else int(drawn)),
            checks.count_problem(metrics["num-examples"], self.examples.get(client))
        ) or checks.weights_problem(arrays, models[int(metrics["cluster-id"])])

    def observe(self, models, assigned, replies, round_: int, *, planned=None) -> dict:
        """The round's record. In the rounds the simulator scores (``fl.scored``) each node
        scores its cluster's model on its own test data, as Flower's evaluate rounds do."""
        record = {"cluster_ids": assigned.tolist(), "replies": len(replies.clients),
                  "failed_partitions": replies.failed}
        if not self.fl.scored(round_):
            return record
        self.scores, failed = self.evaluate(models, assigned, round_, planned)
        if self.scores:
            record["accuracy"] = float(np.mean(list(self.scores.values())))
        record["failed_partitions"] = sorted(set(replies.failed) | set(failed))
        return record

    def evaluate(self, models, assigned: np.ndarray, round_: int,
                 planned: np.ndarray | None = None) -> tuple[dict[int, float], list[int]]:
        """Each online node's accuracy on its test data (client id -> accuracy) and the
        clients that did not answer. A node scores its cluster's model; one that has not
        taken part yet the model the server planned for it, else the pool, from which it
        takes the model of lowest loss on its training data (the simulator's rule)."""
        online = set(self.grid.get_node_ids())
        contents = {}
        for node, client in self.client_of.items():
            if node not in online:
                continue
            cluster = int(assigned[client])
            if cluster < 0 and planned is not None:
                cluster = int(planned[client])
            sent = {cluster: models[cluster]} if cluster >= 0 else dict(enumerate(models))
            contents[node] = RecordDict({"config": ConfigRecord(_addressee(client, self.names)),
                                         **models_to_records(sent)})
        scores, _ = _send(self.grid, contents, MessageType.EVALUATE, f"{round_}-evaluate",
                          self.timeout)
        scores, _ = _checked(scores, "evaluate", round_, lambda reply, node: checks.first(
            checks.client_problem(reply.content["metrics"]["client-id"], self.client_of[node]),
            checks.accuracy_problem(reply.content["metrics"]["accuracy"])))
        accuracy = {self.client_of[r.metadata.src_node_id]:
                    float(r.content["metrics"]["accuracy"]) for r in scores}
        return accuracy, sorted(set(self.client_of.values()) - set(accuracy))


class _PretrainNodes:
    """The federated pre-training's clients as SuperNodes (the counterpart of the
    simulator's :class:`~cpcfl_tf.pretraining.federated_pretrain.LocalClients`): a round
    sends the global online parts to the sampled clients' nodes that are online; each
    trains the method's step on its own unlabeled images and sends its parts with its
    image count. A node that fails the round is left out of it."""

    def __init__(self, grid: Grid, client_of: dict[int, int], timeout: float,
                 names: dict[int, str] | None, examples: dict[int, int]):
        self.grid, self.client_of, self.timeout, self.names = grid, client_of, timeout, names
        self.examples = examples
        """Client id -> its unlabeled images: the most a reply's ``num-examples`` may say."""

    def train(self, global_weights, round_: int, chosen: np.ndarray):
        from cpcfl_tf.pretraining.federated_pretrain import Uploads

        wanted, online = set(chosen.tolist()), set(self.grid.get_node_ids())
        contents = {node: RecordDict({
            "config": ConfigRecord({"stage": "pretrain", "round": round_,
                                    **_addressee(client, self.names)}),
            "model": to_record(global_weights)})
            for node, client in self.client_of.items() if client in wanted and node in online}
        replies, _ = _send(self.grid, contents, MessageType.TRAIN, f"pretrain-{round_ + 1}",
                           self.timeout)
        def problem(reply: Message, node: int) -> str | None:
            client, metrics = self.client_of[node], reply.content["metrics"]
            return checks.first(
                checks.client_problem(metrics["client-id"], client),
                checks.count_problem(metrics["num-examples"], self.examples.get(client)),
                checks.weights_problem(from_record(reply.content["model"]), global_weights))

        checked, _ = _checked(replies, "pretrain", round_ + 1, problem)  # left out as failed
        by_client = sorted(((int(m.content["metrics"]["client-id"]), m) for m in checked),
                           key=lambda pair: pair[0])  # the simulator's order
        metrics = [dict(m.content["metrics"]) for _, m in by_client]
        return Uploads([from_record(m.content["model"]) for _, m in by_client],
                       [int(m["num-examples"]) for m in metrics], metrics, len(contents),
                       sorted(wanted - {k for k, _ in by_client}))


def _pretrain_stage(grid: Grid, client_of: dict[int, int], config, timeout: float,
                    names: dict[int, str] | None, unlabeled: dict[int, int]
                    ) -> list[np.ndarray]:
    """The federated self-supervised pre-training as the run's first stage: the
    simulator's rounds (:func:`~cpcfl_tf.pretraining.federated_pretrain.pretrain_rounds`,
    seeded the same) with the nodes as its clients. Returns the global encoder."""
    from cpcfl_tf.pretraining.fedavg_ssl import set_parts
    from cpcfl_tf.pretraining.federated_pretrain import LocalTrainer, new_totals, pretrain_rounds

    size = config.data.image_size
    server = LocalTrainer(config, (size, size, 3))  # its seeded init and its averaging only
    start, rounds = server.plan["start"], server.settings["rounds"]

    def after(r: int, entry: dict, _) -> None:
        print(f"[cpcfl] {start} round {r + 1}/{rounds}: {entry['clients']} replies, "
              f"{len(entry.get('failed', []))} failed, loss {entry['loss']:.4f}", flush=True)

    totals = new_totals()
    if names is None:  # partition nodes: each client's share of the run's deal
        from cpcfl_tf.clustered.clients import unlabeled_for

        examples = {k: len(images) for k, images in enumerate(unlabeled_for(config))}
    else:  # own data: what each node reported in the roster
        examples = {k: int(unlabeled[k]) for k in names if k in unlabeled}
    weights = pretrain_rounds(server, _PretrainNodes(grid, client_of, timeout, names, examples),
                         config.partition.num_clients, server.initial(), totals, after=after)
    print(f"[cpcfl] {start}: {totals['bytes_down'] / 1e6:.1f} MB of online parts down, "
          f"{totals['bytes_up'] / 1e6:.1f} MB up", flush=True)
    set_parts(server.shared, weights)
    return server.model.encoder.get_weights()


def _examples(config, node_data: dict[str, dict] | None) -> dict[int, int]:
    """Each client's training examples, the bound of its replies' counts: what a node with
    its own data reported in the roster, or the size of the client's partition (every
    client of a drawn partition has as many)."""
    if node_data is not None:
        return {int(k): int(d["num_train"]) for k, d in node_data.items()}
    from cpcfl_tf.clustered.clients import clients_for

    size = clients_for(config).train.size
    return dict.fromkeys(range(config.partition.num_clients), size)


@app.main()
def main(grid: Grid, context: Context) -> None:
    from cpcfl_tf.environment import run_environment
    from cpcfl_tf.clustered.pool import build_template, federated_record, initial_state
    from cpcfl_tf.clustered.starting import StartingEncoders

    settings = dict(context.run_config)
    config = run_config(settings)
    check_data(config)  # before any wait: the plan is made once the nodes are known
    classes = class_names(settings)
    timeout = float(settings.get("round-timeout", 300.0))
    wanted = int(settings.get("min-nodes", 0)) or config.partition.num_clients
    if settings.get("out"):  # refuse an unwritable output before any work
        prepare_out_dir(Path(str(settings["out"])).parent,
                        fix="set the run config's out to a writable path")
    # The first nodes to connect say for how many partitions the nodes were started
    # (num-partitions; under the Simulation Engine its num-supernodes): refuse a mismatch
    # now rather than wait round-timeout for nodes that will never come.
    _check_partitions(grid, _wait_for_nodes(grid, 1, timeout), config.partition.num_clients,
                      timeout)
    client_of, node_data, unlabeled = _roster(grid, _wait_for_nodes(grid, wanted, timeout),
                                              timeout)
    if node_data is not None:
        # The nodes' own data: the clients are the nodes that answered, nothing is drawn
        # (partition.kind own: one group, the server knows none; no split sizes apply).
        config = config.with_overrides(partition={"num_clients": len(client_of),
                                                  "num_groups": 1, "kind": "own"})
        print(f"[cpcfl] {len(client_of)} nodes with their own data: "
              + ", ".join(f"{k} {d['name']} ({d['num_train']} + {d['num_test']} images)"
                          for k, d in node_data.items()), flush=True)
    else:
        print(f"[cpcfl] {len(client_of)} nodes: partitions {sorted(client_of.values())}",
              flush=True)
    run = resolve(config)
    fl = run.federated
    num_clients = config.partition.num_clients

    names = (None if node_data is None else
             {int(k): str(d["name"]) for k, d in node_data.items()})
    answers = _ask_first(grid, client_of, fl, num_clients, timeout, names)

    if config.federated.pretraining in FEDERATED_STARTS:
        # The first stage: the nodes pre-train the encoder on their unlabeled images.
        encoder_weights = _pretrain_stage(grid, client_of, config, timeout, names, unlabeled)
    else:  # the server's own pre-training (its data, never the nodes')
        encoder_weights = StartingEncoders(verbose=0)(config)
    size = config.data.image_size
    template = build_template(fl, (size, size, 3), len(classes))

    def start(attempt: int) -> algorithm.ServerState:
        return initial_state(fl, template, encoder_weights, seed=config.seed, attempt=attempt,
                             num_clients=num_clients, answers=answers)

    def after(record: dict, state, progress) -> None:
        scored = f", accuracy {record['accuracy']:.4f}" if "accuracy" in record else ""
        print(f"[cpcfl] round {record['round']}/{fl.rounds}: cluster ids "
              f"{record['cluster_ids']}, {record['replies']} replies, "
              f"{len(record['failed_partitions'])} failed{scored}", flush=True)

    federation = _Nodes(grid, client_of, num_clients, timeout, fl, names,
                        _examples(config, node_data))
    state, progress = algorithm.run_rounds(
        fl, config.seed, federation, start, on_round=after,
        progress=algorithm.sent_before_training(fl, answers),
        say=lambda line: print(f"[cpcfl] {line}", flush=True))
    accuracy = federation.scores  # the last round's
    # The server never sees the clients' data: no class counts, no true groups, no ARI.
    record = dataclasses.replace(
        federated_record(run, config.seed, progress, state,
                         float(np.mean(list(accuracy.values()))) if accuracy else None,
                         client_accuracy={str(k): v for k, v in sorted(accuracy.items())}),
        experiment="flower", environment=run_environment(encoder_weights, plugins_used(
            config.federated.method, config.federated.pretraining)),
        nodes={str(n): c for n, c in client_of.items()}, node_data=node_data)
    print(f"[cpcfl] final accuracy {record.final.accuracy}", flush=True)
    if settings.get("out"):
        write_record(settings["out"], record)
