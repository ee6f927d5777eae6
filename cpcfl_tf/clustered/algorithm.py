"""The clustered-FL algorithm as small functions over an explicit state.

Algorithm "CP-CFL" of the paper, written the way FedJAX writes HypCluster: the server
state is a pool of N models (weight lists); a round (:func:`run_rounds`) is a *plan*
(:func:`plan_round`: who takes part, the random picks of the Tc phase, all drawn from
named seeded streams), *selection* (:func:`select`: each client picks a cluster), *local
training* (done by a backend, elsewhere) and *aggregation* (:func:`aggregate`: each
cluster's model becomes the |D_u|-weighted average of its members, Eq. weighted_avg, or
a robust combination of them: :mod:`cpcfl_tf.aggregation`, :func:`bounded`), then IFCA's restart
rule (:func:`should_restart`). Nothing here knows how models are trained or how clients
are reached: the simulator and a real federation (Flower) are two :class:`Federation`
drivers of the same round.

Weights are lists of numpy arrays in the order of ``classifier.get_weights()``:
first the encoder's ``num_encoder`` arrays, then the head's.
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np

from cpcfl_tf.aggregation import Sizes, bound_updates, combine, too_few
from cpcfl_tf.clustered.diagnostics import diagnosed, selection_record
from cpcfl_tf.clustered.local import ENCODER, HEAD, MODEL
from cpcfl_tf.clustered.restarts import cluster_sizes, should_restart
from cpcfl_tf.methods.clustering import Answers
from cpcfl_tf.methods.federated import get_method
from cpcfl_tf.plan.resolve import RunPlan

Weights = list[np.ndarray]


class Stream(enum.IntEnum):
    """What a round's random draws are for. Each has its own generator, seeded by (run
    seed, attempt, round, stream) and nothing else, so a resumed run, or a Flower node on
    another machine, draws exactly what an uninterrupted simulation draws."""

    SELECTION = 0
    """Who takes part, the random picks during Tc, and tie-breaks between equal losses."""
    BATCHES = 1
    """Each client's batch order (:func:`cpcfl_tf.clustered.local.batch_orders`)."""
    FINE_TUNE = 2
    """Each client's batch order when it fine-tunes the round's model before it is scored
    (:attr:`~cpcfl_tf.methods.federated.Method.fine_tunes`)."""


def stream_seed(seed: int, attempt: int, round_: int, stream: Stream) -> list[int]:
    """The seed words of ``stream`` in round ``round_`` (0-based) of restart ``attempt``."""
    return [seed, attempt, round_, int(stream)]


def round_rng(seed: int, attempt: int, round_: int, stream: Stream) -> np.random.Generator:
    """The generator of ``stream`` in round ``round_`` of restart ``attempt``."""
    return np.random.default_rng(stream_seed(seed, attempt, round_, stream))


def init_seed(seed: int, attempt: int, model: int) -> int:
    """Seed of the initial weights of pool model ``model`` in restart ``attempt`` (IFCA's
    restarts draw new models; the numbers only need to differ). Kept as it is: every
    committed run's initial pool was drawn with it."""
    return seed * 1_000_003 + attempt * 1_009 + model


@dataclasses.dataclass
class ServerState:
    """What the server holds between rounds."""

    round: int
    """Finished rounds."""
    models: list[Weights]
    """The pool of N cluster models."""
    num_encoder: int
    """How many leading arrays of each weight list belong to the encoder."""
    assignment: np.ndarray | None = None
    """Methods whose server assigns the clients (not ``loss``,
    :data:`~cpcfl_tf.methods.federated.ASSIGNMENTS`): each client's model in the next
    round."""
    memory: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    """What the method's rule keeps between rounds besides the pool (its own arrays, by
    name; checkpointed with the pool): e.g. the directions a one-off clustering measured."""


@dataclasses.dataclass(frozen=True)
class RoundPlan:
    """What a round draws before any client trains. Every party (the simulator, a Flower
    server, each Flower node) recomputes it from the seeds with :func:`plan_round`."""

    seed: int
    attempt: int
    round: int
    """0-based t."""
    num_clients: int
    num_models: int
    participants: np.ndarray
    """Sorted indices of the clients taking part."""
    drawn: np.ndarray | None
    """The model of each participant when it does not choose by loss: the random draw of
    the Tc phase, or the server's assignment; ``None``: each chooses (Eq. cluster_identity)."""
    head_only: bool = False
    """The Tc phase (``t < Tc``): heads train on the frozen encoder."""

    @property
    def batch_seed(self) -> list[int]:
        """Seed words of the participants' batch orders."""
        return stream_seed(self.seed, self.attempt, self.round, Stream.BATCHES)

    def selection_rng(self) -> np.random.Generator:
        """The round's selection stream, past the participation draw (what the Tc draws
        and the tie-breaks come from)."""
        rng = round_rng(self.seed, self.attempt, self.round, Stream.SELECTION)
        if len(self.participants) < self.num_clients:
            rng.choice(self.num_clients, len(self.participants), replace=False)
        return rng


def plan_round(
    run: RunPlan,
    seed: int,
    attempt: int,
    t: int,
    num_clients: int,
    assignment: np.ndarray | None = None,
) -> RoundPlan:
    """Round ``t`` (0-based) of restart ``attempt`` of ``run``: who takes part (a
    ``participation`` share, everyone by default) and the model of each participant: the
    server's ``assignment`` if it assigns, else for ``t < Tc`` a random draw."""
    fl = run.federated
    rng = round_rng(seed, attempt, t, Stream.SELECTION)
    take = fl.participants(num_clients)
    part = (
        np.arange(num_clients)
        if take == num_clients
        else np.sort(rng.choice(num_clients, take, replace=False))
    )
    head_only = t < fl.head_rounds
    drawn: np.ndarray | None
    if assignment is not None:
        drawn = np.asarray(assignment)[part]
    else:
        drawn = select_clusters(None, fl.num_clusters, True, rng, len(part)) if head_only else None
    return RoundPlan(seed, attempt, t, num_clients, fl.num_clusters, part, drawn, head_only)


def select(plan: RoundPlan, losses: np.ndarray | None) -> np.ndarray:
    """The participants' cluster ids (Eq. cluster_identity): the drawn (or assigned)
    models, else each one's lowest loss on its own training data. ``losses`` has one row per
    participant; a node that knows only its own row may leave the others at zero, since a
    row's tie-break keys do not depend on the other rows' values."""
    if plan.drawn is not None:
        return plan.drawn
    return select_clusters(losses, plan.num_models, False, plan.selection_rng())


def epoch_parts(fl, plan: RoundPlan) -> list[str]:
    """What each local epoch trains (:data:`~cpcfl_tf.clustered.local.MODEL`, ...): the
    head alone in the Tc phase (on the frozen encoder), else the whole model in the first
    ``E_l,f`` epochs and the head after them (tab:different_encoder_training); for a
    method whose :attr:`~cpcfl_tf.methods.federated.Method.schedule` is
    ``head-then-encoder`` (FedRep), the head in the first ``E - rep_epochs`` epochs and
    the encoder under that head in the last ``rep_epochs``."""
    if get_method(fl.method).schedule == "head-then-encoder":
        rep = int((fl.options or {})["rep_epochs"])
        return [HEAD] * (fl.local_epochs - rep) + [ENCODER] * rep
    return [
        MODEL if not plan.head_only and e < fl.encoder_trains else HEAD
        for e in range(fl.local_epochs)
    ]


def select_clusters(
    losses: np.ndarray | None,
    num_models: int,
    explore: bool,
    rng: np.random.Generator,
    num_clients: int | None = None,
) -> np.ndarray:
    """Cluster identity of each client (Eq. cluster_identity).

    Parameters
    ----------
    losses
        ``(clients, N)`` loss of every pool model on each client's *training* data;
        unused (may be ``None``) while exploring.
    num_models
        N.
    explore
        ``t < Tc``: each client picks a model uniformly at random.
    rng
        Source of the random picks and of tie-breaking.
    num_clients
        Needed when ``losses`` is ``None``.
    """
    if explore:
        count = num_clients if losses is None else losses.shape[0]
        return rng.integers(0, num_models, size=count)
    if losses is None:
        raise ValueError("choosing by loss needs the losses")
    # argmin with ties broken at random: add a random order to exact ties only.
    best = losses.min(axis=1, keepdims=True)
    tied = losses == best
    keys = np.where(tied, rng.random(losses.shape), np.inf)
    return np.argmin(keys, axis=1)


def bounded(replies: Replies, models: Sequence[Weights], bound: float) -> Replies:
    """``replies`` with each update (its weights minus the pool model of its cluster id,
    the one it was sent) scaled down to L2 norm ``bound`` over all its arrays where it is
    longer (:func:`cpcfl_tf.aggregation.bound_updates`)."""
    if not len(replies.clients):
        return replies
    sent = [
        np.stack([models[c][i] for c in replies.cluster_ids]) for i in range(len(replies.weights))
    ]
    weights = bound_updates(replies.weights, sent, bound)
    if all(w is v for w, v in zip(weights, replies.weights)):
        return replies
    return dataclasses.replace(replies, weights=weights)


def too_few_to_defend(fl, cluster_ids: np.ndarray, num_models: int) -> list[int]:
    """The clusters of a round whose members (the replies aggregated into them) were too
    few for ``fl.aggregation`` to out-vote one bad member (:func:`cpcfl_tf.aggregation.too_few`);
    with ``fl.global_encoder``, the encoder is combined over all replies, which are then
    too few as well."""
    sizes = cluster_sizes(cluster_ids, num_models)
    return [n for n, size in enumerate(sizes) if too_few(fl.aggregation, int(size))]


def aggregate(
    state: ServerState,
    client_weights: Sequence[np.ndarray],
    cluster_ids: np.ndarray,
    sizes: Sizes,
    *,
    global_encoder: bool = False,
    how: str = "mean",
    trim: float = 0.2,
    kept: Sequence[int] = (),
) -> ServerState:
    """New pool: each cluster's model is its members' combination
    (:func:`cpcfl_tf.aggregation.combine`; by default the weighted average).

    Parameters
    ----------
    state
        The pool the clients started from.
    client_weights
        The clients' trained weights, array by array, each stacked over clients
        (``client_weights[i][u]`` is array i of client u).
    cluster_ids, sizes
        Each client's cluster identity and number of training examples.
    global_encoder
        Combine the encoder part over *all* clients and share it between every cluster
        model (the paper's "global encoder" variant); heads stay per cluster.
    how, trim
        ``federated.aggregation`` and ``federated.trim_fraction``.
    kept
        The arrays no client sends (a personalized method's kept part,
        :func:`unsent_arrays`), so each model keeps its own there.

    A cluster nobody chose keeps its weights.
    """
    if len(cluster_ids) == 0:  # nobody replied: the pool stays as it was
        return dataclasses.replace(state, round=state.round + 1)
    counts = np.asarray(sizes, np.float64)
    shared = [i for i in range(len(client_weights)) if i not in kept]  # the kept: not sent
    models = []
    for n, old in enumerate(state.models):
        members = np.flatnonzero(cluster_ids == n)
        models.append(
            old
            if len(members) == 0
            else _with(
                old,
                shared,
                combine([client_weights[i][members] for i in shared], counts[members], how, trim),
            )
        )
    if global_encoder:
        encoder = [i for i in shared if i < state.num_encoder]
        combined = combine([client_weights[i] for i in encoder], counts, how, trim)
        models = [_with(m, encoder, combined) for m in models]
    return dataclasses.replace(state, round=state.round + 1, models=models)


def _with(model: Weights, index: Sequence[int], arrays: Sequence[np.ndarray]) -> Weights:
    """``model`` with its arrays ``index`` replaced by ``arrays``."""
    new = list(model)
    for i, a in zip(index, arrays):
        new[i] = a
    return new


def kept_arrays(run: RunPlan, num_encoder: int, num_arrays: int) -> tuple[int, ...]:
    """Which of a model's arrays each client keeps between rounds
    (:attr:`~cpcfl_tf.methods.federated.Method.keeps`): the encoder's first
    ``num_encoder``, the head's after them, all (a personal model), or none."""
    keeps = run.method.keeps
    if keeps == "encoder":
        return tuple(range(num_encoder))
    if keeps == "model":
        return tuple(range(num_arrays))
    return tuple(range(num_encoder, num_arrays)) if keeps == "head" else ()


def unsent_arrays(run: RunPlan, num_encoder: int, num_arrays: int) -> tuple[int, ...]:
    """Which of the shared model's arrays no client sends: the part it keeps in their
    place (FedPer, FedRep, LG-FedAvg); none where it keeps a personal model beside the
    shared one, which it trains and sends whole (Ditto)."""
    if run.method.keeps == "model":
        return ()
    return kept_arrays(run, num_encoder, num_arrays)


def sent_arrays(run: RunPlan, num_encoder: int, num_arrays: int) -> list[int]:
    """Which of the shared model's arrays go over the wire: all but
    :func:`unsent_arrays`."""
    unsent = set(unsent_arrays(run, num_encoder, num_arrays))
    return [i for i in range(num_arrays) if i not in unsent]


def initial_assignment(
    run: RunPlan, num_clients: int, answers: Answers | None = None
) -> np.ndarray | None:
    """Each client's first model when the server assigns, from the clients' ``answers``
    to what the rule asks first (:meth:`cpcfl_tf.methods.rules.Rule.first`); ``None`` when each
    client chooses by its loss. A client whose answer is None (a federation's node that
    gave none the server could use) takes no part in the run: the rule assigns the others
    from their answers alone, and it gets model 0, which it is never sent."""
    rule, fl = run.rule, run.federated
    if answers is None:
        return rule.first(fl, num_clients, None)
    given = [a for a in answers if a is not None]
    if len(given) == len(answers):
        return rule.first(fl, num_clients, given)
    present = [k for k, a in enumerate(answers) if a is not None]
    first = rule.first(fl, len(present), given)
    if first is None:  # a rule that asks assigns: never here
        return None
    assignment = np.zeros(num_clients, np.int64)
    assignment[present] = first
    return assignment


def server_ids(
    run: RunPlan, state: ServerState, replies: Replies
) -> tuple[np.ndarray, ServerState, dict]:
    """The cluster of each reply the server aggregates by, the pool it aggregates into,
    and what the rule adds to the round's record (:meth:`cpcfl_tf.methods.rules.Rule.step`)."""
    return run.rule.step(run.federated, state, replies)


@dataclasses.dataclass
class Replies:
    """What came back from a round's clients."""

    clients: np.ndarray
    """Index of the client of each reply."""
    cluster_ids: np.ndarray
    sizes: np.ndarray
    """Each reply's number of training examples |D_u|."""
    weights: list[np.ndarray]
    """The trained weights, array by array, stacked over replies."""
    failed: list[int] = dataclasses.field(default_factory=list)
    """Clients that were asked and did not reply (a real federation only)."""
    losses: np.ndarray | None = None
    """``(replies, N)``: each reply's loss on every pool model, where the driver saw them
    (the simulator, when the clients chose by loss); what the selection diagnostic
    records (:mod:`cpcfl_tf.clustered.diagnostics`)."""


class Federation(Protocol):
    """How a driver reaches its clients: :mod:`cpcfl_tf.clustered.simulator` in one
    process, :mod:`cpcfl_tf.flower.server_app` over the network. The round itself is
    :func:`run_rounds`'s."""

    num_clients: int

    def train(self, models: list[Weights], plan: RoundPlan) -> Replies:
        """Send the pool to ``plan``'s participants; each selects (:func:`select`) and
        trains locally."""

    def observe(
        self,
        models: list[Weights],
        assigned: np.ndarray,
        replies: Replies,
        round_: int,
        *,
        planned: np.ndarray | None = None,
    ) -> dict:
        """The round's record besides its number (e.g. accuracy, ``cluster_ids``);
        ``planned``: the server's assignment of every client, when it assigns (a client
        not taken part yet is scored with that model)."""


@dataclasses.dataclass
class Progress:
    """Where a run stands between rounds, besides its pool (what a checkpoint holds)."""

    round: int = 0
    attempt: int = 0
    history: list = dataclasses.field(default_factory=list)
    """One record per finished round of the current attempt."""
    assigned: list = dataclasses.field(default_factory=list)
    """Each client's last cluster id (-1: not yet taken part); empty before round 1."""
    bytes_down: int = 0
    bytes_up: int = 0
    seconds: float = 0.0
    bytes_other: int = 0
    """Sent up besides weights (PACFL's subspaces); in ``bytes_up`` too."""


def sent_before_training(run: RunPlan, answers: Answers | None) -> Progress:
    """Where a fresh run stands before round 1: what the clients' answers to the rule's
    first question added to the bytes sent up (PACFL's data subspaces, counted up and in
    ``bytes_other``; :meth:`cpcfl_tf.methods.rules.Rule.answer_bytes`)."""
    other = run.rule.answer_bytes(answers)
    return Progress(bytes_up=other, bytes_other=other)


def run_rounds(
    run: RunPlan,
    seed: int,
    federation: Federation,
    start: Callable[[int], ServerState],
    *,
    state: ServerState | None = None,
    progress: Progress | None = None,
    on_round: Callable[[dict, ServerState, Progress], None] | None = None,
    say: Callable[[str], None] | None = None,
    diagnose: int = 0,
) -> tuple[ServerState, Progress]:
    """Rounds until the run's T are done: plan, train (through ``federation``), aggregate,
    record, and IFCA's restart rule.

    Parameters
    ----------
    run
        The run's plan (:func:`~cpcfl_tf.plan.resolve.resolve`): its settings as the
        method runs them, its rule and its method.
    seed
        The training seed every draw derives from (:class:`Stream`).
    start
        ``start(attempt)``: the pool a (re)started run begins with.
    state, progress
        Where a resumed run stands (default: ``start(0)`` at round 0).
    on_round
        Called after every round (and restart decision) with its record, the new state
        and progress: where a driver checkpoints and reports.
    say
        Where the restart notice goes.
    diagnose
        Record the clients' losses on every pool model and their margins (``selection``)
        in the first ``diagnose`` rounds in which they choose by loss, where the
        federation reports them (:mod:`cpcfl_tf.clustered.diagnostics`); 0: never.
    """
    fl = run.federated
    state = start(0) if state is None else state
    progress = Progress() if progress is None else progress
    unsent = unsent_arrays(run, state.num_encoder, len(state.models[0]))
    sent = sent_arrays(run, state.num_encoder, len(state.models[0]))
    size = model_bytes([state.models[0][i] for i in sent])  # what goes over the wire
    n = federation.num_clients
    assigned = (
        np.array(progress.assigned, np.int64) if progress.assigned else np.full(n, -1, np.int64)
    )
    while progress.round < fl.rounds:
        t, started = progress.round, time.perf_counter()
        plan = plan_round(run, seed, progress.attempt, t, n, run.rule.assignment(fl, t, state))
        replies = federation.train(state.models, plan)
        if fl.update_norm is not None:
            replies = bounded(replies, state.models, fl.update_norm)
        ids, state, notes = server_ids(run, state, replies)
        undefended = too_few_to_defend(fl, ids, len(state.models))
        if undefended:
            notes = {**notes, "too_few_to_defend": undefended}
        if replies.losses is not None and diagnosed(t, fl.head_rounds, diagnose):
            notes = {**notes, "selection": selection_record(replies.clients, replies.losses)}
        state = aggregate(
            state,
            replies.weights,
            ids,
            replies.sizes,
            global_encoder=fl.global_encoder,
            how=fl.aggregation,
            trim=fl.trim_fraction,
            kept=unsent,
        )
        assigned[replies.clients] = ids
        if state.assignment is not None:
            state.assignment = state.assignment.copy()
            state.assignment[replies.clients] = ids
        down, up = round_bytes(len(plan.participants), sent_models(run), size)
        progress.bytes_down += down
        progress.bytes_up += up
        record = {
            "round": t + 1,
            **federation.observe(state.models, assigned, replies, t + 1, planned=state.assignment),
            **notes,
        }
        progress.history.append(record)
        progress.round = t + 1
        progress.seconds += time.perf_counter() - started
        if should_restart(run, progress.round, progress.attempt, assigned):
            if say:
                say(
                    f"clustering failed after round {progress.round} "
                    f"({cluster_sizes(assigned, fl.num_clusters).tolist()} clients per "
                    f"cluster); restart {progress.attempt + 1}/{fl.max_restarts}"
                )
            progress = dataclasses.replace(
                progress, round=0, attempt=progress.attempt + 1, history=[], assigned=[]
            )
            state, assigned = start(progress.attempt), np.full(n, -1, np.int64)
        progress.assigned = assigned.tolist()
        if on_round:
            on_round(record, state, progress)
    return state, progress


def model_bytes(weights: Weights) -> int:
    """Size S of one model as sent: the bytes of its arrays."""
    return int(sum(w.nbytes for w in weights))


def sent_models(run: RunPlan) -> int:
    """Models sent down to each participant per round: the pool of N when each client
    chooses by its loss, its own model when the server assigns, none for clients alone."""
    method = run.method
    return 0 if not method.communicates else 1 if method.server_assigns else run.num_models


def round_bytes(num_clients: int, num_models: int, size: int) -> tuple[int, int]:
    """Bytes down and up in one round: ``num_models`` (:func:`sent_models`) to every
    participating client, one model back from each unless nothing is sent (Eqs.
    comm_cost_fedavg / comm_cost_cfl: 2S and (N+1)S per client per round)."""
    return num_clients * num_models * size, num_clients * size * min(1, num_models)
