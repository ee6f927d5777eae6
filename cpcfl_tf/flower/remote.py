"""The nodes of a federation as the server's clients: sending a message to each node and
collecting the replies within a timeout (a node that errs or stays silent is named and
left out), checking every reply before it counts (:mod:`cpcfl_tf.flower.checks`), the
roster (who the clients are), what a method asks once before training, and the two
stages' clients: :class:`Nodes` for the clustered rounds
(:func:`cpcfl_tf.clustered.algorithm.run_rounds`) and :class:`PretrainNodes` for a
federated pre-training's (:func:`cpcfl_tf.pretraining.federated_pretrain.pretrain_rounds`).
The ServerApp (:mod:`cpcfl_tf.flower.server_app`) runs both stages over them."""
from __future__ import annotations

import time

import numpy as np
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from cpcfl_tf.clustered import algorithm
from cpcfl_tf.clustered.methods import METHODS
from cpcfl_tf.config import FederatedConfig
from cpcfl_tf.errors import UserError
from cpcfl_tf.flower import checks
from cpcfl_tf.flower.common import from_record, models_to_records, to_record


def wait_for_nodes(grid: Grid, count: int, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= count or time.monotonic() > deadline:
            return nodes
        time.sleep(1.0)


def send(grid: Grid, contents: dict[int, RecordDict], kind: str, group: str,
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


def check_replies(replies: list[Message], kind: str, round_, problem_of
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


def check_partitions(grid: Grid, nodes: list[int], num_clients: int, timeout: float) -> None:
    replies, _ = send(grid, {n: RecordDict() for n in nodes}, MessageType.QUERY, "0-probe",
                      timeout)
    declared = {int(r.content["identity"]["num-partitions"]) for r in replies
                if "num-partitions" in r.content["identity"]}
    if declared - {num_clients}:
        raise UserError(f"the nodes were started for {', '.join(map(str, sorted(declared)))} "
                        f"partitions (node config num-partitions; under the Simulation Engine "
                        f"num-supernodes) but the run has num-clients={num_clients}: make "
                        "them equal")


def ask_first(grid: Grid, client_of: dict[int, int], fl, num_clients: int, timeout: float,
              names: dict[int, str] | None = None) -> list[np.ndarray] | None:
    """Every client's answer, by client id, to what the method's rule asks once before
    training (:mod:`cpcfl_tf.clustered.rules`: the oracle's true groups, PACFL's data subspaces);
    every client must answer. None when the rule asks nothing."""
    rule = METHODS[fl.method].rule
    if rule.asks is None:
        return None
    contents = {node: RecordDict({"config": ConfigRecord({"ask": rule.asks,
                                                          **rule.question(fl),
                                                          **addressee(client, names)})})
                for node, client in client_of.items()}
    answers, _ = send(grid, contents, MessageType.QUERY, f"0-{rule.asks}", timeout)
    by_client = {int(r.content["metrics"]["client-id"]): r for r in answers}
    missing = sorted(set(range(num_clients)) - set(by_client))
    if missing:
        raise UserError(f"clients {missing} did not send their {rule.asks} before training; "
                        f"the method needs every client's: start a SuperNode for each of "
                        f"the {num_clients} clients (min-nodes = num-clients)"
                        + rule.node_needs)
    return [from_record(by_client[c].content["answer"])[0] for c in range(num_clients)]


def addressee(client: int, names: dict[int, str] | None) -> dict:
    """Whom a message is for, as the node checks it (``client_app._addressed``): the
    client id and, for a node with its own data, its folder name."""
    return {"client-id": client, **({} if names is None else {"name": names[client]})}


def roster(grid: Grid, nodes: list[int], timeout: float
            ) -> tuple[dict[int, int], dict[str, dict] | None, dict[int, int]]:
    """Who the clients are: node id -> client id, and, when the nodes brought their own
    data, client id -> the folder name and example counts they reported (``None`` for
    partition ids) and client id -> its unlabeled images, where a federated pre-training
    asked for them. A node that cannot serve (its data is bad) is left out, its reason
    printed."""
    replies, failed = send(grid, {n: RecordDict() for n in nodes}, MessageType.QUERY, "0",
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


class Nodes:
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
                        "num-clients": self.num_clients, **addressee(client, self.names)}
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
        replies, failed = send(self.grid, contents, MessageType.TRAIN, str(plan.round + 1),
                               self.timeout)
        checked, left = check_replies(replies, "train", plan.round + 1,
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
            contents[node] = RecordDict({"config": ConfigRecord(addressee(client, self.names)),
                                         **models_to_records(sent)})
        scores, _ = send(self.grid, contents, MessageType.EVALUATE, f"{round_}-evaluate",
                         self.timeout)
        scores, _ = check_replies(scores, "evaluate", round_, lambda reply, node: checks.first(
            checks.client_problem(reply.content["metrics"]["client-id"], self.client_of[node]),
            checks.accuracy_problem(reply.content["metrics"]["accuracy"])))
        accuracy = {self.client_of[r.metadata.src_node_id]:
                    float(r.content["metrics"]["accuracy"]) for r in scores}
        return accuracy, sorted(set(self.client_of.values()) - set(accuracy))


class PretrainNodes:
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
                                    **addressee(client, self.names)}),
            "model": to_record(global_weights)})
            for node, client in self.client_of.items() if client in wanted and node in online}
        replies, _ = send(self.grid, contents, MessageType.TRAIN, f"pretrain-{round_ + 1}",
                          self.timeout)
        def problem(reply: Message, node: int) -> str | None:
            client, metrics = self.client_of[node], reply.content["metrics"]
            return checks.first(
                checks.client_problem(metrics["client-id"], client),
                checks.count_problem(metrics["num-examples"], self.examples.get(client)),
                checks.loss_problem(metrics.get("loss")),
                checks.weights_problem(from_record(reply.content["model"]), global_weights))

        checked, _ = check_replies(replies, "pretrain", round_ + 1, problem)  # left out as failed
        by_client = sorted(((int(m.content["metrics"]["client-id"]), m) for m in checked),
                           key=lambda pair: pair[0])  # the simulator's order
        metrics = [dict(m.content["metrics"]) for _, m in by_client]
        # Each client's loss in full, so a run can be checked client by client against
        # the simulator's rounds (the round's line gives their mean only).
        print(f"[cpcfl] pretrain round {round_ + 1}: client losses " + ", ".join(
            f"{k} {float(m['loss'])!r}" for (k, _), m in zip(by_client, metrics)), flush=True)
        return Uploads([from_record(m.content["model"]) for _, m in by_client],
                       [int(m["num-examples"]) for m in metrics], metrics, len(contents),
                       sorted(wanted - {k for k, _ in by_client}))
