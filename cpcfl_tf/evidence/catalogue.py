"""The paper's run catalogue: the rows its tables compare and the client counts of its
number-of-clients study, as :class:`~cpcfl_tf.running.runner.RunSpec` s for the scripts
(``experiments/``). Row labels come from :func:`cpcfl_tf.methods.federated.run_label`.
"""

from __future__ import annotations

from typing import Any

from cpcfl_tf.methods.federated import run_label
from cpcfl_tf.plan.config import Config
from cpcfl_tf.running.runner import RunSpec

COMPARISON = {
    f"{method}-{pre}": (method, pre, run_label(method, pre))
    for method, pre in (
        ("fedavg", "none"),
        ("fedavg", "simclr"),
        ("ifca", "none"),
        ("ifca", "fedavg"),
        ("cp-cfl", "simclr"),
    )
}
"""The five rows (run name: method, pre-training, label) the paper compares in most tables."""
COMPARISON_LABELS = {name: label for name, (_, _, label) in COMPARISON.items()}
"""Run name -> the label the paper's tables use."""


def comparison_specs(prefix: str = "", **fields: Any) -> list[RunSpec]:
    """The five :data:`COMPARISON` rows as specs named ``prefix + name``, with ``fields``
    (other :class:`RunSpec` fields) shared by all."""
    return [
        RunSpec(prefix + name, method, pre, row=name, **fields)
        for name, (method, pre, _) in COMPARISON.items()
    ]


PAPER_CLIENT_SETTINGS = ((15, 40), (30, 60), (60, 100), (90, 100))
"""(clients, rounds T) of the paper's four client counts (Sec. "Number of clients")."""


def client_settings(config: Config) -> list[tuple[int, int]]:
    """(clients, rounds) of the number-of-clients study for ``config``'s preset: the
    paper's, with T capped at the ``quick`` preset's 40 rounds (CPU time); ``smoke`` uses
    3, 6 and 9 clients."""
    if config.preset == "smoke":
        return [(n, config.federated.rounds) for n in (3, 6, 9)]
    if config.preset == "quick":
        return [(n, min(t, config.federated.rounds)) for n, t in PAPER_CLIENT_SETTINGS]
    return list(PAPER_CLIENT_SETTINGS)


def clients_partition(config: Config, clients: int) -> dict[str, Any]:
    """The partition overrides for ``clients`` clients."""
    # STL-10 has 500 training images a class: 90 clients of 50 cannot hold disjoint
    # data (docs/choices.md), so the paper preset lets them share images at 90.
    shared = config.preset == "paper" and clients * 50 > 3000
    return {"num_clients": clients, **({"disjoint": False} if shared else {})}
