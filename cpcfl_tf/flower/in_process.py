"""The ServerApp and the ClientApps of a federation in one process, without Flower's
transport: what they compute, at the cost of one process (the suite's checks of the
apps, and ``tools/poisoned_node.py``). Nodes are given as node configs, as a SuperNode's
``--node-config`` (``partition-id``, ``data-path``, ``tamper``, ...)."""

from __future__ import annotations

from pathlib import Path


class InProcessGrid:
    """A Flower ``Grid`` whose SuperNodes are the ClientApp's handlers called in this
    process, one ``Context`` per node, as the Simulation Engine calls them but without
    its transport (tests/test_flower.py runs the loopback federation and the Simulation
    Engine for that). For what the ServerApp and ClientApp compute, at the cost of one
    process: the tests' rehearsals and ``tools/poisoned_node.py``."""

    def __init__(self, run, node_configs, refuse=()):
        from flwr.app import Context, RecordDict

        self.refuse = set(refuse)
        """(group id, node index) pairs whose message gets an error reply, as from a node
        that failed it."""
        self.contexts = {
            100 + k: Context(
                run_id=1,
                node_id=100 + k,
                node_config=dict(c),
                state=RecordDict(),
                run_config=dict(run),
            )
            for k, c in enumerate(node_configs)
        }
        self.sent = 0

    def get_node_ids(self):
        return list(self.contexts)

    def send_and_receive(self, messages, timeout=None):
        import time

        from flwr.app import Error, MessageType
        from flwr.common import Message, Metadata

        from cpcfl_tf.flower import client_app

        handlers = {
            MessageType.TRAIN: client_app.train,
            MessageType.EVALUATE: client_app.evaluate,
            MessageType.QUERY: client_app.query,
        }
        replies = []
        for message in messages:
            self.sent += 1
            meta = message.metadata
            node = meta.dst_node_id
            # Flower's own constructor of a delivered message (not in its typed overloads)
            delivered = Message(  # type: ignore[call-overload]
                message.content,
                metadata=Metadata(
                    run_id=1,
                    message_id=f"m{self.sent}",
                    src_node_id=1,
                    dst_node_id=node,
                    reply_to_message_id="",
                    group_id=meta.group_id,
                    created_at=time.time(),
                    ttl=60.0,
                    message_type=meta.message_type,
                ),
            )
            if (meta.group_id, node - 100) in self.refuse:
                replies.append(
                    Message(Error(0, "refused (InProcessGrid refuse)"), reply_to=delivered)
                )
            else:
                replies.append(handlers[meta.message_type](delivered, self.contexts[node]))
        return replies


def run_in_process(run, node_configs, refuse=()):
    """The ServerApp's ``main`` over an :class:`InProcessGrid` of ``node_configs``
    (``refuse``: its failing messages); returns the run record (``run["out"]``)."""
    import json

    from flwr.app import Context, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    from cpcfl_tf.flower import server_app

    before = TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id
    # The ServerApp's identity, as Flower sets it in the ServerApp's process.
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 1
    try:
        server_app.main(  # a Grid in the calls main makes, not a subclass of Flower's
            InProcessGrid(run, node_configs, refuse),  # type: ignore[arg-type]
            Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config=dict(run)),
        )
    finally:
        TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = before
    return json.loads(Path(run["out"]).read_text())
