"""What a dataset is, with no disk or network touched: its static facts
(:class:`DatasetSpec`), a split's text (:class:`Split`), images with their labels
(:class:`LabeledImages`), and how every source finishes its images (:func:`finish`)."""

from __future__ import annotations

import dataclasses
import re
from typing import Literal

import numpy as np

from cpcfl_tf.errors import UserError


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    """Static facts about one dataset; nothing here touches the disk or the network."""

    name: str
    backend: Literal["tfds", "idx", "sklearn", "folder"]
    num_classes: int
    splits: dict[str, int]
    """Split name -> number of images."""
    unlabeled_splits: frozenset[str] = frozenset()
    """Splits that carry no labels (STL-10's ``unlabelled``, whose label is -1)."""
    tfds_name: str | None = None
    label_key: str = "label"
    transpose: bool = False
    """EMNIST is stored transposed in tfds; flip it back so digits read upright."""
    host: str | None = None
    """Download host, probed before tfds is allowed to fetch (its retries take minutes)."""
    files: dict[str, tuple[tuple[str, int], ...]] | None = None
    """A folder source's files: split -> ((path, class index), ...), in split order."""


_SPLIT = re.compile(r"^(?P<base>[a-z_]+)(\[(?P<start>-?\d*):(?P<stop>-?\d*)\])?$")


@dataclasses.dataclass(frozen=True)
class Split:
    """A parsed split such as ``train[50000:]``: a base split and a Python slice of it."""

    base: str
    start: int | None
    stop: int | None

    def indices(self, size: int) -> range:
        return range(size)[slice(self.start, self.stop)]

    def overlaps(self, other: Split, size: int | None) -> bool:
        """Whether the two select a common image (``size``: the base split's, if known;
        unknown sizes are judged on non-negative bounds alone, else assumed apart)."""
        if self.base != other.base:
            return False
        if size is not None:  # two step-1 ranges: they meet where the later start is first
            mine, theirs = self.indices(size), other.indices(size)
            return max(mine.start, theirs.start) < min(mine.stop, theirs.stop)
        bounds = (self.start, self.stop, other.start, other.stop)
        if any(b is not None and b < 0 for b in bounds):
            return False
        end = lambda stop: float("inf") if stop is None else stop  # noqa: E731
        return max(self.start or 0, other.start or 0) < min(end(self.stop), end(other.stop))

    def __str__(self) -> str:
        if self.start is None and self.stop is None:
            return self.base
        start, stop = ("" if end is None else end for end in (self.start, self.stop))
        return f"{self.base}[{start}:{stop}]"


def check_split_text(split: str) -> re.Match:
    """``split`` read as a split's text (no dataset is looked at)."""
    match = _SPLIT.match(split.strip()) if isinstance(split, str) else None
    if not match:
        raise UserError(f"cannot read split {split!r}; write it like 'train' or 'train[50000:]'")
    return match


@dataclasses.dataclass(frozen=True)
class LabeledImages:
    """Images with their labels, as the clients and linear evaluation see them."""

    images: np.ndarray
    """``uint8`` array ``(n, h, w, c)``."""
    labels: np.ndarray
    """``int64`` array ``(n,)`` with values in ``[0, num_classes)``."""
    num_classes: int
    source: str
    """``dataset:split``, for logs and result files."""

    def __len__(self) -> int:
        return len(self.labels)


def finish(images: np.ndarray, spec: DatasetSpec, image_size: int | None) -> np.ndarray:
    """``images`` as every source hands them out: ``uint8 (n, h, w, c)``, upright, and
    resized to ``image_size`` (grayscale to RGB) when it is set."""
    if images.ndim == 3:
        images = images[..., None]
    if spec.transpose:
        images = images.transpose(0, 2, 1, 3)
    images = np.ascontiguousarray(images, dtype=np.uint8)
    if image_size is None:
        return images
    from cpcfl_tf.data.images import prepare_images  # TF import only when resizing

    return prepare_images(images, image_size)
