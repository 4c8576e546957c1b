"""Image decoders for ``images(decoder=...)``: encoded bytes to the pixels Pillow would give.

Every decoder gives what ``zephon.ops.images`` resizes: a uint8 array, ``H x W`` (grey) or
``H x W x 3`` (RGB), as stored (the EXIF turn comes after). A JPEG is decoded at the scale Pillow's
draft mode picks (1/2, 1/4 or 1/8 in the IDCT, the largest that keeps both sides at least
``size``), so every decoder resizes the same number of pixels. Each library reads the formats and
colour modes listed in ``FORMATS``; anything else (a CMYK JPEG, a 16-bit grey PNG, WebP, GIF ...)
is decoded by Pillow, the reference, and so is anything the library fails on, so that a bad image
raises the same error with every decoder.

- ``pillow``: the reference.
- ``opencv`` (``pip install opencv-python-headless``): JPEG (``IMREAD_REDUCED_*``) and PNG.
- ``simplejpeg`` (``pip install simplejpeg``): JPEG (``min_width``/``min_height``).
- ``turbojpeg`` (``pip install PyTurboJPEG``, and libjpeg-turbo's ``libturbojpeg`` shared
  library: PyTurboJPEG 2 needs libjpeg-turbo 3): JPEG (``scaling_factor``).
- ``spng`` (``pip install pyspng``, libspng): PNG that is not interlaced, in every mode Pillow
  turns into grey or RGB as the images step does (1-, 2-, 4-, 8- and 16-bit channels, palettes,
  alpha dropped); not 16-bit grey, which Pillow clips otherwise. JPEG and the rest: Pillow.
- ``imagecodecs`` (``pip install imagecodecs``): libspng again, through imagecodecs, which lets
  go of the GIL while it decodes (pyspng holds it): PNG that is not interlaced, grey of 2 to 8
  bits, palettes, 8-bit RGB and RGBA; the rest (1-bit, grey with alpha, 16-bit) Pillow. JPEG:
  Pillow.

Measured on the benchmark's photographs (``benchmarks/vlm.py``, its decoder table): each gives
Pillow's very pixels (JPEG at every draft scale, PNG grey, RGB and RGBA). On JPEG none gains much:
Pillow already decodes it with libjpeg-turbo and its DCT scaling. libspng decodes the PNG
photographs in two thirds of Pillow's time (2.6 against 3.3-3.9 ms an image), OpenCV a little
faster than Pillow; with ``resizer="torch"`` their pixels go to the resize without a Pillow image,
so the whole step takes 3.6-3.7 ms an image with libspng, 3.7-3.9 with OpenCV, 4.1-4.6 with
Pillow (two runs of the table). pyspng
holds the GIL while it decodes, so several thread workers take turns with it; imagecodecs' libspng
(3.5 ms an image through the step with torch resizing, as pyspng) lets go of it, and so does
OpenCV. Figure 3 (``benchmarks/results/vlm.md``), two thread workers, torch resizing, 2M tokens:
89.3-91.3k image-text tokens/s with imagecodecs, 1.35x Grain's fastest layout (pyspng: 57.8k in
the run before); side by side, three interleaved runs, 89.4-93.9k against OpenCV's 87.5-88.1k.
Two process workers: 84.5k with imagecodecs, 86.3k with pyspng in the run before (a fork server's
start weighs on them end to end, and their steady rates are alike).
The default stays Pillow, which needs nothing more, and whose recipes (and checkpoints) name no
decoder.
``TOLERANCE`` is what the tests allow (two levels of 255 at a pixel, 0.05 on average over an
image: the rounding of another IDCT or colour conversion, as a libjpeg-turbo build may differ).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

DECODERS = ("pillow", "opencv", "simplejpeg", "turbojpeg", "spng", "imagecodecs")
DEFAULT = "pillow"
PIP = {"opencv": "opencv-python-headless", "simplejpeg": "simplejpeg", "turbojpeg": "PyTurboJPEG",
       "spng": "pyspng", "imagecodecs": "imagecodecs"}  # fmt: skip
# the formats and Pillow modes (as Image.open reports them) each library decodes to Pillow's pixels
FORMATS = {
    "opencv": {"JPEG": ("L", "RGB"), "PNG": ("L", "RGB", "RGBA")},
    "simplejpeg": {"JPEG": ("L", "RGB")},
    "turbojpeg": {"JPEG": ("L", "RGB")},
    "spng": {"PNG": ("1", "L", "LA", "P", "RGB", "RGBA")},  # all but L become RGB, as Pillow converts them
    "imagecodecs": {"PNG": ("L", "P", "RGB", "RGBA")},  # of 8 bits or fewer (16-bit: Pillow's)
}
# the decoders that hold the GIL while they decode (thread workers take turns at them)
HOLDS_GIL = ("spng",)  # pyspng 0.1.4 (measured: a spinning thread beside it got half its speed)
# the largest difference from Pillow's pixels a decoder may make, per channel, after the resize
# (levels of 0-255): the max over pixels, and the mean over an image
TOLERANCE = {"max": 2, "mean": 0.05}


@dataclass(frozen=True)
class Library:
    name: str
    version: str
    decode: object  # (data: bytes, format: str, mode: str, scale: int, rgbx: bool) -> np.ndarray | None


def draft_scale(width: int, height: int, size: int) -> int:
    """The JPEG scale Pillow's ``draft("RGB", (size, size))`` picks: 8, 4, 2 or 1."""
    scale = min(width // size, height // size)
    return next(s for s in (8, 4, 2, 1) if scale >= s or s == 1)


def load(name: str) -> Library | None:
    """The library behind a decoder (None for Pillow), or a ValueError saying what to install."""
    if name not in DECODERS:
        raise ValueError(f"images(decoder={name!r}): expected one of {DECODERS}")
    return None if name == "pillow" else _load(name)


@functools.cache
def _load(name: str) -> Library:
    try:
        return globals()[f"_{name}"]()
    except ImportError as e:
        raise ValueError(
            f"images(decoder={name!r}) needs {PIP[name]}: pip install {PIP[name]} (importing it failed: {e})"
        ) from None


def _opencv() -> Library:
    import cv2

    reduced = {1: cv2.IMREAD_COLOR_RGB, 2: cv2.IMREAD_REDUCED_COLOR_2, 4: cv2.IMREAD_REDUCED_COLOR_4,
               8: cv2.IMREAD_REDUCED_COLOR_8}  # fmt: skip
    grey = {1: cv2.IMREAD_GRAYSCALE, 2: cv2.IMREAD_REDUCED_GRAYSCALE_2, 4: cv2.IMREAD_REDUCED_GRAYSCALE_4,
            8: cv2.IMREAD_REDUCED_GRAYSCALE_8}  # fmt: skip

    def decode(data, fmt, mode, scale, rgbx):
        flags = (grey if mode == "L" else reduced)[scale] | cv2.IMREAD_IGNORE_ORIENTATION
        pixels = cv2.imdecode(np.frombuffer(data, np.uint8), flags)
        if pixels is not None and pixels.ndim == 3 and scale > 1:  # the reduced colour flags give BGR
            pixels = cv2.cvtColor(pixels, cv2.COLOR_BGR2RGB)
        return pixels

    cv2.setNumThreads(1)  # one image per worker: the runner's workers are the parallelism
    return Library("opencv", cv2.__version__, decode)


def _simplejpeg() -> Library:
    import simplejpeg

    def decode(data, fmt, mode, scale, rgbx):
        height, width, *_ = simplejpeg.decode_jpeg_header(data)
        return simplejpeg.decode_jpeg(
            data, "GRAY" if mode == "L" else "RGB", min_width=-(-width // scale),
            min_height=-(-height // scale), strict=True,
        )  # fmt: skip

    return Library("simplejpeg", simplejpeg.__version__, decode)


def _turbojpeg() -> Library:
    import turbojpeg

    try:
        jpeg = turbojpeg.TurboJPEG()
    except (OSError, RuntimeError) as e:
        raise ImportError(f"PyTurboJPEG cannot load libjpeg-turbo's libturbojpeg: {e}") from None

    def decode(data, fmt, mode, scale, rgbx):
        gray = mode == "L"
        pixels = jpeg.decode(
            data, pixel_format=turbojpeg.TJPF_GRAY if gray else turbojpeg.TJPF_RGB,
            scaling_factor=(1, scale),
        )  # fmt: skip
        return pixels[:, :, 0] if gray else pixels

    return Library("turbojpeg", turbojpeg.__version__, decode)


def _spng() -> Library:
    import importlib.metadata

    import pyspng

    def decode(data, fmt, mode, scale, rgbx):
        if _interlaced(data):
            return None
        # colour without alpha, as convert("RGB") drops it; or with a fourth channel, to be ignored
        return pyspng.load(bytes(data), "L" if mode == "L" else "RGBA" if rgbx else "RGB")

    return Library("spng", importlib.metadata.version("pyspng"), decode)


def _interlaced(data) -> bool:
    """Whether a PNG is interlaced (Adam7), or its header is not where it should be: Pillow's."""
    return bytes(data[12:16]) != b"IHDR" or data[28] != 0


def _imagecodecs() -> Library:
    import imagecodecs

    def decode(data, fmt, mode, scale, rgbx):
        if _interlaced(data) or data[24] == 16:  # 16-bit channels: not Pillow's pixels
            return None
        pixels = imagecodecs.spng_decode(data)  # as stored: grey, RGB, or RGBA (palettes expanded)
        return pixels[:, :, :3] if pixels.ndim == 3 and pixels.shape[2] == 4 and not rgbx else pixels

    return Library("imagecodecs", f"{imagecodecs.__version__} ({imagecodecs.spng_version()})", decode)


def array(library: Library, data, fmt: str, mode: str, scale: int, rgbx: bool = False) -> np.ndarray | None:
    """The pixels ``library`` decodes (uint8, grey or RGB), or None where Pillow should decode:
    a format or mode the library does not read as Pillow does, or a failure (Pillow then names it).
    With ``rgbx``, RGB may come with a fourth channel that is not part of the pixels (a resize
    that works on four channels takes them as they are, without a repacking copy)."""
    if mode not in FORMATS[library.name].get(fmt, ()):
        return None
    if fmt == "JPEG" and bytes(data[-2:]) != b"\xff\xd9":
        return None  # cut off, or bytes after the end: libjpeg fills the rest with grey, Pillow refuses
    try:
        pixels = library.decode(data, fmt, mode, scale if fmt == "JPEG" else 1, rgbx)
    except Exception:  # the libraries raise many kinds; Pillow decodes it again and names the fault
        return None
    if pixels is None or pixels.dtype != np.uint8 or pixels.ndim != (2 if mode == "L" else 3):
        return None
    return pixels if pixels.ndim == 2 or pixels.shape[2] == 3 or (rgbx and pixels.shape[2] == 4) else None
