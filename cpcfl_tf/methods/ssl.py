"""The self-supervised methods the server pre-trains with: one registry entry each.

The pre-training stage's one home, as :mod:`cpcfl_tf.methods.federated` is the federated stage's:
an entry names the method, how tables name it, the file that implements it (one module
under :mod:`cpcfl_tf.pretraining`, imported only when it trains), its own settings with
their defaults and the paper each default comes from, and the grid the paper's encoder
selection tunes. Config validation, pre-training, the starting encoders of
:mod:`cpcfl_tf.methods.federated`, the run record's schema, the Flower apps and the docs read it;
nothing else names a method. ``pretrain.options`` overrides settings per method, e.g.
``{"byol": {"target_decay": 0.99}}``.

This module imports nothing of the kit but its errors (no TensorFlow), so every layer may
read it. Adding a method: docs/extending.md, "A new self-supervised method".
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Callable
from typing import Any

from cpcfl_tf.errors import UserError
from cpcfl_tf.plugins import entries


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def positive(value) -> str | None:
    """None if ``value`` is a positive finite number, else what it must be."""
    return None if _number(value) and value > 0 else "a positive number"


def non_negative(value) -> str | None:
    return None if _number(value) and value >= 0 else "a number >= 0"


def rate(value) -> str | None:
    return None if _number(value) and 0 <= value < 1 else "a number in [0, 1)"


def width(value) -> str | None:
    """A layer width, or None for the method's own default."""
    ok = value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0)
    return None if ok else "a positive integer or none"


def count(value) -> str | None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    return None if ok else "a positive integer"


def one_of(*choices: str) -> Callable[[Any], str | None]:
    def check(value) -> str | None:
        return None if value in choices else "one of " + ", ".join(choices)

    return check


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting of a method: its default, where the default comes from, its check."""

    default: Any
    source: str
    """The paper (and section) or the kit's choice (docs/choices.md) the default is from."""
    check: Callable[[Any], str | None] = positive
    """None for a valid value, else what a value must be (for the one-line error)."""
    help: str = ""
    means: Callable[[str, int], Any] | None = None
    """For a default of None: the value it stands for on an encoder (name, output width),
    so that a grid value equal to it is spelled as the default (and finds its cache)."""


class _HasSettings:
    """What an entry with settings in ``pretrain.options`` can do: check and resolve them."""

    name: str
    settings: dict[str, Setting]

    def check(self, given: dict[str, Any] | None, where: str = "pretrain.options") -> None:
        """One-line error for a setting it does not have or a value it cannot take."""
        for name, value in (given or {}).items():
            if name not in self.settings:
                raise UserError(
                    f"{self.name} has no setting {name!r} in {where}; its "
                    f"settings: {', '.join(self.settings)}"
                )
            wanted = self.settings[name].check(value)
            if wanted:
                raise UserError(f"{where} {self.name}.{name} must be {wanted}, got {value!r}")

    def resolve(self, given: dict[str, Any] | None) -> dict[str, Any]:
        """Every setting's value: the defaults with ``given`` over them (checked)."""
        self.check(given)
        return {name: s.default for name, s in self.settings.items()} | dict(given or {})


@dataclasses.dataclass(frozen=True)
class SSLMethod(_HasSettings):
    """One self-supervised method of the server's pre-training."""

    name: str
    """As ``federated.pretraining`` (the starting encoder) and cache keys name it."""
    label: str
    """How tables name it."""
    module: str
    """The module that implements it: ``build(parts, settings) -> ContrastiveModel``."""
    paper: str
    settings: dict[str, Setting]
    grid: dict[str, tuple] = dataclasses.field(default_factory=dict)
    """Values the encoder selection pre-trains by default, per setting (the paper tunes
    the projection head's width: Sec. "Experimental settings")."""

    def spelled(self, name: str, value: Any, encoder: str, dim: int) -> Any:
        """``value`` of setting ``name`` as the config spells it: the default (None) where
        the value is what the default stands for on this encoder, else itself."""
        setting = self.settings[name]
        if setting.means is not None and value == setting.means(encoder, dim):
            return setting.default
        return value

    def build(self, parts, settings: dict[str, Any]):
        """The method's ``keras.Model`` (TensorFlow is imported here, not before)."""
        return importlib.import_module(self.module).build(parts, settings)


# The paper's settings: Sec. "Experimental settings" (the CP-CFL paper). The projector
# width None is the paper's per method and encoder: 256 (SimCLR), 512 (BYOL, SimSiam),
# 1024 -> 2048 for SimCLR on ResNet-50 (app. "ResNet-50 encoder").
_PAPER = 'CP-CFL, Sec. "Experimental settings"'
_WIDTH_GRID = {"projector_dim": (256, 512)}


def _simclr_width(encoder: str, dim: int) -> int:
    return 1024 if encoder == "resnet50" else 256


def _bn_width(encoder: str, dim: int) -> int:
    return 512


SSL_METHODS: dict[str, SSLMethod] = {
    m.name: m
    for m in (
        SSLMethod(
            "simclr",
            "SimCLR",
            "cpcfl_tf.pretraining.simclr",
            "Chen et al., ICML 2020",
            {
                "temperature": Setting(0.1, _PAPER, help="tau of NT-Xent"),
                "projector_dim": Setting(
                    None, _PAPER + ": 256", width, "projection head width", _simclr_width
                ),
            },
            grid=_WIDTH_GRID,
        ),
        SSLMethod(
            "byol",
            "BYOL",
            "cpcfl_tf.pretraining.byol",
            "Grill et al., NeurIPS 2020",
            {
                "target_decay": Setting(
                    0.9, _PAPER, rate, "beta: target = beta * target + (1 - beta) * online"
                ),
                "target_schedule": Setting(
                    "constant",
                    "the paper's constant beta; cosine: BYOL, Sec. 3.2",
                    one_of("constant", "cosine"),
                    "cosine: beta rises to 1 over the pre-training",
                ),
                "projector_dim": Setting(
                    None,
                    _PAPER + ": 512",
                    width,
                    "projection head width (the predictor's output)",
                    _bn_width,
                ),
                "predictor_dim": Setting(64, _PAPER, count, "predictor bottleneck"),
            },
            grid=_WIDTH_GRID,
        ),
        SSLMethod(
            "simsiam",
            "SimSiam",
            "cpcfl_tf.pretraining.simsiam",
            "Chen and He, CVPR 2021",
            {
                "projector_dim": Setting(
                    None,
                    _PAPER + ": 512 (as BYOL)",
                    width,
                    "projection head width (the predictor's output)",
                    _bn_width,
                ),
                "predictor_dim": Setting(64, _PAPER + " (as BYOL)", count, "predictor bottleneck"),
            },
            grid=_WIDTH_GRID,
        ),
        # Beyond the paper: VICReg (Bardes, Ponce and LeCun, ICLR 2022). lambda, mu, nu =
        # 25, 25, 1 and gamma = 1, epsilon = 1e-4 (its Sec. 4.3 and Eq. 1); the expander is
        # its shape (three Dense layers, BN + ReLU after the first two, Sec. 4.3: 8192 wide on
        # ResNet-50's 2048-d output) scaled to the encoder: 4 x the encoder's width.
        SSLMethod(
            "vicreg",
            "VICReg",
            "cpcfl_tf.pretraining.vicreg",
            "Bardes, Ponce and LeCun, ICLR 2022",
            {
                "sim_weight": Setting(
                    25.0, "VICReg, Sec. 4.3 (lambda)", non_negative, "weight of the invariance term"
                ),
                "var_weight": Setting(
                    25.0, "VICReg, Sec. 4.3 (mu)", non_negative, "weight of the variance term"
                ),
                "cov_weight": Setting(
                    1.0, "VICReg, Sec. 4.3 (nu)", non_negative, "weight of the covariance term"
                ),
                "gamma": Setting(1.0, "VICReg, Eq. 1", positive, "target standard deviation"),
                "epsilon": Setting(
                    1e-4, "VICReg, Eq. 1", positive, "added to the variance under the square root"
                ),
                "projector_dim": Setting(
                    None,
                    "VICReg, Sec. 4.3, scaled: 4 x the encoder's width",
                    width,
                    "expander width (all three layers)",
                    lambda encoder, dim: 4 * dim,
                ),
            },
            grid={"projector_dim": (1024, 2048)},
        ),
    )
}
SSL_METHODS.update(entries("cpcfl_tf.ssl_methods", SSLMethod, SSL_METHODS))
"""Every self-supervised method, by name: the kit's, then the installed plugins'
(:mod:`cpcfl_tf.plugins`)."""


def fraction(value) -> str | None:
    return None if _number(value) and 0 < value <= 1 else "a number in (0, 1]"


def count_or_none(value) -> str | None:
    return None if value is None else count(value)


def positive_or_none(value) -> str | None:
    return None if value is None else positive(value)


@dataclasses.dataclass(frozen=True)
class FederatedSSL(_HasSettings):
    """A way to pre-train a self-supervised method *federated*: on the clients' unlabeled
    images (``partition.unlabeled`` ``iid`` or ``groups``), the server seeing weights and
    image counts only. Its start is ``<name>-<method>`` (``fed-simclr``, ``fedema-byol``),
    a starting encoder like the server's pre-trainings, cached per seed."""

    name: str
    label: str
    """How tables name its starts: ``label + method label`` (``FedSimCLR``)."""
    module: str
    """The module that implements it: ``build(settings) -> FedAvgSSL`` (its stages)."""
    paper: str
    settings: dict[str, Setting]
    methods: tuple[str, ...] | None = None
    """The self-supervised methods it pre-trains (None: every one of the registry)."""
    why: str = ""
    """Why it takes only :attr:`methods`, said when another is asked for."""

    def takes(self, method: str) -> bool:
        return self.methods is None or method in self.methods

    def start(self, method: str) -> str:
        return f"{self.name}-{method}"

    def start_label(self, method: str) -> str:
        return self.label + SSL_METHODS[method].label


# The rounds of every federated pre-training; FedEMA adds its own settings to them.
_ROUNDS = {
    "rounds": Setting(
        None,
        "the kit's choice: none = pretrain.epochs / (local_epochs x "
        "participation), the server's passes over the images",
        count_or_none,
        "pre-training rounds",
    ),
    "local_epochs": Setting(
        1,
        "the kit's choice (FedEMA's code: 5, over 100 rounds); docs/choices.md",
        count,
        "E_p: local epochs per round",
    ),
    "participation": Setting(
        1.0,
        "FedEMA, Sec. 5.1: every client every round",
        fraction,
        "share of the clients sampled each round",
    ),
    "batch_size": Setting(
        128, "FedEMA's code (EasyFL fedssl, --batch_size 128)", count, "a client's batch"
    ),
}

FEDERATED_SSL: dict[str, FederatedSSL] = {
    f.name: f
    for f in (
        # FedAvg of the self-supervised model, the baseline of FedU (Zhuang et al., ICCV 2021)
        # and FedEMA: each sampled client trains the method's own step on its images from the
        # global online parts; the server averages them by image count (BYOL's target stays
        # on the client: EasyFL fedssl's FedBYOL; docs/choices.md).
        FederatedSSL(
            "fed",
            "Fed",
            "cpcfl_tf.pretraining.fedavg_ssl",
            "FedU, Zhuang et al., ICCV 2021; FedEMA, Zhuang et al., ICLR 2022",
            dict(_ROUNDS),
        ),
        # FedEMA ("Divergence-aware federated self-supervised learning", Zhuang et al., ICLR
        # 2022, Sec. 4): the client's online encoder, projector and predictor become
        # mu * its own + (1 - mu) * the global, mu = min(lambda * ||w_global - w_client||, 1),
        # lambda = tau / the client's first divergence (the auto-scaler, tau = 0.7).
        FederatedSSL(
            "fedema",
            "FedEMA-",
            "cpcfl_tf.pretraining.fedema",
            "Zhuang et al., ICLR 2022",
            {
                **_ROUNDS,
                "tau": Setting(
                    0.7,
                    "FedEMA, Sec. 5 (auto-scaler target tau)",
                    fraction,
                    "mu at a client's first moving average",
                ),
                "scaler": Setting(
                    None,
                    "FedEMA, Sec. 4: none = the auto-scaler tau / first divergence",
                    positive_or_none,
                    "lambda, fixed",
                ),
            },
            methods=("byol",),
            why="FedEMA moves BYOL's online network, whose target stays on the client "
            "(FedEMA, Sec. 4; its code runs it for BYOL)",
        ),
    )
}
FEDERATED_SSL.update(entries("cpcfl_tf.federated_ssl", FederatedSSL, FEDERATED_SSL))
"""Every federated pre-training, by name (the part of its start before the method): the
kit's, then the installed plugins'."""

FEDERATED_STARTS: dict[str, tuple[FederatedSSL, str]] = {
    f.start(m): (f, m) for f in FEDERATED_SSL.values() for m in SSL_METHODS if f.takes(m)
}
"""Every federated start (``fed-simclr``, ..., ``fedema-byol``): its pre-training and
method."""


def federated_start(name: str) -> tuple[FederatedSSL, str] | None:
    """``(federated pre-training, method)`` of a federated start, None for another start;
    a one-line error for a federated pre-training asked of a method it does not take."""
    if name in FEDERATED_STARTS:
        return FEDERATED_STARTS[name]
    algorithm, _, method = name.partition("-")
    if algorithm in FEDERATED_SSL and method in SSL_METHODS:
        entry = FEDERATED_SSL[algorithm]
        takes = ", ".join(entry.start(m) for m in entry.methods or ())
        raise UserError(f"{name}: {entry.why}; use {takes}, or fed-{method}")
    return None


def get_ssl_method(name: str) -> SSLMethod:
    """The :class:`SSLMethod` called ``name`` (one-line error naming the choices)."""
    try:
        return SSL_METHODS[name]
    except KeyError:
        raise UserError(
            f"unknown self-supervised method {name!r}; choose one of {', '.join(SSL_METHODS)}"
        ) from None


def check_options(options: dict[str, Any] | None) -> dict[str, dict[str, Any]] | None:
    """``pretrain.options`` checked and normalised: settings at their defaults and empty
    entries left out (None when nothing is left), so equal settings compare equal however
    they were spelled."""
    if options is None:
        return None
    if not isinstance(options, dict):
        raise UserError(
            "pretrain.options must map a method to its settings, e.g. "
            '{"byol": {"target_decay": 0.99}}'
        )
    kept: dict[str, dict[str, Any]] = {}
    for name, given in options.items():
        method = get_ssl_method_or_fed(name)
        if not isinstance(given, dict):
            raise UserError(
                f"pretrain.options {name} must be a JSON object of settings, got {given!r}"
            )
        method.check(given)
        changed = {k: v for k, v in given.items() if v != method.settings[k].default}
        if changed:
            kept[name] = dict(sorted(changed.items()))
    return dict(sorted(kept.items())) or None


def get_ssl_method_or_fed(name: str) -> SSLMethod | FederatedSSL:
    """The method ``name`` (an entry of ``pretrain.options``): a self-supervised method or
    a federated pre-training (one-line error naming both lists)."""
    if name in FEDERATED_SSL:
        return FEDERATED_SSL[name]
    if name not in SSL_METHODS:
        raise UserError(
            f"unknown method {name!r} in pretrain.options; choose one of "
            f"{', '.join([*SSL_METHODS, *FEDERATED_SSL])}"
        )
    return SSL_METHODS[name]
