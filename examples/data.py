"""Data shared by the samples: plain functions, NumPy only, nothing downloaded at run time.

Digits (for digit_canvas and mnist_cnn): scikit-learn's bundled `load_digits`, 1797 handwritten
8x8 images with values 0..16 (UCI optdigits test set, shipped inside the scikit-learn wheel).
`digits()` brings them to MNIST's format deterministically:

1. scale to [0, 1] (divide by 16);
2. bilinear upsample 8x8 -> 24x24 with half-pixel centres and edge clamping (the convention of
   PyTorch's `interpolate(mode="bilinear", align_corners=False)`), written as one [24, 8]
   interpolation matrix R applied on both sides: img24 = R @ img8 @ R.T;
3. zero-pad 2 px on every side -> 28x28, like MNIST's ~20x20 digit centred in a 28x28 frame.

The split is fixed: images 0..1436 train (1437), images 1437..1796 test (360). The images are
stored in writer order, so the test set is mostly held-out writers.
"""

from __future__ import annotations

import functools

import numpy as np

DIGITS_SIDE = 28
DIGITS_TRAIN = 1437


def bilinear_matrix(n_in: int, n_out: int) -> np.ndarray:
    """R [n_out, n_in] such that R @ v resamples v bilinearly (half-pixel centres, clamped edges)."""
    src = (np.arange(n_out) + 0.5) * (n_in / n_out) - 0.5
    src = np.clip(src, 0.0, n_in - 1)
    lo = np.floor(src).astype(np.int64)
    hi = np.minimum(lo + 1, n_in - 1)
    frac = src - lo
    r = np.zeros((n_out, n_in))
    np.add.at(r, (np.arange(n_out), lo), 1.0 - frac)
    np.add.at(r, (np.arange(n_out), hi), frac)
    return r


def resize_digits(images8: np.ndarray, inner: int = 24, pad: int = 2) -> np.ndarray:
    """f32[N, 28, 28] in [0, 1] from the 0..16 valued [N, 8, 8] images (steps 1-3 above)."""
    r = bilinear_matrix(images8.shape[-1], inner)
    up = np.einsum("oi,nij,pj->nop", r, images8 / 16.0, r)
    out = np.pad(up, ((0, 0), (pad, pad), (pad, pad)))
    return np.clip(out, 0.0, 1.0).astype(np.float32)


@functools.lru_cache(maxsize=1)
def _digits():
    from sklearn.datasets import load_digits

    d = load_digits()
    x = resize_digits(d.images)
    y = d.target.astype(np.int32)
    x.setflags(write=False)
    y.setflags(write=False)
    return x, y


def digits(split: str = "train"):
    """(images f32[N, 28, 28] in [0, 1], labels i32[N]) for split "train" (1437) or "test" (360)."""
    x, y = _digits()
    if split == "train":
        return x[:DIGITS_TRAIN], y[:DIGITS_TRAIN]
    if split == "test":
        return x[DIGITS_TRAIN:], y[DIGITS_TRAIN:]
    raise ValueError(f"split must be 'train' or 'test', got {split!r}")


def digit_batch(rng: np.random.Generator, size: int, split: str = "train"):
    """A random batch drawn without replacement: (images f32[size, 28, 28], labels i32[size])."""
    x, y = digits(split)
    pick = rng.choice(len(x), size, replace=False)
    return x[pick], y[pick]
