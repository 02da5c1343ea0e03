"""Image columns: decode JPEG/PNG bytes in the workers, then crop, flip and normalise in Numba.

Decoder: ``simplejpeg`` (libjpeg-turbo, ~4x Pillow on 64x64 JPEGs here, see
bench/loader_bench.py) for JPEG when it is installed, decoding straight into the batch buffer
when no resize is needed; Pillow for PNG and as the fallback.

Randomness: each sample's crop box and flip are a pure function of ``derive_seed(fingerprint,
seed, epoch, salt)`` and the sample's global id (a SplitMix64 hash inside the kernel), so an
augmented batch is bit-identical across runs, worker counts and resumes.

Layout: images are channels-last, ``[B, H, W, 3]`` (``uint8``, or ``float32`` scaled to [0, 1]
and normalised with ``(x - mean) / std`` when ``normalize`` is given).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

import numpy as np

from stoker.loader.jit.kernel import kernel
from stoker.loader.order.seed import derive_seed

__all__ = ["ImageOptions", "decode_into", "decoder_name", "image_keys"]

_SALT = 0x1A6E  # separates augmentation draws from the order's draws


@dataclass(frozen=True, slots=True)
class ImageOptions:
    """How to turn a binary image column into a ``[B, H, W, 3]`` tensor.

    Attributes:
        column: the binary column holding JPEG or PNG bytes.
        size: output ``(height, width)``.
        crop: random-resized-crop area range ``(min, max)`` as fractions of the image (e.g.
            ``(0.08, 1.0)``); ``None`` resizes the whole image.
        ratio: aspect-ratio range of the crop box.
        flip: random horizontal flip with probability 1/2.
        normalize: ``None``, or ``(mean, std)`` per channel (for images scaled to [0, 1]);
            needs ``output="float32"``.
        output: ``"uint8"`` or ``"float32"`` (scaled to [0, 1]).
    """

    column: str
    size: tuple[int, int] = (224, 224)
    crop: tuple[float, float] | None = None
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: bool = False
    normalize: tuple[tuple[float, float, float], tuple[float, float, float]] | None = None
    output: str = "uint8"

    def __post_init__(self) -> None:
        if not isinstance(self.column, str) or not self.column:
            raise ValueError(f"ImageOptions.column={self.column!r} must name a binary column")
        if len(self.size) != 2 or any(not isinstance(s, int) or s < 1 for s in self.size):
            raise ValueError(f"ImageOptions.size={self.size!r} must be (height, width), "
                             "two positive ints, e.g. (64, 64)")
        if self.crop is not None and not (len(self.crop) == 2 and
                                          0 < self.crop[0] <= self.crop[1] <= 1):
            raise ValueError(f"ImageOptions.crop={self.crop!r} must be None or (min, max) area "
                             "fractions with 0 < min <= max <= 1, e.g. (0.08, 1.0)")
        if not (len(self.ratio) == 2 and 0 < self.ratio[0] <= self.ratio[1]):
            raise ValueError(f"ImageOptions.ratio={self.ratio!r} must be (min, max) with "
                             "0 < min <= max, e.g. (0.75, 1.333)")
        if self.output not in ("uint8", "float32"):
            raise ValueError(f"ImageOptions.output={self.output!r} must be 'uint8' or 'float32'")
        if self.normalize is not None:
            if self.output != "float32":
                raise ValueError("ImageOptions.normalize needs output='float32' (normalised "
                                 "values are not integers); pass output='float32'.")
            mean, std = self.normalize
            if len(mean) != 3 or len(std) != 3 or any(s <= 0 for s in std):
                raise ValueError(f"ImageOptions.normalize={self.normalize!r} must be "
                                 "((m, m, m), (s, s, s)) with every s > 0")

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.uint8 if self.output == "uint8" else np.float32)

    @property
    def identity(self) -> bool:
        """No augmentation and no conversion: decoded pixels are the output."""
        return self.crop is None and not self.flip and self.output == "uint8"


def decoder_name() -> str:
    """The JPEG decoder in use: ``"simplejpeg"`` when installed, else ``"pillow"``."""
    try:
        import simplejpeg  # noqa: F401
    except ImportError:
        return "pillow"
    return "simplejpeg"


def _decode(data: Any, out: np.ndarray | None) -> np.ndarray:
    """RGB pixels of one JPEG/PNG; into ``out`` when given and the size fits."""
    raw = memoryview(data)
    if raw[:2] == b"\xff\xd8" and _SIMPLEJPEG is not None:
        if out is not None:
            h, w = _SIMPLEJPEG.decode_jpeg_header(raw)[:2]
            if (h, w) == out.shape[:2]:
                return _SIMPLEJPEG.decode_jpeg(raw, colorspace="RGB", buffer=out)
        return _SIMPLEJPEG.decode_jpeg(raw, colorspace="RGB")
    from PIL import Image

    with Image.open(io.BytesIO(raw)) as im:
        return np.asarray(im.convert("RGB"))


try:
    import simplejpeg as _SIMPLEJPEG
except ImportError:  # Pillow fallback
    _SIMPLEJPEG = None


@kernel
def _mix(x):  # type: ignore[no-untyped-def]
    """SplitMix64 finaliser: a well-mixed 64-bit value from a 64-bit input."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@kernel
def _unit(key, sample, draw):  # type: ignore[no-untyped-def]
    """A float in [0, 1) that depends only on (key, sample id, draw number)."""
    h = _mix(key ^ _mix(np.uint64(sample) * np.uint64(4) + np.uint64(draw)))
    return np.float64(h >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@kernel
def crop_box(key, sample, h, w, smin, smax, rmin, rmax):  # type: ignore[no-untyped-def]
    """(y0, x0, ch, cw) of a random-resized crop (torchvision's rule, 10 tries then centre)."""
    area = h * w
    for t in range(10):
        target = area * (smin + (smax - smin) * _unit(key, sample, 2 * t))
        logr = np.log(rmin) + (np.log(rmax) - np.log(rmin)) * _unit(key, sample, 2 * t + 1)
        ratio = np.exp(logr)
        cw = int(np.round(np.sqrt(target * ratio)))
        ch = int(np.round(np.sqrt(target / ratio)))
        if 0 < cw <= w and 0 < ch <= h:
            y0 = int(_unit(key, sample, 40 + t) * (h - ch + 1))
            x0 = int(_unit(key, sample, 60 + t) * (w - cw + 1))
            return y0, x0, ch, cw
    side = min(h, w)
    return (h - side) // 2, (w - side) // 2, side, side


@kernel
def resample(src, y0, x0, ch, cw, flip, scale, mean, std, rnd, out):  # type: ignore[no-untyped-def]
    """Bilinear resize of ``src[y0:y0+ch, x0:x0+cw]`` into ``out`` (``[H, W, 3]``), flipped
    horizontally if ``flip``, multiplied by ``scale`` then ``(x - mean) / std`` per channel
    (rounded and clamped to 0..255 when ``rnd``, for ``uint8`` outputs)."""
    oh, ow = out.shape[0], out.shape[1]
    sy = ch / oh
    sx = cw / ow
    for y in range(oh):
        fy = (y + 0.5) * sy - 0.5
        fy = min(max(fy, 0.0), ch - 1.0)
        iy = int(fy)
        iy1 = min(iy + 1, ch - 1)
        wy = fy - iy
        for x in range(ow):
            xx = ow - 1 - x if flip else x
            fx = (xx + 0.5) * sx - 0.5
            fx = min(max(fx, 0.0), cw - 1.0)
            ix = int(fx)
            ix1 = min(ix + 1, cw - 1)
            wx = fx - ix
            for c in range(3):
                a = src[y0 + iy, x0 + ix, c] * (1 - wx) + src[y0 + iy, x0 + ix1, c] * wx
                b = src[y0 + iy1, x0 + ix, c] * (1 - wx) + src[y0 + iy1, x0 + ix1, c] * wx
                v = (a * (1 - wy) + b * wy) * scale
                v = (v - mean[c]) / std[c]
                if rnd:
                    out[y, x, c] = min(max(int(v + 0.5), 0), 255)
                else:
                    out[y, x, c] = v


def image_keys(options: ImageOptions) -> tuple[str, ...]:
    """Names of the batch entries the image output adds (the column itself)."""
    return (options.column,)


def decode_into(options: ImageOptions, offsets: np.ndarray, data: np.ndarray, ids: np.ndarray,
                out: np.ndarray, fingerprint: str, seed: int, epoch: int) -> None:
    """Decode and augment every image of a batch into ``out`` (``[B, H, W, 3]``).

    Args:
        options: the image options.
        offsets, data: the batch's encoded images (``data[offsets[i]:offsets[i + 1]]``).
        ids: global sample ids (the augmentation's per-sample key).
        out: the output batch buffer.
        fingerprint, seed, epoch: with ``ids``, all the augmentation depends on.
    """
    if options.identity and _SIMPLEJPEG is not None:
        _decode_identity(options, offsets, data, ids, out)
        return
    key = np.uint64(derive_seed(fingerprint, seed, epoch, _SALT))
    float_out = options.output == "float32"
    scale = 1.0 / 255.0 if float_out else 1.0
    mean = np.zeros(3) if options.normalize is None else np.asarray(options.normalize[0], float)
    std = np.ones(3) if options.normalize is None else np.asarray(options.normalize[1], float)
    smin, smax = options.crop or (1.0, 1.0)
    rmin, rmax = options.ratio
    for i in range(len(ids)):
        blob = data[offsets[i]:offsets[i + 1]]
        if len(blob) == 0:
            raise ValueError(f"sample {int(ids[i])}: column {options.column!r} is empty or "
                             "null; every sample needs an encoded image")
        if options.identity:
            img = _decode(blob, out[i])
            if img.shape == out.shape[1:]:
                if img.ctypes.data != out[i].ctypes.data:
                    out[i] = img
                continue
        else:
            img = _decode(blob, None)
        h, w = img.shape[:2]
        if options.crop is not None:
            y0, x0, ch, cw = crop_box(key, np.int64(ids[i]), h, w, smin, smax, rmin, rmax)
        else:
            y0, x0, ch, cw = 0, 0, h, w
        flip = bool(options.flip and _unit(key, np.int64(ids[i]), 99) < 0.5)
        resample(np.ascontiguousarray(img), y0, x0, ch, cw, flip, scale, mean, std,
                 not float_out, out[i])


def _decode_identity(options: ImageOptions, offsets: np.ndarray, data: np.ndarray,
                     ids: np.ndarray, out: np.ndarray) -> None:
    """:func:`decode_into` without augmentation: JPEGs of the output's size decode straight
    into ``out[i]`` (the same simplejpeg call as :func:`_decode`, so the same pixels). The
    decode releases the GIL; the Python around it is kept to a few operations per image, so
    thread workers decode in parallel (it was ~1/3 of an image's time: bench/RESULTS.md)."""
    jpeg = _SIMPLEJPEG
    assert jpeg is not None  # noqa: S101 - the caller checked
    raw = memoryview(data)
    bounds = offsets.tolist()
    shape = out.shape[1:]
    for i in range(len(bounds) - 1):
        blob = raw[bounds[i]:bounds[i + 1]]
        if len(blob) >= 2 and blob[0] == 0xFF and blob[1] == 0xD8:
            # no header parse first (~2 us of a ~30 us image): an image of another size
            # decodes into part of out[i] or does not fit it; either way it is decoded
            # again below and resampled over out[i]
            try:
                if jpeg.decode_jpeg(blob, colorspace="RGB", buffer=out[i]).shape == shape:
                    continue
            except ValueError:  # larger than the output, or not decodable: said below
                pass
        if len(blob) == 0:
            raise ValueError(f"sample {int(ids[i])}: column {options.column!r} is empty or "
                             "null; every sample needs an encoded image")
        img = _decode(blob, None)  # another size or format
        if img.shape == out.shape[1:]:
            out[i] = img
            continue
        h, w = img.shape[:2]
        resample(np.ascontiguousarray(img), 0, 0, h, w, False, 1.0, np.zeros(3), np.ones(3),
                 True, out[i])
