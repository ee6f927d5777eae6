"""The nodes of a federation as the server's clients: sending a message to each node and
collecting the replies within a timeout (a node that errs or stays silent is named and
left out), checking every reply before it counts (:mod:`cpcfl_tf.flower.checks`), the
roster (who the clients are), what a method asks once before training, and the two
stages' clients: :class:`Nodes` for the clustered rounds
(:func:`cpcfl_tf.clustered.algorithm.run_rounds`) and :class:`PretrainNodes` for a
federated pre-training's (:func:`cpcfl_tf.pretraining.federated_pretrain.pretrain_rounds`).
The ServerApp (:mod:`cpcfl_tf.flower.server_app`) runs both stages over them."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import numpy as np
from flwr.app import ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from cpcfl_tf.aggregation import lower_median
from cpcfl_tf.clustered import algorithm
from cpcfl_tf.errors import UserError
from cpcfl_tf.flower import checks
from cpcfl_tf.flower.common import models_to_records, to_record
from cpcfl_tf.methods.clustering import Answers
from cpcfl_tf.plan.resolve import RunPlan


def wait_for_nodes(grid: Grid, count: int, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= count or time.monotonic() > deadline:
            return nodes
        time.sleep(1.0)


def send(
    grid: Grid, contents: dict[int, RecordDict], kind: str, group: str, timeout: float
) -> tuple[list[Message], list[int]]:
    """Send ``contents[node]`` to every node; return the good replies and failed nodes
    (an error reply's reason is printed: e.g. a node's bad data)."""
    messages = [
        Message(content, dst_node_id=node, message_type=kind, group_id=group)
        for node, content in contents.items()
    ]
    replies = list(grid.send_and_receive(messages, timeout=timeout))
    errors = [r for r in replies if r.has_error()]
    # An error reply the SuperLink writes (an unavailable node) comes from the SuperLink:
    # name the node the message was for.
    for node, reply in zip(_meant(messages, errors), errors):
        print(
            f"[cpcfl] node {node} failed {kind} {group}: {checks.shown(reply.error.reason)}",
            flush=True,
        )
    good = [r for r in replies if not r.has_error()]
    answered = {r.metadata.src_node_id for r in good}
    # A node that sent nothing before the timeout (a killed node the SuperLink has not
    # yet marked unavailable, as on a loaded machine) is named too.
    for node in sorted(set(contents) - answered - set(_meant(messages, errors))):
        print(
            f"[cpcfl] node {node} failed {kind} {group}: no reply within {timeout:g} s", flush=True
        )
    return good, sorted(set(contents) - answered)


def parsed(replies: list[Message], kind: str, round_, parse) -> tuple[dict, list[int]]:
    """Each reply as ``parse(reply.content, node)`` reads it (a parser of
    :mod:`cpcfl_tf.flower.checks`), by node, and the nodes whose reply it refused or
    whose content made it fail in any other way: each is named in one line with the
    field and what was wrong, and left out as a failed node, never stopping the run."""
    kept, left = {}, []
    for reply in replies:
        node = reply.metadata.src_node_id
        try:
            kept[node] = parse(reply.content, node)
            continue
        except checks.Refused as err:
            problem = checks.shown(err)
        except Exception as err:  # noqa: BLE001 - a node's content may raise anything
            problem = f"a malformed reply ({type(err).__name__}: {checks.shown(err)})"
        print(
            f"[cpcfl] node {node} failed {kind} {round_}: its reply was left out: {problem}",
            flush=True,
        )
        left.append(node)
    return kept, left


def _meant(messages: list[Message], errors: list[Message]) -> list[int]:
    """The nodes the error replies ``errors`` are about (the SuperLink writes some)."""
    meant = {m.object_id: m.metadata.dst_node_id for m in messages}
    return [meant.get(r.metadata.reply_to_message_id, r.metadata.src_node_id) for r in errors]


def count_caps(
    node_data: dict[str, dict] | None, unlabeled: dict[int, int], most: int | None
) -> dict[str, int] | None:
    """The most examples one reply weighs, by kind, where the nodes brought their own data
    and the run config sets no ``max-examples``: what a node reports of its own data is
    its word, so no reply weighs more than the lower median of the nodes' reports
    (:func:`cpcfl_tf.aggregation.lower_median`: while fewer than half the nodes claim
    too much, an honest node's count). ``train``: the clustered rounds' examples;
    ``unlabeled``: a federated pre-training's images. None: no cap (partition nodes,
    whose counts the server knows, or an operator's ``max-examples``)."""
    if node_data is None or most is not None:
        return None
    caps = {"train": lower_median([d["num_train"] for d in node_data.values()])}
    if unlabeled:
        caps["unlabeled"] = lower_median(list(unlabeled.values()))
    return caps


def weighed(count: int, cap: int | None) -> int:
    """What a reply's example count weighs: ``count``, at most ``cap`` (None: no cap)."""
    return count if cap is None else min(count, cap)


def ask_first(
    grid: Grid,
    client_of: dict[int, int],
    run: RunPlan,
    num_clients: int,
    timeout: float,
    names: dict[int, str] | None = None,
    *,
    image_shape: tuple[int, ...],
    num_groups: int,
) -> Answers | None:
    """Every client's answer, by client id, to what the method's rule asks once before
    training (:mod:`cpcfl_tf.methods.rules`: the oracle's true groups, PACFL's data
    subspaces), each checked (:func:`cpcfl_tf.flower.checks.answered`: the node's own
    client, the shape and dtype of the answer a client of ``image_shape`` images gives,
    finite, the rule's own check); None for a client that gave no answer the server can
    use (it takes no part in the run). None when the rule asks nothing."""
    rule, fl = run.rule, run.federated
    if rule.asks is None:
        return None
    contents = {
        node: RecordDict(
            {
                "config": ConfigRecord(
                    {"ask": rule.asks, **rule.question(fl), **addressee(client, names)}
                )
            }
        )
        for node, client in client_of.items()
    }
    answers, _ = send(grid, contents, MessageType.QUERY, f"0-{rule.asks}", timeout)
    like = rule.answer_like(rule.question(fl), image_shape)
    good, _ = parsed(
        answers,
        "query",
        f"0-{rule.asks}",
        lambda content, node: checks.answered(
            content,
            client=client_of[node],
            like=like,
            problem=lambda answer: rule.answer_problem(fl, answer, num_groups),
        ),
    )
    by_client = {client_of[node]: answer for node, answer in good.items()}
    if not by_client:
        raise UserError(
            f"no client sent its {rule.asks} before training (the reasons are "
            f"above); the method needs them: start a SuperNode for each of the "
            f"{num_clients} clients (min-nodes = num-clients)" + rule.node_needs
        )
    missing = sorted(set(range(num_clients)) - set(by_client))
    if missing:
        print(
            f"[cpcfl] left out of the run: clients {missing} (no {rule.asks} before "
            "training; the method assigns the others from theirs)",
            flush=True,
        )
    return [by_client.get(c) for c in range(num_clients)]


def addressee(client: int, names: dict[int, str] | None) -> dict:
    """Whom a message is for, as the node checks it (``client_app._addressed``): the
    client id and, for a node with its own data, its folder name."""
    return {"client-id": client, **({} if names is None else {"name": names[client]})}


def roster(
    grid: Grid,
    nodes: list[int],
    timeout: float,
    num_clients: int,
    *,
    own: bool,
    most: int | None = None,
    unlabeled: bool = False,
) -> tuple[dict[int, int], dict[str, dict] | None, dict[int, int]]:
    """Who the clients are: node id -> client id, and, when the run config says the nodes
    bring their own data (``own``: its ``node-data``), client id -> the folder name and
    example counts they reported (``None`` for partition ids) and client id -> its
    unlabeled images (``unlabeled``: the run pre-trains on the nodes, and each must report
    them). Every reply is checked (:func:`cpcfl_tf.flower.checks.identity`; counts at most
    ``most``): of the kind the run config says, a partition id in 0..``num_clients`` - 1
    from a node started for ``num_clients`` partitions, and a partition id or a folder
    name is the first claimant's; a node that claims a taken one, answers the other kind,
    sends a malformed reply, or cannot serve (its data is bad) is left out, its reason
    printed. No node's answer changes how the others are read."""
    replies, failed = send(grid, {n: RecordDict() for n in nodes}, MessageType.QUERY, "0", timeout)
    if failed:
        print(f"[cpcfl] left out: nodes {failed} (no roster reply)", flush=True)
    said, _ = parsed(
        replies,
        "query",
        0,
        lambda content, node: checks.identity(
            content, num_clients=num_clients, own=own, most=most, unlabeled=unlabeled
        ),
    )
    if not said:
        started = (
            "with a data-path each (run config node-data own)"
            if own
            else f"with partition-id=K num-partitions={num_clients} (under the Simulation "
            f"Engine num-supernodes={num_clients})"
        )
        raise UserError(
            "no node answered the roster as the run config says (their reasons "
            f"are above): start the SuperNodes {started}"
        )
    client_of: dict[int, int] = {}  # node -> client
    claimed: dict[int | str, int] = {}  # its partition id or name -> node
    for node, i in said.items():  # in the order the replies came: the first claim holds
        claim = i.name if own else i.partition
        said_as = f"data folder {checks.shown(claim, 40)}" if own else f"partition-id {claim}"
        if claim in claimed:
            print(
                f"[cpcfl] node {node} failed query 0: its reply was left out: {said_as} is "
                f"node {claimed[claim]}'s already (start every SuperNode with its own data)",
                flush=True,
            )
            continue
        claimed[claim], client_of[node] = node, i.partition
    if not own:
        return client_of, None, {}
    names = sorted(claimed.items())  # the clients are numbered by folder name
    return (
        {node: k for k, (_, node) in enumerate(names)},
        {
            str(k): {
                "name": name,
                "num_train": said[node].num_train,
                "num_test": said[node].num_test,
            }
            for k, (name, node) in enumerate(names)
        },
        {
            k: said[node].num_unlabeled
            for k, (_, node) in enumerate(names)
            if said[node].num_unlabeled is not None
        },
    )


def mean_accuracy(scores: dict[int, float]) -> float:
    """The round's accuracy: the mean of the clients' accuracies in client order, as the
    simulator averages them (the order the replies came in changes the last bit)."""
    return float(np.mean([scores[c] for c in sorted(scores)]))


class Nodes:
    """The ServerApp's :class:`~cpcfl_tf.clustered.algorithm.Federation`: one SuperNode per
    client, reached through the Grid. A node that fails a round is left out of it."""

    def __init__(
        self,
        grid: Grid,
        client_of: dict[int, int],
        num_clients: int,
        timeout: float,
        run: RunPlan,
        names: dict[int, str] | None = None,
        examples: dict[int, int] | None = None,
        tests: dict[int, int] | None = None,
        cap: int | None = None,
        shared: Sequence[int] | None = None,
        starting_part: Sequence[np.ndarray] | None = None,
    ):
        self.grid, self.client_of, self.timeout = grid, client_of, timeout
        self.fl, self.method = run.federated, run.method
        self.shared = None if shared is None else list(shared)
        """The arrays of a model that go over the wire, both ways (None: all): all but a
        personalized method's kept part (:func:`~cpcfl_tf.clustered.algorithm.unsent_arrays`)."""
        self.starting_part = starting_part
        """A personalized method's part every client starts from (the initial pool's),
        sent to a node until it has answered a training message: from then on its
        ``context.state`` holds its own (:attr:`holding`)."""
        self.holding: set[int] = set()
        """The clients whose node holds its part."""
        self.attempt = 0
        """The attempt of the last round trained (a fine-tuning node draws its batches
        from it, as the simulator's clients do)."""
        self.names = names
        """Client id -> data folder name, for nodes with their own data."""
        self.examples = examples or {}
        """Client id -> its training examples (the roster's count, or its partition's
        size): the most a reply's ``num-examples`` may say."""
        self.tests = tests or {}
        """Client id -> its test examples: the most a scoring reply's count may say."""
        self.cap = cap
        """The most examples a reply weighs (None: its count): nodes with their own data
        and no ``max-examples``, whose counts are their own word."""
        self.num_clients, self.assigns = num_clients, run.method.server_assigns
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
            settings = {
                "round": plan.round,
                "attempt": plan.attempt,
                "num-clients": self.num_clients,
                **addressee(client, self.names),
            }
            if self.assigns and plan.drawn is not None:  # its own model only, and which
                cluster = int(plan.drawn[row[client]])
                contents[node] = RecordDict(
                    {
                        "config": ConfigRecord({**settings, "cluster": cluster}),
                        **self._sent({cluster: models[cluster]}, client),
                    }
                )
                continue
            # The whole pool, also in the Tc phase, where the node trains the model drawn
            # for it: the paper's (N+1)S per client and round, as the simulator counts.
            contents[node] = RecordDict(
                {
                    "config": ConfigRecord(settings),
                    **self._sent({n: models[n] for n in range(plan.num_models)}, client),
                }
            )
        self.attempt = plan.attempt
        messages, failed = send(
            self.grid, contents, MessageType.TRAIN, str(plan.round + 1), self.timeout
        )
        checked, left = parsed(
            messages,
            "train",
            plan.round + 1,
            lambda content, node: self._trained(content, node, plan, row, models),
        )
        failed = sorted({*failed, *left})  # their cluster ids kept, as a failed node's
        if self.starting_part is not None:  # a node that trained keeps its part
            self.holding |= {r.client for r in checked.values()}
        # In client order, as the simulator's replies come, not in order of arrival: a rule
        # that clusters the replies (FedGroup's k-means++) would otherwise name its
        # clusters by who answered first, and sums would add in another order.
        replies = sorted(checked.values(), key=lambda r: r.client)
        asked = {self.client_of[n] for n in contents}
        return algorithm.Replies(
            np.array([r.client for r in replies], np.int64),
            np.array([r.cluster for r in replies], np.int64),
            np.array([float(weighed(r.count, self.cap)) for r in replies]),
            [np.stack([r.weights[i] for r in replies]) for i in range(len(replies[0].weights))]
            if replies
            else [],
            sorted({self.client_of[n] for n in failed} | (set(row) - asked)),
        )

    def _trained(
        self, content, node: int, plan: algorithm.RoundPlan, row: dict, models
    ) -> checks.Trained:
        """A node's training reply as the server counts it (:func:`checks.trained`): the
        client it names, the cluster id (inside the pool; the model the node was given
        where the server assigned it or drew it for the Tc phase), the example count and
        the weights against the model of that cluster."""
        client = self.client_of[node]
        drawn = plan.drawn[row[client]] if plan.drawn is not None and client in row else None
        reply = checks.trained(
            content,
            client=client,
            num_models=plan.num_models,
            expected=None if drawn is None else int(drawn),
            most=self.examples.get(client),
            models=[self._wire(m) for m in models],
        )
        if self.shared is None:
            return reply
        # The kept part was not sent: the server's own arrays there, which it keeps.
        weights = list(models[reply.cluster])
        for i, a in zip(self.shared, reply.weights):
            weights[i] = a
        return dataclasses.replace(reply, weights=weights)

    def _wire(self, model):
        """What of ``model`` goes over the wire (:attr:`shared`)."""
        return list(model) if self.shared is None else [model[i] for i in self.shared]

    def _sent(self, models: dict, client: int) -> dict:
        """A message's models, as they go over the wire, and the starting part for a node
        that holds none yet."""
        records = models_to_records({n: self._wire(m) for n, m in models.items()})
        if self.starting_part is not None and client not in self.holding:
            records["part"] = to_record(list(self.starting_part))
        return records

    def observe(self, models, assigned, replies, round_: int, *, planned=None) -> dict:
        """The round's record. In the rounds the simulator scores (``fl.scored``) each node
        scores its cluster's model on its own test data, as Flower's evaluate rounds do."""
        record = {
            "cluster_ids": assigned.tolist(),
            "replies": len(replies.clients),
            "failed_partitions": replies.failed,
        }
        if not self.fl.scored(round_):
            return record
        self.scores, failed = self.evaluate(models, assigned, round_, planned)
        if self.scores:
            record["accuracy"] = mean_accuracy(self.scores)
        record["failed_partitions"] = sorted(set(replies.failed) | set(failed))
        return record

    def evaluate(
        self, models, assigned: np.ndarray, round_: int, planned: np.ndarray | None = None
    ) -> tuple[dict[int, float], list[int]]:
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
            settings = addressee(client, self.names)
            if self.method.fine_tunes:  # what its fine-tuning's batches are drawn from
                settings = {
                    **settings,
                    "round": round_,
                    "attempt": self.attempt,
                    "num-clients": self.num_clients,
                }
            contents[node] = RecordDict(
                {"config": ConfigRecord(settings), **self._sent(sent, client)}
            )
        messages, _ = send(
            self.grid, contents, MessageType.EVALUATE, f"{round_}-evaluate", self.timeout
        )
        scores, _ = parsed(
            messages,
            "evaluate",
            round_,
            lambda content, node: checks.scored(
                content, client=self.client_of[node], most=self.tests.get(self.client_of[node])
            ),
        )
        accuracy = {s.client: s.accuracy for s in scores.values()}
        return accuracy, sorted(set(self.client_of.values()) - set(accuracy))


class PretrainNodes:
    """The federated pre-training's clients as SuperNodes (the counterpart of the
    simulator's :class:`~cpcfl_tf.pretraining.federated_pretrain.LocalClients`): a round
    sends the global online parts to the sampled clients' nodes that are online; each
    trains the method's step on its own unlabeled images and sends its parts with its
    image count. A node that fails the round is left out of it."""

    def __init__(
        self,
        grid: Grid,
        client_of: dict[int, int],
        timeout: float,
        names: dict[int, str] | None,
        examples: dict[int, int],
        trainer,
        cap: int | None = None,
    ):
        self.grid, self.client_of, self.timeout, self.names = grid, client_of, timeout, names
        self.trainer = trainer
        """The server's :class:`~cpcfl_tf.pretraining.federated_pretrain.LocalTrainer`:
        the settings and the method a reply is checked against."""
        self.examples = examples
        """Client id -> its unlabeled images: the most a reply's ``num-examples`` may say."""
        self.cap = cap
        """The most images a reply weighs (None: its count), as :attr:`Nodes.cap`."""

    def train(self, global_weights, round_: int, chosen: np.ndarray):
        from cpcfl_tf.pretraining.federated_pretrain import Uploads

        wanted, online = set(chosen.tolist()), set(self.grid.get_node_ids())
        contents = {
            node: RecordDict(
                {
                    "config": ConfigRecord(
                        {"stage": "pretrain", "round": round_, **addressee(client, self.names)}
                    ),
                    "model": to_record(global_weights),
                }
            )
            for node, client in self.client_of.items()
            if client in wanted and node in online
        }
        replies, _ = send(
            self.grid, contents, MessageType.TRAIN, f"pretrain-{round_ + 1}", self.timeout
        )
        settings = self.trainer.settings
        checked, _ = parsed(
            replies,
            "pretrain",
            round_ + 1,
            lambda content, node: checks.pretrained(
                content,
                client=self.client_of[node],
                most=self.examples.get(self.client_of[node]),
                like=global_weights,
                batch_size=settings["batch_size"],
                local_epochs=settings["local_epochs"],
                reported=self.trainer.algorithm.reported,
                timeout=self.timeout,
            ),
        )  # left out as failed
        by_client = sorted(checked.values(), key=lambda r: r.client)  # the simulator's order
        # Each client's loss in full, so a run can be checked client by client against
        # the simulator's rounds (the round's line gives their mean only).
        print(
            f"[cpcfl] pretrain round {round_ + 1}: client losses "
            + ", ".join(f"{r.client} {r.results['loss']!r}" for r in by_client),
            flush=True,
        )
        return Uploads(
            [r.weights for r in by_client],
            [weighed(r.count, self.cap) for r in by_client],
            [r.results for r in by_client],
            len(contents),
            sorted(wanted - {r.client for r in by_client}),
        )
