"""The paper's figures, drawn from data and result records (matplotlib, no display)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np

from cpcfl_tf.data.partition import Partition
from cpcfl_tf.records.files import write_atomic
from cpcfl_tf.records.record import RunRecord


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(plt, fig, path: str | os.PathLike) -> Path:
    """Lay ``fig`` out, write it as a PNG atomically, close it."""
    fig.tight_layout()
    try:
        return write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=130, format="png"))
    finally:
        plt.close(fig)


def plot_client_data_amounts(
    partition: Partition,
    train_labels: np.ndarray,
    path: str | os.PathLike,
    *,
    title: str | None = None,
) -> Path:
    """fig:client_data_amount: one dot per client x class, its area the image count.

    Parameters
    ----------
    partition
        The clients, as drawn by :func:`~cpcfl_tf.data.partition.partition_clients`.
    train_labels
        Labels of the split the clients' training images come from.
    path
        Where the PNG goes (written atomically).
    """
    plt = _pyplot()
    counts = [np.bincount(train_labels[c.train_index]) for c in partition.clients]
    largest = max(int(c.max()) for c in counts)
    fig, ax = plt.subplots(figsize=(max(6.0, 0.16 * len(counts) + 2), 3.2))
    colors = plt.get_cmap("tab10")
    for client, per_class in zip(partition.clients, counts):
        classes = np.flatnonzero(per_class)
        ax.scatter(
            np.full(len(classes), client.id),
            classes,
            s=90.0 * per_class[classes] / largest,
            color=colors(client.group % 10),
            edgecolors="none",
        )
    num_classes = max(max(g) for g in partition.group_classes) + 1
    ax.set_yticks(range(num_classes))
    ax.set_ylim(-0.7, num_classes - 0.3)
    ax.set_xlim(-1, len(counts))
    ax.set_xlabel("client")
    ax.set_ylabel("class")
    sizes = sorted({int(v) for c in counts for v in c if v})
    for size in (sizes[0], sizes[-1]) if len(sizes) > 1 else sizes:
        ax.scatter([], [], s=90.0 * size / largest, color="gray", label=f"{size} images")
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False, fontsize=8)
    ax.set_title(title or "Private data of the clients per class")
    return _save(plt, fig, path)


def plot_accuracy_curves(
    curves: dict[str, RunRecord], path: str | os.PathLike, *, title: str
) -> Path:
    """fig:table2_accuracy (and fig:num_clients): mean client test accuracy per round.

    ``curves`` maps a label to a run record (its ``rounds``).
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for label, record in curves.items():
        scored = [(r.round, r.accuracy) for r in record.rounds if r.accuracy is not None]
        ax.plot([t for t, _ in scored], [100 * a for _, a in scored], label=label, lw=1.4)
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, frameon=False)
    return _save(plt, fig, path)


def plot_cluster_identity(record: RunRecord, path: str | os.PathLike, *, title: str) -> Path:
    """fig:cluster_identity: the cluster each client chose in each round."""
    plt = _pyplot()
    ids = np.array([r.cluster_ids for r in record.rounds]).T  # clients x rounds
    fig, ax = plt.subplots(figsize=(6.4, max(2.5, 0.06 * ids.shape[0] + 1.5)))
    image = ax.imshow(
        ids,
        aspect="auto",
        interpolation="nearest",
        cmap="tab10",
        vmin=-0.5,
        vmax=9.5,
        extent=(0.5, ids.shape[1] + 0.5, ids.shape[0] - 0.5, -0.5),
    )
    head_rounds = record.config.federated.head_rounds
    if head_rounds:
        ax.axvline(head_rounds + 0.5, color="black", lw=1, ls="--", label=f"Tc = {head_rounds}")
        ax.legend(loc="upper right", fontsize=8)
    ax.set_xlabel("round")
    ax.set_ylabel("client")
    ax.set_title(title)
    cbar = fig.colorbar(image, ax=ax, ticks=range(int(ids.max()) + 1))
    cbar.set_label("cluster")
    cbar.ax.set_ylim(-0.5, ids.max() + 0.5)
    return _save(plt, fig, path)


def plot_class_accuracy(rounds: list[dict], path: str | os.PathLike, *, title: str) -> Path:
    """Test accuracy of every class (rows) in every round (columns): a model that swings
    between favouring two sets of classes shows as a checkerboard.

    ``rounds`` holds ``{"round": t, "class_accuracy": [...]}`` per round.
    """
    plt = _pyplot()
    grid = np.array([r["class_accuracy"] for r in rounds]).T * 100
    first, last = rounds[0]["round"], rounds[-1]["round"]
    fig, ax = plt.subplots(figsize=(7.2, 3.4))
    image = ax.imshow(
        grid,
        aspect="auto",
        interpolation="nearest",
        cmap="viridis",
        vmin=0,
        vmax=100,
        extent=(first - 0.5, last + 0.5, grid.shape[0] - 0.5, -0.5),
    )
    ax.set_yticks(range(grid.shape[0]))
    ax.set_xlabel("round")
    ax.set_ylabel("class")
    ax.set_title(title)
    fig.colorbar(image, ax=ax).set_label("test accuracy (%)")
    return _save(plt, fig, path)


def plot_paired_bars(
    groups: list[str],
    bars: dict[str, list[list[float]]],
    path: str | os.PathLike,
    *,
    ylabel: str,
    title: str,
) -> Path:
    """Side-by-side bars per group (e.g. a method from random weights and from SimCLR):
    the mean over seeds with its SD, every seed as a dot.

    ``bars`` maps a bar's label to one list of per-seed values per group (empty: no bar).
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6.4, 0.9 * len(groups) + 1.5), 4.0))
    width = 0.8 / max(1, len(bars))
    for k, (label, values) in enumerate(bars.items()):
        x = np.arange(len(groups)) + (k - (len(bars) - 1) / 2) * width
        means = [np.mean(v) if v else np.nan for v in values]
        sds = [np.std(v) if v else 0.0 for v in values]
        ax.bar(x, means, width * 0.9, yerr=sds, capsize=3, label=label, alpha=0.8)
        for xi, v in zip(x, values):
            ax.scatter(np.full(len(v), xi), v, s=8, color="black", zorder=3)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, frameon=False)
    return _save(plt, fig, path)


def plot_selection(record: RunRecord, path: str | os.PathLike, *, title: str) -> Path:
    """The selection diagnostic of one run (``--diagnose``): left, each client's margin
    (second-lowest minus lowest pool loss) in the diagnosed rounds, by true group; right,
    the clients per cluster in every round (the final attempt's)."""
    from cpcfl_tf.clustered.restarts import cluster_sizes

    plt = _pyplot()
    groups = np.array([c["group"] for c in record.clients])
    num_models = record.config.federated.num_clusters
    fig, (left, right) = plt.subplots(1, 2, figsize=(9.6, 3.6))
    diagnosed = [(r.round, r.selection) for r in record.rounds if r.selection]
    colors = plt.get_cmap("tab10")
    for g in np.unique(groups):
        xs: list[float] = []
        ys: list[float] = []
        for round_, selection in diagnosed:
            clients = np.array(selection["clients"])
            mine = groups[clients] == g
            xs += [round_ + (g - 1) * 0.12] * int(mine.sum())
            ys += list(np.array(selection["margins"])[mine])
        left.scatter(xs, ys, s=10, color=colors(int(g)), label=f"group {g}")
    left.set_yscale("symlog", linthresh=1e-3)
    left.set_xlabel("round")
    left.set_ylabel("margin: 2nd lowest − lowest loss")
    left.legend(fontsize=7, frameon=False)
    left.grid(alpha=0.3)
    rounds = [r.round for r in record.rounds]
    sizes = np.array([cluster_sizes(r.cluster_ids, num_models) for r in record.rounds])
    for n in range(num_models):
        right.plot(rounds, sizes[:, n], lw=1.2, color=colors(n), label=f"cluster {n}")
    head_rounds = record.config.federated.head_rounds
    if head_rounds:
        right.axvline(head_rounds + 0.5, color="black", lw=1, ls="--", label=f"Tc = {head_rounds}")
    right.set_xlabel("round")
    right.set_ylabel("clients in the cluster")
    right.legend(fontsize=7, frameon=False)
    right.grid(alpha=0.3)
    fig.suptitle(title, fontsize=10)
    return _save(plt, fig, path)


def plot_margin_distributions(
    margins: dict[str, list[float]], path: str | os.PathLike, *, title: str
) -> Path:
    """Each set of clients' margins at their first choice by loss (e.g. of runs that
    found the groups and of runs that merged them), as overlaid histograms of the margins'
    base-10 logarithms: 29 equal bins from the smallest to the largest, density per
    decade, the axis ticked at powers of ten.

    The logarithms are Python's ``math.log10`` and the axis is linear in them: numpy's
    ``log10`` and ``power`` (``np.logspace``, a log axis's transform) take SIMD paths on
    AVX-512 machines whose last bits differ from the scalar ones for some values, and this
    figure, drawn from the same records, had other bytes on other machines."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    logs = {label: [math.log10(v) for v in vs if v > 0] for label, vs in margins.items()}
    values = [x for xs in logs.values() for x in xs]
    low = min(values) if values else -4.0
    high = max(values) if values else 0.0
    bins = np.linspace(low, high + 1e-9, 30)
    for label, xs in logs.items():
        if xs:
            ax.hist(xs, bins=bins, alpha=0.55, density=True, label=f"{label} ({len(xs)} clients)")
    ticks = list(range(math.floor(low), math.ceil(high) + 1))
    ax.set_xticks(ticks, [f"$10^{{{k}}}$" for k in ticks])
    ax.set_xlabel("margin at the first choice by loss")
    ax.set_ylabel("density per decade")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, frameon=False)
    return _save(plt, fig, path)
