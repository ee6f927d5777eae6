"""The ServerApp: IFCA / CP-CFL (FedAvg as N = 1) over real nodes.

Per round the server sends each node the pool of N models (in the Tc phase only the
model it drew for that node, with the encoder frozen), receives trained weights, the
chosen cluster id and the number of examples, and averages each cluster with
:func:`cpcfl_tf.federated.algorithm.aggregate` -- the simulator's own functions, seeded
the same way, so with the same seeds a federation assigns the same cluster ids.

Failures: a node whose reply is an error or does not come within ``round-timeout``
seconds is left out of that round (its cluster is the average of the members that did
reply, or keeps its weights if none did) and keeps its previous cluster id; it is asked
again in later rounds while the SuperLink lists it as connected. Each round's record
lists the partitions that failed it; the final accuracy is the mean over the nodes that
answer the evaluation. The server only ever sees weights, counts and cluster ids.
"""
from __future__ import annotations

import time

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp

from cpcfl_tf.config import PRETRAIN_METHODS
from cpcfl_tf.flower.common import from_record, model_key, run_config, to_record

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
    """Send ``contents[node]`` to every node; return the good replies and failed nodes."""
    messages = [Message(content, dst_node_id=node, message_type=kind, group_id=group)
                for node, content in contents.items()]
    replies = list(grid.send_and_receive(messages, timeout=timeout))
    good = [r for r in replies if not r.has_error()]
    answered = {r.metadata.src_node_id for r in good}
    return good, sorted(set(contents) - answered)


@app.main()
def main(grid: Grid, context: Context) -> None:
    from cpcfl_tf.data.sources import get_spec
    from cpcfl_tf.federated import algorithm
    from cpcfl_tf.federated.simulator import build_template, initial_pool
    from cpcfl_tf.results import write_json

    settings = dict(context.run_config)
    config = run_config(settings)
    fl = config.federated.resolved()
    timeout = float(settings.get("round-timeout", 300.0))
    num_clients = config.partition.num_clients
    wanted = int(settings.get("min-nodes", 0)) or num_clients
    nodes = _wait_for_nodes(grid, wanted, timeout)
    roster, failed = _send(grid, {n: RecordDict() for n in nodes}, MessageType.QUERY, "0",
                           timeout)
    partition_of = {r.metadata.src_node_id: int(r.content["metrics"]["partition-id"])
                    for r in roster}
    print(f"[cpcfl] {len(partition_of)} nodes: partitions {sorted(partition_of.values())}",
          flush=True)

    encoder_weights = None
    if fl.pretraining in PRETRAIN_METHODS:  # the server's own pre-training
        from cpcfl_tf.contrastive.pretrain import pretrained_encoder

        encoder_weights = pretrained_encoder(config.pretrain, config.data, method=fl.pretraining,
                                             seed=config.seed, verbose=0).encoder.get_weights()
    elif fl.pretraining != "none":
        raise ValueError(f"pre-training {fl.pretraining!r} is not available on Flower; use "
                         "none, simclr, byol or simsiam")
    size = config.data.image_size
    template = build_template(fl, (size, size, 3), get_spec(config.data.client_dataset).num_classes)
    num_encoder = len(template.get_layer("encoder").weights)
    attempt = 0
    state = algorithm.ServerState(0, initial_pool(fl, template, encoder_weights,
                                                  seed=config.seed, attempt=0), num_encoder)
    assigned = np.full(num_clients, -1, np.int64)
    history, t, started = [], 0, time.perf_counter()
    while t < fl.rounds:
        explore = t < fl.head_rounds
        rng = algorithm.round_rng(config.seed, attempt, t, algorithm.Stream.SELECTION)
        drawn = algorithm.select_clusters(None, fl.num_clusters, True, rng, num_clients)
        online = set(grid.get_node_ids())  # a node the SuperLink lost is not asked
        contents = {}
        for node, pid in partition_of.items():
            if node not in online:
                continue
            sent = [int(drawn[pid])] if explore else range(fl.num_clusters)
            contents[node] = RecordDict({
                "config": ConfigRecord({"round": t, "attempt": attempt, "explore": explore}),
                **{model_key(n): to_record(state.models[n]) for n in sent}})
        replies, failed = _send(grid, contents, MessageType.TRAIN, str(t + 1), timeout)
        if replies:
            metrics = [r.content["metrics"] for r in replies]
            trained = [from_record(r.content["model"]) for r in replies]
            ids = np.array([int(m["cluster-id"]) for m in metrics])
            stacked = [np.stack([w[i] for w in trained]) for i in range(len(trained[0]))]
            state = algorithm.aggregate(state, stacked, ids,
                                        [float(m["num-examples"]) for m in metrics],
                                        global_encoder=fl.global_encoder)
            assigned[[int(m["partition-id"]) for m in metrics]] = ids
        t += 1
        missing = sorted(set(partition_of) - set(contents))
        history.append({"round": t, "cluster_ids": assigned.tolist(), "replies": len(replies),
                        "failed_partitions": sorted(partition_of[n] for n in failed + missing)})
        print(f"[cpcfl] round {t}/{fl.rounds}: cluster ids {assigned.tolist()}, "
              f"{len(replies)} replies, {len(failed) + len(missing)} failed", flush=True)
        if algorithm.should_restart(fl, t, attempt, assigned):
            attempt, t, history = attempt + 1, 0, []
            assigned[:] = -1
            state = algorithm.ServerState(0, initial_pool(fl, template, encoder_weights,
                                                          seed=config.seed, attempt=attempt),
                                          num_encoder)

    # Each node scores its cluster's model on its own test data.
    contents = {node: RecordDict({"model": to_record(state.models[assigned[pid]])})
                for node, pid in partition_of.items() if assigned[pid] >= 0}
    scores, failed = _send(grid, contents, MessageType.EVALUATE, "evaluate", timeout)
    accuracy = {int(r.content["metrics"]["partition-id"]): float(r.content["metrics"]["accuracy"])
                for r in scores}
    record = {"experiment": "flower", "preset": config.preset, "method": fl.method,
              "pretraining": fl.pretraining, "config": config.to_dict(),
              "seeds": {"data": config.seed, "train": config.seed},
              "nodes": {str(n): p for n, p in partition_of.items()}, "rounds": history,
              "final": {"accuracy": float(np.mean(list(accuracy.values()))) if accuracy else None,
                        "client_accuracy": {str(k): v for k, v in sorted(accuracy.items())},
                        "restarts": attempt},
              "timing": {"seconds": time.perf_counter() - started}}
    print(f"[cpcfl] final accuracy {record['final']['accuracy']}", flush=True)
    if settings.get("out"):
        write_json(settings["out"], record)
