"""The ServerApp: every federated method of the kit over real nodes.

Per round the server sends each node the pool of N models when clients choose by loss
(IFCA, CP-CFL, FedAvg as N = 1; in the Tc phase the node trains the head of the model
drawn for it, with the encoder frozen), or only the model it assigned the node (oracle,
FeSEM, CFL, FL+HC, PACFL). It receives trained weights, the cluster id and the number of
examples, and aggregates with :func:`cpcfl_tf.clustered.algorithm.run_rounds` -- the
simulator's own round, seeded the same way, so with the same seeds a federation assigns
the same cluster ids. Before training it asks what a method needs once
(:attr:`~cpcfl_tf.methods.federated.Method.asks_first`: the oracle's true groups, PACFL's data
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
from pathlib import Path

import numpy as np
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from cpcfl_tf.clustered import algorithm
from cpcfl_tf.flower import checks, remote
from cpcfl_tf.flower.common import class_names, own_data, run_config
from cpcfl_tf.methods.federated import METHODS, plugins_used
from cpcfl_tf.plan.context import RunContext
from cpcfl_tf.plan.resolve import check_data, federated_settings, resolve
from cpcfl_tf.records.files import prepare_out_dir
from cpcfl_tf.records.record import write_record

app = ServerApp()


def _pretrain_stage(
    grid: Grid,
    client_of: dict[int, int],
    run,
    timeout: float,
    names: dict[int, str] | None,
    unlabeled: dict[int, int],
    cap: int | None = None,
) -> list[np.ndarray]:
    """The federated self-supervised pre-training as the run's first stage: the
    simulator's rounds (:func:`~cpcfl_tf.pretraining.federated_pretrain.pretrain_rounds`,
    seeded the same) with the nodes as its clients. Returns the global encoder."""
    from cpcfl_tf.pretraining.fedavg_ssl import set_parts
    from cpcfl_tf.pretraining.federated_pretrain import LocalTrainer, new_totals, pretrain_rounds

    config, pretraining = run.requested, run.pretraining
    size = config.data.image_size
    server = LocalTrainer(pretraining, (size, size, 3))  # its seeded init and averaging only
    start, rounds = pretraining.name, server.settings["rounds"]

    def after(r: int, entry: dict, _) -> None:
        print(
            f"[cpcfl] {start} round {r + 1}/{rounds}: {entry['clients']} replies, "
            f"{len(entry.get('failed', []))} failed, loss {entry['loss']:.4f}",
            flush=True,
        )

    totals = new_totals()
    if names is None:  # partition nodes: each client's share of the run's deal
        from cpcfl_tf.clustered.clients import unlabeled_for

        examples = {k: len(images) for k, images in enumerate(unlabeled_for(config))}
    else:  # own data: what each node reported in the roster
        examples = {k: int(unlabeled[k]) for k in names if k in unlabeled}
    clients = remote.PretrainNodes(grid, client_of, timeout, names, examples, server, cap)
    weights = pretrain_rounds(
        server, clients, config.partition.num_clients, server.initial(), totals, after=after
    )
    print(
        f"[cpcfl] {start}: {totals['bytes_down'] / 1e6:.1f} MB of online parts down, "
        f"{totals['bytes_up'] / 1e6:.1f} MB up",
        flush=True,
    )
    set_parts(server.shared, weights)
    return server.model.encoder.get_weights()


def _examples(config, node_data: dict[str, dict] | None) -> tuple[dict[int, int], dict[int, int]]:
    """Each client's training and test examples, the bounds of its replies' counts: what a
    node with its own data reported in the roster, or the sizes of the client's partition
    (every client of a drawn partition has as many)."""
    if node_data is not None:
        return (
            {int(k): int(d["num_train"]) for k, d in node_data.items()},
            {int(k): int(d["num_test"]) for k, d in node_data.items()},
        )
    from cpcfl_tf.clustered.clients import clients_for

    clients, every = clients_for(config), range(config.partition.num_clients)
    return dict.fromkeys(every, clients.train.size), dict.fromkeys(every, clients.test.size)


def own_data_config(config, nodes: int):
    """The run's config for ``nodes`` nodes with their own data: the clients are the nodes
    that answered, nothing is drawn (partition.kind own; no split sizes apply). The server
    knows no groups: one, unless the method asks each node its true group (the oracle),
    whose models are then the run config's ``partition.num_groups``, the groups the nodes'
    ``group=G`` may name."""
    groups = METHODS[config.federated.method].rule.groups_are_models
    return config.with_overrides(
        partition={
            "num_clients": nodes,
            "kind": "own",
            "num_groups": config.partition.num_groups if groups else 1,
        }
    )


@app.main()
def main(grid: Grid, context: Context) -> None:
    from cpcfl_tf.clustered.pool import federated_record, initial_state, template_for
    from cpcfl_tf.clustered.starting import StartingEncoders
    from cpcfl_tf.records.environment import run_environment

    settings = dict(context.run_config)
    config = run_config(settings)
    check_data(config)  # before any wait: the plan is made once the nodes are known
    resolve(config, checked=True)  # what the plan refuses (a defence that cannot hold), too
    classes = class_names(settings)
    timeout = float(settings.get("round-timeout", 300.0))
    wanted = int(settings.get("min-nodes", 0)) or config.partition.num_clients
    most = int(settings.get("max-examples", 0)) or None
    if settings.get("out"):  # refuse an unwritable output before any work
        prepare_out_dir(
            Path(str(settings["out"])).parent, fix="set the run config's out to a writable path"
        )
    client_of, node_data, unlabeled = remote.roster(
        grid,
        remote.wait_for_nodes(grid, wanted, timeout),
        timeout,
        config.partition.num_clients,
        own=own_data(settings),
        most=most,
        unlabeled=federated_settings(config) is not None,
    )
    if node_data is not None:
        config = own_data_config(config, len(client_of))
        print(
            f"[cpcfl] {len(client_of)} nodes with their own data: "
            + ", ".join(
                f"{k} {checks.shown(d['name'], 40)} ({d['num_train']} + {d['num_test']} images)"
                for k, d in node_data.items()
            ),
            flush=True,
        )
    else:
        print(
            f"[cpcfl] {len(client_of)} nodes: partitions {sorted(client_of.values())}", flush=True
        )
    caps = remote.count_caps(node_data, unlabeled, most)
    if caps is not None:
        print(
            "[cpcfl] a reply weighs at most "
            + ", ".join(f"{n} {kind} examples" for kind, n in caps.items())
            + " (the lower median of the "
            "nodes' reports; set max-examples to bound them instead)",
            flush=True,
        )
    run = resolve(config, checked=node_data is None)  # partition nodes: checked above
    fl = run.federated
    num_clients = config.partition.num_clients

    names = None if node_data is None else {int(k): str(d["name"]) for k, d in node_data.items()}
    size = config.data.image_size
    answers = remote.ask_first(
        grid,
        client_of,
        run,
        num_clients,
        timeout,
        names,
        image_shape=(size, size, 3),
        num_groups=config.partition.num_groups,
    )
    if answers is not None:  # a client without an answer takes no part
        client_of = {n: c for n, c in client_of.items() if answers[c] is not None}

    encoder_weights: list[np.ndarray] | None
    if run.pretraining is not None and run.pretraining.federated is not None:
        # The first stage: the nodes pre-train the encoder on their unlabeled images.
        encoder_weights = _pretrain_stage(
            grid, client_of, run, timeout, names, unlabeled, (caps or {}).get("unlabeled")
        )
    else:  # the server's own pre-training (its data, never the nodes')
        encoder_weights = StartingEncoders(context=RunContext(verbose=0))(run)
    template = template_for(run, (size, size, 3), len(classes))  # the simulator's

    def start(attempt: int) -> algorithm.ServerState:
        return initial_state(
            run,
            template,
            encoder_weights,
            seed=config.seed,
            attempt=attempt,
            num_clients=num_clients,
            answers=answers,
        )

    def after(record: dict, state, progress) -> None:
        scored = f", accuracy {record['accuracy']:.4f}" if "accuracy" in record else ""
        print(
            f"[cpcfl] round {record['round']}/{fl.rounds}: cluster ids "
            f"{record['cluster_ids']}, {record['replies']} replies, "
            f"{len(record['failed_partitions'])} failed{scored}",
            flush=True,
        )

    shared, starting_part = None, None
    if run.method.keeps:  # a personalized method: its part stays on the nodes
        first = start(0).models[0]
        num_encoder = len(template.get_layer("encoder").weights)
        shared = algorithm.sent_arrays(run, num_encoder, len(first))
        starting_part = [first[i] for i in algorithm.kept_arrays(run, num_encoder, len(first))]
    federation = remote.Nodes(
        grid,
        client_of,
        num_clients,
        timeout,
        run,
        names,
        *_examples(config, node_data),
        cap=(caps or {}).get("train"),
        shared=shared,
        starting_part=starting_part,
    )
    state, progress = algorithm.run_rounds(
        run,
        config.seed,
        federation,
        start,
        on_round=after,
        progress=algorithm.sent_before_training(run, answers),
        say=lambda line: print(f"[cpcfl] {line}", flush=True),
    )
    accuracy = federation.scores  # the last round's
    # The server never sees the clients' data: no class counts, no true groups, no ARI.
    record = dataclasses.replace(
        federated_record(
            run,
            config.seed,
            progress,
            state,
            remote.mean_accuracy(accuracy) if accuracy else None,
            client_accuracy={str(k): v for k, v in sorted(accuracy.items())},
            # every client's part on its node, never sent (the simulator's count)
            bytes_kept=num_clients * sum(a.nbytes for a in starting_part or []),
        ),
        experiment="flower",
        environment=run_environment(
            encoder_weights, plugins_used(config.federated.method, config.federated.pretraining)
        ),
        nodes={str(n): c for n, c in client_of.items()},
        node_data=node_data,
        count_caps=caps,
    )
    print(f"[cpcfl] final accuracy {record.final.accuracy}", flush=True)
    if settings.get("out"):
        write_record(str(settings["out"]), record)
