"""images: decode each record's image(s), resize, and cut them into patches. Stateless.

A record's image is encoded bytes (JPEG, PNG, WebP, ... anything Pillow reads), a dict with
``"bytes"`` (a Hugging Face ``Image`` column in Parquet), or a list of those. It becomes a list of
``Patches``: one patch of ``patch x patch x 3`` uint8 pixels per image token, row by row over the
image's grid of patches. ``tokenize(image_field=..., image_token=...)`` then puts one image token
per patch before the text.

An image is turned upright by its EXIF orientation (a phone's "rotate 90" JPEG is stored sideways),
as Pillow's ``ImageOps.exif_transpose`` would, after the JPEG draft decoding (which asks for a
square, so a quarter turn changes nothing there) and only where the tag says the image is turned.
``params()`` holds ``orientation="exif"``: a checkpoint made before images were turned is refused
by name rather than resumed with other pixels.

``resize="crop"``: the shorter side is scaled to ``size`` and the centre ``size x size`` cut out, so
every image gives ``(size // patch) ** 2`` tokens. ``resize="fit"``: the image is scaled to fit in
``size x size`` with its aspect kept, each side rounded to whole patches, so the grid follows the
image (as models that take images at their own resolution want).

``decoder`` names the library that decodes (``zephon.ops.decoders``: Pillow, OpenCV, simplejpeg,
PyTurboJPEG); Pillow decodes what the others do not read, and resizes every image (bicubic, as
before), so every decoder gives Pillow's pixels within ``decoders.TOLERANCE``. The decoder's name
and version, and Pillow's version, are part of the recipe: another version may give other pixels.
A grey image is resized as one channel and copied into three after (the same pixels, a third of
the work). Pixels stay uint8 through the lane (a quarter of the memory of floats, exact in
digests); ``mean`` and ``std`` normalize them in ``Batch.to_training``.
"""

from __future__ import annotations

import io

import numpy as np

from zephon.ops import decoders
from zephon.ops.base import WorkOperator
from zephon.ops.containers import Patches, RecordBlock

RESIZE = ("crop", "fit")
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

    @property
    def patch_dim(self) -> int:
        return self.patch * self.patch * 3

    def params(self) -> dict:
        """The settings that shape the pixels; Pillow's version, and another decoder's name and
        version (none for Pillow: a checkpoint from before decoders could be chosen restores)."""
        out = {
            "field": self.field, "size": self.size, "patch": self.patch, "resize": self.resize,
            "mean": list(self.mean), "std": list(self.std), "pillow": self.pillow, "orientation": "exif",
        }  # fmt: skip
        if self.decoder_version:
            out["decoder"] = self.decoder_version
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
        pixels = self.resized(decode(value, self.field, self.size, self.decoder))
        side = self.patch
        gh, gw = pixels.shape[0] // side, pixels.shape[1] // side
        cut = pixels.reshape(gh, side, gw, side, 3).transpose(0, 2, 1, 3, 4).reshape(gh * gw, -1)
        grid = np.empty((gh * gw, 3), np.int32)
        grid[:, 0], grid[:, 1], grid[:, 2] = np.arange(gh * gw), gh, gw
        return Patches(np.ascontiguousarray(cut), grid)

    def resized(self, image) -> np.ndarray:
        from PIL import Image

        w, h = image.size
        size, side = self.size, self.patch
        if self.resize == "crop":
            scale = size / min(w, h)
            sw, sh = max(size, round(w * scale)), max(size, round(h * scale))
            image = image.resize((sw, sh), Image.BICUBIC)
            left, top = (sw - size) // 2, (sh - size) // 2
            image = image.crop((left, top, left + size, top + size))
        else:
            scale = size / max(w, h)
            sw = max(side, min(size, round(w * scale / side) * side))
            sh = max(side, min(size, round(h * scale / side) * side))
            image = image.resize((sw, sh), Image.BICUBIC)
        pixels = np.asarray(image, np.uint8)
        return pixels if pixels.ndim == 3 else np.repeat(pixels[:, :, None], 3, axis=2)


def decode(value, field: str, size: int, decoder: str = "pillow"):
    """A Pillow image, grey (``L``) or RGB, from encoded bytes (or a dict holding them), upright by
    its EXIF orientation, or a ValueError; a JPEG is decoded at the smallest scale that keeps both
    sides at least ``size``, by ``decoder`` where it reads the format, else by Pillow."""
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
    try:
        image = Image.open(io.BytesIO(value))  # the header only: size, format, mode, EXIF
        if image.width * image.height > MAX_PIXELS:
            raise ValueError(
                f"images(field={field!r}): an image of {image.width} x {image.height} pixels, over the "
                f"limit of {MAX_PIXELS:,} (filter it out, or skip bad records with on_error='skip')"
            )
        # Pillow decodes a PNG to find an EXIF chunk that may follow the pixels: a PNG whose bytes
        # hold no EXIF chunk and no XMP orientation is upright without that (and one that does is
        # left to Pillow, which has decoded it by then)
        png_exif = image.format == "PNG" and (b"eXIf" in value or b"Orientation" in value)
        turn = TURN.get(image.getexif().get(ORIENTATION)) if image.format != "PNG" or png_exif else None
        pixels = None
        if decoder != "pillow" and not png_exif:
            scale = decoders.draft_scale(image.width, image.height, size)
            pixels = decoders.array(decoders.load(decoder), value, image.format, image.mode, scale)
        if pixels is not None:
            image = Image.fromarray(pixels)
        else:
            # a square request: the same scale whichever way the image is turned after
            image.draft("RGB", (size, size))
            image.load()  # decode now, inside the try
            if image.mode not in ("L", "RGB"):
                image = image.convert("RGB")  # convert would copy an RGB image
        return image if turn is None else image.transpose(getattr(Image.Transpose, turn))
    except ValueError:
        raise
    except Exception as e:  # Pillow raises many kinds: UnidentifiedImageError, OSError, SyntaxError
        raise ValueError(
            f"images(field={field!r}): cannot decode the image ({len(value):,} bytes): "
            f"{type(e).__name__}: {e}"
        ) from None
