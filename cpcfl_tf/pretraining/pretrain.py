"""Contrastive pre-training of the encoder on the server (Algorithm "Contrastive encoder
pre-training"): build the method's model once, run its compiled ``train_step`` over
shuffled batches of unlabeled images, checkpoint every epoch, save the encoder alone.

Output folder of one pre-training::

    checkpoint.npz       all variables + optimizer state + history (while unfinished)
    encoder.keras        the encoder as a Keras model (theta_f only)
    encoder.weights.h5   its weights
    pretrain.json        config, seed, data shape and per-epoch history
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from cpcfl_tf.compat import ADDED_SETTINGS, KEYED_DEFAULTS, pretrain_settings
from cpcfl_tf.data.augment import build_augmenter
from cpcfl_tf.errors import DivergedError, UserError
from cpcfl_tf.methods.ssl import SSLMethod
from cpcfl_tf.models import ENCODER_DIMS, build_encoder
from cpcfl_tf.models.seeding import seeded
from cpcfl_tf.plan.sections import DataConfig, PretrainConfig
from cpcfl_tf.pretraining.model import ContrastiveModel, Parts
from cpcfl_tf.records.files import (
    CACHE_FIX,
    building,
    cache_root,
    prepare_out_dir,
    read_cache_entry,
    write_atomic,
    write_json,
)


@dataclasses.dataclass
class PretrainResult:
    encoder: keras.Model
    history: list[dict]
    out_dir: Path


def build_contrastive_model(
    config: PretrainConfig,
    input_shape: tuple[int, int, int],
    *,
    method: SSLMethod,
    seed: int = 0,
    steps_per_epoch: int = 1,
) -> ContrastiveModel:
    """``method``'s ``keras.Model`` (an entry of :data:`~cpcfl_tf.methods.ssl.SSL_METHODS`)
    with its settings from ``config``, compiled with Adam and its optimizer built.

    ``steps_per_epoch`` sizes the schedules that run over the whole pre-training (the
    learning rate's, BYOL's target rate's). ``config.precision`` is the dtype policy of
    the layers built here only; the global policy is restored afterwards.
    """
    settings = config.settings(method)
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(config.precision)
    try:
        with seeded(seed):
            encoder = build_encoder(config.encoder, input_shape)
            parts = Parts(
                encoder,
                build_augmenter(config.augment, seed=seed),
                config.encoder,
                ENCODER_DIMS[config.encoder],
                lambda name: build_encoder(config.encoder, input_shape, model_name=name),
                total_steps=config.epochs * steps_per_epoch,
            )
            model = method.build(parts, settings)
            optimizer = keras.optimizers.Adam(learning_rate(config, steps_per_epoch))
            if config.precision == "mixed_float16":
                optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
            model.compile(optimizer=optimizer)
            model.optimizer.build(model.online_variables)
            return model
    finally:
        keras.config.set_dtype_policy(previous)


def learning_rate(config: PretrainConfig, steps_per_epoch: int):
    """The optimizer's learning rate: ``config.learning_rate``, or with ``lr_schedule``
    ``cosine`` Keras' ``CosineDecay`` from 0 over ``warmup_epochs`` of linear warm-up to
    it, then down to 0 at the last step."""
    if config.lr_schedule == "constant":
        return config.learning_rate
    warmup = config.warmup_epochs * steps_per_epoch
    return keras.optimizers.schedules.CosineDecay(
        0.0 if warmup else config.learning_rate,
        decay_steps=max(1, config.epochs * steps_per_epoch - warmup),
        warmup_target=config.learning_rate if warmup else None,
        warmup_steps=warmup,
    )


def _state(model: ContrastiveModel) -> list:
    return list(model.variables) + list(model.optimizer.variables)


def _save_checkpoint(
    path: Path, model: ContrastiveModel, epoch: int, meta: dict, history: list[dict]
) -> None:
    arrays = {f"v{i}": v.numpy() for i, v in enumerate(_state(model))}
    record = json.dumps({"epoch": epoch, "meta": meta, "history": history})

    def save(tmp: str) -> None:
        with open(tmp, "wb") as fh:
            np.savez(fh, __record__=np.array(record), **arrays)

    write_atomic(path, save)


def _load_checkpoint(path: Path, model: ContrastiveModel, meta: dict) -> tuple[int, list[dict]]:
    def load(p: Path):
        with np.load(p) as data:
            record = json.loads(str(data["__record__"]))
            return record, [data[f"v{i}"] for i in range(len(data.files) - 1)]

    # Part of a cache entry: damage means redoing it, not stopping.
    loaded = read_cache_entry(path, load, rebuild="starting this pre-training over")
    if loaded is None:
        path.unlink()
        return 0, []
    record, arrays = loaded
    if record["meta"] != meta:
        raise _foreign(path)
    state = _state(model)
    if len(arrays) != len(state) or any(a.shape != tuple(v.shape) for a, v in zip(arrays, state)):
        raise UserError(f"checkpoint {path} does not fit this model; delete it to start over")
    for variable, value in zip(state, arrays):
        variable.assign(value)
    return record["epoch"], record["history"]


def _foreign(path: Path) -> UserError:
    return UserError(
        f"{path} belongs to a different pre-training (config, seed or data "
        "differ); delete it to start this one over"
    )


def _check_checkpoint(path: Path, meta: dict) -> None:
    """Refuse a checkpoint of another pre-training before any image is read: ``meta``
    without ``images`` (the data shape, not known yet) must match its own."""

    def load(p: Path) -> dict:
        with np.load(p) as data:
            return json.loads(str(data["__record__"]))["meta"]

    found = read_cache_entry(path, load, rebuild="starting this pre-training over")
    if found is None:
        path.unlink()  # damaged: said once, redone
    elif {k: found.get(k) for k in meta} != meta:
        raise _foreign(path)


def _finished(out: Path, meta: dict) -> PretrainResult | None:
    """The finished pre-training in ``out``, if there is one and it is readable. ``meta``
    without ``images`` (the data shape) matches any shape: the folder's key names the data
    source already, so a cached encoder is loaded without reading any image."""
    summary_path, encoder_path = out / "pretrain.json", out / "encoder.keras"
    if not (summary_path.exists() and encoder_path.exists()):
        return None
    again = "pre-training it again"
    summary = read_cache_entry(summary_path, _read_summary, rebuild=again)
    if summary is not None and {k: summary["meta"].get(k) for k in meta} != meta:
        raise UserError(f"{out} holds a different finished pre-training; use another folder")
    encoder = (
        None
        if summary is None
        else read_cache_entry(encoder_path, keras.models.load_model, rebuild=again)
    )
    if encoder is not None and summary is not None:
        (out / "checkpoint.npz").unlink(missing_ok=True)  # a kill after the summary
        return PretrainResult(encoder, summary["history"], out)
    for stale in (summary_path, encoder_path, out / "encoder.weights.h5"):  # rebuild it
        stale.unlink(missing_ok=True)
    return None


def _read_summary(path: Path) -> dict:
    summary = json.loads(path.read_text())
    return {"meta": summary["meta"], "history": summary["history"]}


DISTRIBUTIONS = ("default", "mirrored")
"""How pre-training is spread over devices (``--distribute``)."""


def make_strategy(name: str = "default") -> tf.distribute.Strategy | None:
    """The ``tf.distribute`` strategy of ``--distribute name``: ``None`` (one device) or a
    ``MirroredStrategy`` over every GPU, or over every logical CPU device when there is no
    GPU (how the tests run it)."""
    if name not in DISTRIBUTIONS:
        raise UserError(f"unknown --distribute {name!r}; choose one of {', '.join(DISTRIBUTIONS)}")
    if name == "default":
        return None
    devices = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("CPU")
    return tf.distribute.MirroredStrategy(devices=[d.name for d in devices])


def pretrain(
    config: PretrainConfig,
    images: np.ndarray,
    out_dir: str | Path,
    *,
    method: SSLMethod,
    seed: int = 0,
    verbose: int = 1,
    distribute: str = "default",
    on_epoch: Callable[[int, dict], None] | None = None,
    monitor=None,
) -> PretrainResult:
    """Pre-train ``config.encoder`` with ``method`` on unlabeled ``images``.

    Parameters
    ----------
    config
        Encoder and optimisation settings.
    method
        A self-supervised method (an entry of :data:`~cpcfl_tf.methods.ssl.SSL_METHODS`).
    images
        ``uint8 (n, h, w, 3)`` unlabeled images (:func:`cpcfl_tf.data.load_unlabeled`).
    out_dir
        Folder of this pre-training. A finished one is loaded instead of trained again;
        an unfinished one (``checkpoint.npz``) resumes from its last finished epoch.
    seed
        Seeds initialisation, augmentation and the order of batches (per epoch, so a
        resumed run sees the same batches as an uninterrupted one).
    verbose
        1: a progress bar per epoch; 0: silent.
    distribute
        ``default`` (one device) or ``mirrored`` (:func:`make_strategy`): the global
        batch is split over the replicas; the step equals the single-device one, so the
        cache key ignores it.
    on_epoch
        Called after every epoch this call trains with the epoch (1-based) and its
        history entry (loss, embedding_std, seconds, knn_accuracy when measured).
    monitor
        A :class:`~cpcfl_tf.pretraining.knn.KnnMonitor`: the encoder's kNN accuracy on
        its labeled proxy after the epochs it is due, in the history and on the progress
        line. It reads the encoder only (inference mode), so the encoder's bits are the
        same with or without it; not part of any key.
    """
    out = prepare_out_dir(out_dir)
    strategy = make_strategy(distribute)
    if images.ndim != 4 or images.dtype != np.uint8:
        raise UserError(
            f"pre-training needs uint8 images (n, h, w, c), got {images.dtype} {images.shape}"
        )
    batch_size = min(config.batch_size, len(images))
    meta = {
        "config": identity(config, method.name),
        "seed": seed,
        "images": [int(n) for n in images.shape],
    }
    summary_path, encoder_path = out / "pretrain.json", out / "encoder.keras"
    finished = _finished(out, meta)
    if finished is not None:
        return finished

    if strategy:
        replicas = strategy.num_replicas_in_sync
        if batch_size % replicas:
            raise UserError(
                f"pretrain.batch_size {batch_size} does not split over {replicas} "
                f"replicas; use a multiple of {replicas}"
            )
        if config.jit_compile:
            raise UserError("pretrain.jit_compile is not supported with --distribute mirrored")
    steps = len(images) // batch_size  # drop the last partial batch: NT-Xent wants full ones
    with strategy.scope() if strategy else contextlib.nullcontext():
        model = build_contrastive_model(
            config, images.shape[1:], method=method, seed=seed, steps_per_epoch=steps
        )
    checkpoint = out / "checkpoint.npz"
    start, history = _load_checkpoint(checkpoint, model, meta) if checkpoint.exists() else (0, [])
    step = model.make_mirrored_step(strategy) if strategy else model.make_step(config.jit_compile)
    for epoch in range(start, config.epochs):
        order = np.random.default_rng([seed, epoch]).permutation(len(images))
        # Batches are cut in this thread: a tf.data pipeline's background threads compete
        # with the compute threads, and on a 2-core machine every other epoch then took
        # twice as long (41 s instead of 22 s for 50,000 Fashion-MNIST images).
        batches = (
            tf.constant(images[order[i * batch_size : (i + 1) * batch_size]]) for i in range(steps)
        )
        for metric in model.metrics:
            metric.reset_state()
        # A live bar on a terminal; in logs (not a tty) one line per epoch instead.
        live = verbose and sys.stdout.isatty()
        bar = keras.utils.Progbar(
            steps,
            verbose=1 if live else 0,
            unit_name="batch",
            stateful_metrics=["loss", "embedding_std"],
        )
        if live:
            print(f"{method.name} epoch {epoch + 1}/{config.epochs}")
        started = time.perf_counter()
        for i, batch in enumerate(batches):
            logs = {k: float(v) for k, v in step(batch).items()}
            if not np.isfinite(logs["loss"]):
                kept = (
                    f"the checkpoint of epoch {epoch} stays in {out}"
                    if epoch
                    else "no epoch had finished"
                )
                raise DivergedError(
                    f"{method.name} loss became {logs['loss']} in epoch {epoch + 1}, batch "
                    f"{i + 1}; lower pretrain.learning_rate (now {config.learning_rate}); {kept}"
                )
            bar.update(i + 1, list(logs.items()))
        history.append(
            {"epoch": epoch + 1, **logs, "seconds": round(time.perf_counter() - started, 3)}
        )
        if monitor is not None and monitor.due(epoch + 1, config.epochs):
            history[-1]["knn_accuracy"] = monitor.accuracy(model.encoder)
        knn = (
            f", kNN accuracy {history[-1]['knn_accuracy']:.4f}"
            if "knn_accuracy" in history[-1]
            else ""
        )
        if verbose and not live:
            print(
                f"{method.name} epoch {epoch + 1}/{config.epochs}: loss {logs['loss']:.4f}, "
                f"embedding_std {logs['embedding_std']:.4f}{knn}, "
                f"{history[-1]['seconds']:.1f} s",
                flush=True,
            )
        elif verbose and knn:
            print(knn[2:], flush=True)
        _save_checkpoint(checkpoint, model, epoch + 1, meta, history)
        if on_epoch:
            on_epoch(epoch + 1, history[-1])

    encoder = model.encoder
    write_atomic(encoder_path, encoder.save)
    write_atomic(out / "encoder.weights.h5", encoder.save_weights)
    write_json(summary_path, {"meta": meta, "history": history})
    checkpoint.unlink(missing_ok=True)
    return PretrainResult(encoder, history, out)


def identity(config: PretrainConfig, method: str) -> dict:
    """What a pre-training is, as recorded with it: the method, then ``config``'s fields
    with ``method``'s settings (the layout the cache has always used, so earlier cache
    entries stay valid; other methods' settings, fields and settings added since at their
    defaults and the seed, named apart, left out: :func:`cpcfl_tf.compat.pretrain_settings`)."""
    return {"method": method, **keyed_settings(config, method)}


def keyed_settings(config: PretrainConfig, method: str) -> dict:
    """``config`` as keys name a pre-training of ``method``: its fields, with ``method``'s
    options naming each of its settings whose value differs from the one its cache keys
    assume (:data:`cpcfl_tf.compat.KEYED_DEFAULTS` and
    :data:`~cpcfl_tf.compat.ADDED_SETTINGS`; every setting, for a method not listed).
    With the registry's defaults as the keys assume them these are ``config``'s own
    options; a default changed in the registry is then named, so the key changes with
    it."""
    assumed = KEYED_DEFAULTS.get(method)
    if assumed is not None:
        assumed = {**assumed, **ADDED_SETTINGS.get(method, {})}
    named = {
        k: v
        for k, v in config.settings(method).items()
        if assumed is None or k not in assumed or v != assumed[k]
    }
    options = {m: v for m, v in (config.options or {}).items() if m != method}
    if named:
        options[method] = named
    return pretrain_settings({**dataclasses.asdict(config), "options": options or None}, method)


SUPERVISED = "supervised"
"""The supervised pre-training's name in its cache folder's."""


def pretrain_key(config: PretrainConfig, name: str, **identity_) -> str:
    """Folder name of a pre-training: ``name`` (a self-supervised method's, or
    :data:`SUPERVISED`), encoder and a hash of the settings and of ``identity_`` (what else
    shapes it: the data, the seed)."""
    settings = (
        pretrain_settings(dataclasses.asdict(config))
        if name == SUPERVISED
        else identity(config, name)
    )
    text = json.dumps({"config": settings, **identity_}, sort_keys=True)
    digest = hashlib.sha1(text.encode()).hexdigest()[:10]
    return f"{name}-{config.encoder}-{digest}"


def image_source(data: DataConfig) -> dict:
    """The server's pre-training images, as cache keys name them."""
    return {
        "dataset": data.pretrain_dataset,
        "split": data.pretrain_split,
        "image_size": data.image_size,
    }


def pretrain_folder(
    config: PretrainConfig, data: DataConfig, method: SSLMethod | None, seed: int
) -> Path:
    """The cache folder of the server's pre-training with ``method`` (a self-supervised
    method; None: the supervised one) of ``config`` on ``data``'s pre-training images
    with ``seed``."""
    name = SUPERVISED if method is None else method.name
    return (
        cache_root() / "pretrained" / pretrain_key(config, name, data=image_source(data), seed=seed)
    )


def pretrained_encoder(
    config: PretrainConfig,
    data: DataConfig,
    *,
    method: SSLMethod,
    seed: int = 0,
    verbose: int = 1,
    distribute: str = "default",
    images: np.ndarray | Callable[[], np.ndarray] | None = None,
    on_epoch: Callable[[int, dict], None] | None = None,
    monitor=None,
) -> PretrainResult:
    """Pre-train with ``method`` (a self-supervised method) on ``data``'s unlabeled source,
    or load the cached result of an earlier identical pre-training (any script, any run);
    an interrupted one resumes.

    ``images`` are that source's images, or a function that loads them (called only when
    there is something to train); by default :func:`load_pretrain_images`. A cached
    encoder is loaded without reading any image. ``monitor``: as for :func:`pretrain`, or
    a function that makes it (called only when there is something to train).
    """
    out = pretrain_folder(config, data, method, seed)
    meta = {"config": identity(config, method.name), "seed": seed}
    cached = _finished(out, meta)
    if cached is not None:
        return cached
    if callable(monitor):  # a proxy without labels is refused before the cache is touched
        monitor = monitor()
    # The cache is checked before the images are read: it may be at fault.
    with building_entry(out, meta, verbose) as cached:
        if cached is not None:  # made by another process while this one waited
            return cached
        if verbose:
            print(
                f"pre-training {method.name} ({config.encoder}) on {data.pretrain_dataset}:"
                f"{data.pretrain_split} -> {out}"
            )
        if images is None:
            images = load_pretrain_images(data)
        elif callable(images):
            images = images()
        return pretrain(
            config,
            images,
            out,
            method=method,
            seed=seed,
            verbose=verbose,
            distribute=distribute,
            on_epoch=on_epoch,
            monitor=monitor,
        )


@contextlib.contextmanager
def building_entry(out: Path, meta: dict, verbose: int):
    """Hold the cache entry ``out`` of the pre-training ``meta`` describes for building
    (:func:`~cpcfl_tf.records.files.building`, after checking that the cache can be written);
    the block gets the finished pre-training another process made there while this one
    waited, or None: then the block builds it, resuming its checkpoint if it has one."""
    prepare_out_dir(out, fix=CACHE_FIX)
    with building(out, say=print if verbose else None):
        cached = _finished(out, meta)
        if cached is None and (out / "checkpoint.npz").exists():
            _check_checkpoint(out / "checkpoint.npz", meta)
        yield cached


def load_pretrain_images(data: DataConfig) -> np.ndarray:
    """The unlabeled pre-training images ``data`` names (labels are never read)."""
    from cpcfl_tf.data import load_unlabeled

    return load_unlabeled(
        data.pretrain_dataset,
        data.pretrain_split,
        image_size=data.image_size,
        data_dir=data.data_dir,
        manual_dir=data.manual_dir,
    )
