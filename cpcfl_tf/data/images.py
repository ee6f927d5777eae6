"""The one preprocessing path every source goes through.

Images are stored as ``uint8`` at the encoder's input size (a quarter of the memory of
float32: STL-10's 100,000 unlabeled images are 2.8 GB this way) and become float32 in
``[0, 1]`` only at batch time, inside the compiled steps, via :func:`to_float`.
"""

from __future__ import annotations

import numpy as np

from cpcfl_tf.errors import UserError


def prepare_images(images: np.ndarray, size: int, *, chunk: int = 8192) -> np.ndarray:
    """Resize to ``size x size`` and repeat grayscale to 3 channels.

    Parameters
    ----------
    images
        ``uint8`` array ``(n, h, w)`` or ``(n, h, w, c)`` with ``c`` in ``{1, 3}``.
    size
        Output height and width (96 in the paper, 32 in the CPU presets).
    chunk
        Images resized per call, to bound the float32 memory used on the way.

    Returns
    -------
    numpy.ndarray
        ``uint8`` array ``(n, size, size, 3)``.
    """
    if size < 1:
        raise UserError(f"image size must be positive, got {size}")
    if images.ndim == 3:
        images = images[..., None]
    if images.ndim != 4 or images.shape[-1] not in (1, 3):
        raise UserError(f"expected images of shape (n, h, w, 1|3), got {images.shape}")
    channels = images.shape[-1]
    if images.shape[1:3] == (size, size):
        return np.ascontiguousarray(np.repeat(images, 3 // channels, axis=-1), dtype=np.uint8)
    import tensorflow as tf

    # Resize before repeating gray to RGB (3x less work); antialias only when shrinking.
    shrink = size < max(images.shape[1:3])
    out = np.empty((len(images), size, size, 3), np.uint8)
    for start in range(0, len(images), chunk):
        part = tf.image.resize(
            images[start : start + chunk], (size, size), method="bilinear", antialias=shrink
        )
        out[start : start + chunk] = np.clip(np.rint(part.numpy()), 0, 255).astype(np.uint8)
    return out


def to_float(batch):
    """``uint8`` batch -> ``float32`` in ``[0, 1]`` (a TF op, for use inside steps)."""
    import tensorflow as tf

    return tf.cast(batch, tf.float32) / 255.0
