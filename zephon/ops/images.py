"""images: decode each record's image(s), resize, and cut them into patches. Stateless.

A record's image is encoded bytes (JPEG, PNG, WebP, ... anything Pillow reads), a dict with
``"bytes"`` (a Hugging Face ``Image`` column in Parquet), or a list of those. It becomes a list of
``Patches``: one patch of ``patch x patch x 3`` uint8 pixels per image token, row by row over the
image's grid of patches. ``tokenize(image_field=..., image_token=...)`` then puts one image token
per patch before the text.

An image is turned upright by its EXIF orientation (a phone's "rotate 90" JPEG is stored sideways),
as Pillow's ``ImageOps.exif_transpose`` would, after the JPEG draft decoding (which asks for a
square, so a quarter turn changes nothing there) and only where the tag says the image is turned.
A PNG's orientation is where Pillow finds it: an EXIF chunk, XMP's ``tiff:Orientation``, or an EXIF
profile in hex (``Raw profile type exif``, as ImageMagick writes it; until commit 3cae6cb such a
PNG was taken as upright, where Pillow turns it). Where those chunks all precede the pixels, Pillow
read them on opening and the image is decoded once, by ``decoder``; one after the pixels is
Pillow's to decode.
``params()`` holds ``orientation="exif"``: a checkpoint made before images were turned is refused
by name rather than resumed with other pixels.

``resize="crop"``: the shorter side is scaled to ``size`` and the centre ``size x size`` cut out, so
every image gives ``(size // patch) ** 2`` tokens. ``resize="fit"``: the image is scaled to fit in
``size x size`` with its aspect kept, each side rounded to whole patches, so the grid follows the
image (as models that take images at their own resolution want).

``decoder`` names the library that decodes (``zephon.ops.decoders``: Pillow, OpenCV, simplejpeg,
PyTurboJPEG, libspng); Pillow decodes what the others do not read, and the same ``resizer`` resizes whatever
decoded, so every decoder gives Pillow's pixels within ``decoders.TOLERANCE``. The decoder's name
and version, and Pillow's version, are part of the recipe: another version may give other pixels.
A grey image is resized as one channel and copied into three after (the same pixels, a third of
the work).

``resizer`` names what resizes: ``"pillow"`` (the default, the reference: bicubic) or ``"torch"``,
PyTorch's antialiased bicubic on uint8 (``interpolate(mode="bicubic", antialias=True)``, a port of
Pillow's filter), about four times faster on the benchmark's photographs and within
``decoders.TOLERANCE`` of Pillow's pixels (``benchmarks/results/vlm.md``, the resize table). Its
pixels do not depend on the number of threads torch uses or on the CPU's vector instructions
(tested: ``ATEN_CPU_CAPABILITY=default`` gives the same). ``"torch"`` and torch's version are part
of the recipe (none for Pillow: a checkpoint from before resizers could be chosen restores).

Pixels stay uint8 through the lane (a quarter of the memory of floats, exact in digests); ``mean``
and ``std`` normalize them in ``Batch.to_training``.
"""

from __future__ import annotations

import io
import zlib

import numpy as np

from zephon.ops import decoders
from zephon.ops.base import WorkOperator
from zephon.ops.containers import Patches, RecordBlock

RESIZE = ("crop", "fit")
RESIZERS = ("pillow", "torch")
MAX_PIXELS = 64 << 20  # one decoded image at most (about 8k x 8k): larger is almost always broken
ORIENTATION = 0x0112  # the EXIF tag
# the turn (a PIL.Image.Transpose; Pillow is optional) that shows the stored pixels upright, by
# EXIF orientation (1: upright already)
TURN = {
    2: "FLIP_LEFT_RIGHT",
    3: "ROTATE_180",
    4: "FLIP_TOP_BOTTOM",
    5: "TRANSPOSE",
    6: "ROTATE_270",  # Pillow's rotations are counter-clockwise: this is 90 degrees clockwise
    7: "TRANSVERSE",
    8: "ROTATE_90",
}


class Images(WorkOperator):
    kind = "images"
    takes = ("records",)
    gives = None

    def __init__(
        self,
        field: str = "image",
        size: int = 224,
        patch: int = 16,
        resize: str = "crop",
        mean: tuple[float, float, float] = (0.5, 0.5, 0.5),
        std: tuple[float, float, float] = (0.5, 0.5, 0.5),
        parallelism: int | None = None,
        decoder: str = decoders.DEFAULT,
        resizer: str = "pillow",
    ):
        super().__init__(parallelism)
        import PIL

        for name, value in (("size", size), ("patch", patch)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"images({name}={value!r}): must be an int >= 1")
        if size % patch:
            raise ValueError(f"images(size={size}, patch={patch}): size must be a multiple of patch")
        if resize not in RESIZE:
            raise ValueError(f"images(resize={resize!r}): expected one of {RESIZE}")
        for name, value in (("mean", mean), ("std", std)):
            if len(tuple(value)) != 3 or (name == "std" and min(value) <= 0):
                raise ValueError(f"images({name}={value!r}): three numbers, one per channel (std > 0)")
        self.field, self.size, self.patch, self.resize = field, size, patch, resize
        self.mean, self.std = tuple(map(float, mean)), tuple(map(float, std))
        self.pillow = PIL.__version__
        library = decoders.load(decoder)  # here: a missing library is named when the recipe is made
        self.decoder = decoder
        self.decoder_version = None if library is None else f"{decoder} {library.version}"
        self.resizer = resizer
        self.resizer_version = _resizer_version(resizer)  # here: torch missing is named now

    @property
    def imports(self) -> tuple[str, ...]:
        return ("torch",) if self.resizer == "torch" else ()

    @property
    def holds_gil(self) -> str | None:
        if self.decoder not in decoders.HOLDS_GIL:
            return None
        return (
            f"images(decoder={self.decoder!r}) holds the GIL while it decodes, so thread workers take "
            "turns at it: with several workers use runner='process', or decoder='imagecodecs' (the "
            "same libspng, which lets go of it; pip install imagecodecs) or 'opencv'"
        )

    def prepare(self) -> None:
        """torch, where it resizes, is imported before a worker takes work (two seconds a worker
        here, where the fork server did not import it), not in the middle of its first unit."""
        if self.resizer == "torch":
            import torch  # noqa: F401

    @property
    def patch_dim(self) -> int:
        return self.patch * self.patch * 3

    def params(self) -> dict:
        """The settings that shape the pixels; Pillow's version, and another decoder's or resizer's
        name and version (none for Pillow: a checkpoint from before they could be chosen restores)."""
        out = {
            "field": self.field, "size": self.size, "patch": self.patch, "resize": self.resize,
            "mean": list(self.mean), "std": list(self.std), "pillow": self.pillow, "orientation": "exif",
        }  # fmt: skip
        if self.decoder_version:
            out["decoder"] = self.decoder_version
        if self.resizer_version:
            out["resizer"] = self.resizer_version
        return out

    def work(self, block: RecordBlock) -> RecordBlock:
        """Each record's images as patches. A record without the field (or with None) has no
        images: text datasets mix with image-text ones (a misspelt field is caught at planning
        where the datasets have a schema; ``stats()`` counts the images)."""
        bad, count = {}, 0
        for i, record in enumerate(block.records):
            try:
                value = record.get(self.field)
                values = [] if value is None else list(value) if isinstance(value, list | tuple) else [value]
                record[self.field] = [self.patches(v) for v in values]
                count += len(values)
            except ValueError as e:
                if not block.skip_bad:
                    e.zephon_record = int(block.numbers[i])
                    raise
                bad[i] = str(e)
        block.counters["images"] = block.counters.get("images", 0) + count
        return block.without(bad) if bad else block

    def patches(self, value) -> Patches:
        """One image, decoded, resized and cut into patches."""
        pixels = self.resized(decode(value, self.field, self.size, self.decoder, self.resizer == "torch"))
        side = self.patch
        gh, gw = pixels.shape[0] // side, pixels.shape[1] // side
        cut = pixels.reshape(gh, side, gw, side, 3).transpose(0, 2, 1, 3, 4).reshape(gh * gw, -1)
        grid = np.empty((gh * gw, 3), np.int32)
        grid[:, 0], grid[:, 1], grid[:, 2] = np.arange(gh * gw), gh, gw
        return Patches(np.ascontiguousarray(cut), grid)

    def resized(self, image) -> np.ndarray:
        """The image (a Pillow image, or pixels as ``decode`` gives them) resized as ``resize``
        says, as a ``H x W x 3`` uint8 array."""
        w, h = (image.shape[1], image.shape[0]) if isinstance(image, np.ndarray) else image.size
        size, side = self.size, self.patch
        if self.resize == "crop":
            scale = size / min(w, h)
            sw, sh = max(size, round(w * scale)), max(size, round(h * scale))
            left, top = (sw - size) // 2, (sh - size) // 2
            pixels = self._resize(image, sw, sh)[top : top + size, left : left + size]
        else:
            scale = size / max(w, h)
            sw = max(side, min(size, round(w * scale / side) * side))
            sh = max(side, min(size, round(h * scale / side) * side))
            pixels = self._resize(image, sw, sh)
        # grey to RGB: three planes stacked (np.repeat over the last axis took 1.6x as long)
        return pixels if pixels.ndim == 3 else np.stack((pixels, pixels, pixels), axis=2)

    def _resize(self, image, width: int, height: int) -> np.ndarray:
        """A grey (``H x W``) or RGB (``H x W x 3``) image resized to ``width x height``, bicubic."""
        if self.resizer == "pillow":
            from PIL import Image

            if isinstance(image, np.ndarray):  # grey or RGB (decode gives no fourth channel here)
                image = Image.fromarray(image)
            return np.asarray(image.resize((width, height), Image.BICUBIC), np.uint8)
        import torch
        import torch.nn.functional as F

        # Pillow keeps an RGB pixel in four bytes: as "RGBX" they come out in one copy, where RGB
        # repacks them (0.4 ms an image here); the fourth channel is resized alongside (torch's
        # vectorized kernel works on four channels anyway) and dropped. A writable copy for torch.
        # A decoder's pixels (grey, RGB, or RGB and a fourth channel) go to torch as they are.
        if isinstance(image, np.ndarray):
            h, w = image.shape[:2]
            channels = 1 if image.ndim == 2 else image.shape[2]
            image = np.require(image, np.uint8, ["C_CONTIGUOUS", "WRITEABLE"])  # copied only if not
            x = torch.from_numpy(image).view(1, h, w, channels).permute(0, 3, 1, 2)
            grey = channels == 1
        else:
            w, h = image.size
            grey = image.mode == "L"
            data = bytearray(image.tobytes() if grey else image.tobytes("raw", "RGBX"))
            x = torch.frombuffer(data, dtype=torch.uint8).view(1, h, w, 1 if grey else 4).permute(0, 3, 1, 2)
        with torch.no_grad():
            y = F.interpolate(x, size=(height, width), mode="bicubic", antialias=True)
        return y[0, 0].numpy() if grey else y[0, :3].permute(1, 2, 0).numpy()


def _resizer_version(resizer: str) -> str | None:
    """None for Pillow (its version is in the recipe anyway), else ``"torch <version>"``; a
    ValueError naming the choices, or what to install."""
    if resizer not in RESIZERS:
        raise ValueError(f"images(resizer={resizer!r}): expected one of {RESIZERS}")
    if resizer == "pillow":
        return None
    try:
        import torch
    except ImportError as e:
        raise ValueError(
            f"images(resizer='torch') needs PyTorch: pip install torch (importing it failed: {e})"
        ) from None
    return f"torch {torch.__version__.split('+')[0]}"


# the PNG chunks from which Pillow takes an orientation: EXIF, and text (an EXIF profile in hex, as
# ImageMagick writes it, or XMP's tiff:Orientation)
_PNG_ORIENTING = (b"eXIf", b"tEXt", b"zTXt", b"iTXt")


def png_metadata(data: bytes) -> str | None:
    """Where a PNG's chunks that can turn it lie: None (it has none: upright as stored),
    ``"before"`` (all before its first pixels, ``IDAT``: Pillow has read them on opening), or
    ``"after"`` (one follows the pixels, or the chunks cannot be walked: Pillow decides)."""
    if data[:8] != _PNG_SIGNATURE:
        return "after"
    found, pixels = None, False
    for kind, _, _ in _png_chunks(data):
        if kind == b"IDAT":
            pixels = True
        elif kind in _PNG_ORIENTING:
            if pixels:
                return "after"
            found = "before"
        elif kind == b"IEND":
            return found
    return "after"  # no IEND where the lengths lead: let Pillow say what is wrong


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _png_chunks(data: bytes):
    """A PNG's chunks after its signature, as far as their lengths lead: (name, where the chunk
    starts, its data's length); the last may run past the end of ``data``."""
    at = 8
    while at + 8 <= len(data):
        length = int.from_bytes(data[at : at + 4], "big")
        yield bytes(data[at + 4 : at + 8]), at, length
        at += 12 + length


# Pillow's mode of a PNG of this bit depth and colour type, where a decoder takes it without Pillow
_PNG_MODES = {(8, 0): "L", (8, 2): "RGB", (8, 3): "P", (8, 6): "RGBA"}
# the chunks that may come before the pixels of a PNG taken without Pillow, each with the fewest
# bytes Pillow's opening takes in it (PngImagePlugin's chunk_* refuse fewer): those it reads and
# checks, and standard ones it passes over. Any other (iCCP, which it inflates; APNG's acTL, fcTL
# and fdAT; a second IHDR; a private chunk, which a later Pillow might read) goes to Pillow.
_PNG_LEAST_BEFORE_PIXELS = {b"PLTE": 0, b"gAMA": 4, b"cHRM": 32, b"sRGB": 1, b"pHYs": 9, b"bKGD": 0,
                            b"sBIT": 0, b"hIST": 0, b"tIME": 0}  # fmt: skip
_PNG_LEAST_TRANSPARENCY = {"L": 2, "RGB": 6, "P": 0, "RGBA": 0}  # tRNS's fewest bytes, by the mode


def png_header(data: bytes) -> tuple[str, int, int] | None:
    """(Pillow's mode, width, height) of a PNG that nothing turns and that Pillow opens, read
    from its chunks without Pillow (whose opening parses them in Python: a tenth of the time two
    thread workers held the GIL in Figure 3); None for anything else, which Pillow opens. As
    Pillow checks on opening: the signature, a header of 13 bytes, compression and filter method
    0, and every chunk before the pixels whole, its CRC right. Only 8-bit grey, palette, RGB and
    RGBA, and no chunk that can hold an orientation (``_PNG_ORIENTING``) anywhere; before the
    pixels only the chunks of ``_PNG_LEAST_BEFORE_PIXELS`` and tRNS, each at least as long as
    Pillow asks."""
    if data[:8] != _PNG_SIGNATURE or data[8:16] != b"\0\0\0\x0dIHDR" or len(data) < 33:
        return None
    mode = _PNG_MODES.get((data[24], data[25]))
    if mode is None or data[26] or data[27] or data[28] > 1:
        return None
    view = memoryview(data)  # a chunk's CRC over its bytes in place, not a copy of them
    past_header = False  # an IDAT seen (Pillow's opening stops at the first)
    for kind, at, length in _png_chunks(data):
        end = at + 12 + length
        if end > len(data) or kind in _PNG_ORIENTING:
            return None
        if kind == b"IDAT":
            past_header = True
        elif not past_header:
            if at == 8:
                least = 13  # IHDR, whose length was checked above
            elif kind == b"tRNS":
                least = _PNG_LEAST_TRANSPARENCY[mode]
            else:
                least = _PNG_LEAST_BEFORE_PIXELS.get(kind, -1)
            if least < 0 or length < least:
                return None
            if zlib.crc32(view[at + 4 : end - 4]) != int.from_bytes(data[end - 4 : end], "big"):
                return None
        if kind == b"IEND":
            width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
            return (mode, width, height) if past_header and width and height else None
    return None


class _Refused(ValueError):
    """This module's own refusal of an image, already worded as ``images()`` words it."""


def decode(value, field: str, size: int, decoder: str = "pillow", rgbx: bool = False):
    """A Pillow image, grey (``L``) or RGB, from encoded bytes (or a dict holding them), upright by
    its EXIF orientation, or a ValueError; a JPEG is decoded at the smallest scale that keeps both
    sides at least ``size``, by ``decoder`` where it reads the format, else by Pillow. Where
    ``decoder`` decoded an image that is upright as stored, its pixels instead (``decoders.array``:
    a uint8 array, grey or RGB, and with ``rgbx`` maybe a fourth channel to ignore): making a
    Pillow image of them is a copy that the resize may not need. A PNG whose header says all
    that (``png_header``) goes to ``decoder`` without Pillow opening it."""
    from PIL import Image

    if isinstance(value, dict):
        value = value.get("bytes")
    if isinstance(value, memoryview):
        value = bytes(value)
    if isinstance(value, Patches):
        raise ValueError(f"images(field={field!r}): the field holds patches already: one images() step")
    if not isinstance(value, bytes | bytearray | memoryview):
        raise ValueError(
            f"images(field={field!r}): expected encoded image bytes (or a dict with 'bytes'), got "
            f"{type(value).__name__}"
        )
    tried = False  # the decoder had the PNG already and declined it: not again after Pillow opens it
    if decoder != "pillow":
        header = png_header(value)
        if header is not None and header[1] * header[2] <= MAX_PIXELS:
            pixels = decoders.array(decoders.load(decoder), value, "PNG", header[0], 1, rgbx)
            if pixels is not None:
                return pixels
            tried = True
    try:
        image = Image.open(io.BytesIO(value))  # the header only: size, format, mode, EXIF
        if image.width * image.height > MAX_PIXELS:
            raise _Refused(
                f"images(field={field!r}): an image of {image.width} x {image.height} pixels, over the "
                f"limit of {MAX_PIXELS:,} (filter it out, or skip bad records with on_error='skip')"
            )
        # Pillow decodes a whole PNG (getexif) to look for EXIF after its pixels; where the chunks
        # that can say how it is turned all come before the pixels, Pillow read them on opening,
        # and its EXIF is had without the decode (a PNG with such chunks after the pixels is
        # left to Pillow, which has decoded it by then)
        png = png_metadata(value) if image.format == "PNG" else "not a PNG"
        if png is None:
            turn = None
        else:  # Pillow's own getexif on a PNG whose chunks it read on opening, without the decode
            exif = Image.Image.getexif(image) if png == "before" else image.getexif()
            turn = TURN.get(exif.get(ORIENTATION))
        pixels = None
        if decoder != "pillow" and png != "after" and not tried:
            scale = decoders.draft_scale(image.width, image.height, size)
            pixels = decoders.array(decoders.load(decoder), value, image.format, image.mode, scale, rgbx)
        if pixels is not None:
            if turn is None:
                return pixels
            image = Image.fromarray(pixels[:, :, :3] if pixels.ndim == 3 else pixels)
        else:
            # a square request: the same scale whichever way the image is turned after
            image.draft("RGB", (size, size))
            image.load()  # decode now, inside the try
            if image.mode not in ("L", "RGB"):
                image = image.convert("RGB")  # convert would copy an RGB image
        return image if turn is None else image.transpose(getattr(Image.Transpose, turn))
    except _Refused:
        raise
    except Exception as e:  # Pillow raises many kinds: UnidentifiedImageError, OSError, SyntaxError,
        raise ValueError(  # and ValueError for a truncated chunk
            f"images(field={field!r}): cannot decode the image ({len(value):,} bytes): "
            f"{type(e).__name__}: {e}"
        ) from None
