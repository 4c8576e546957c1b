"""JPEGs as a camera stores them: the pixels turned or mirrored, and an EXIF orientation that says
how to show them upright."""

from __future__ import annotations

import io

import numpy as np


def quadrants() -> np.ndarray:
    """An upright 256 x 128 image whose quadrants are red, green (top), blue, white (bottom), so
    any rotation or mirror shows."""
    image = np.zeros((128, 256, 3), np.uint8)
    image[:64, :128], image[:64, 128:] = (255, 0, 0), (0, 255, 0)
    image[64:, :128], image[64:, 128:] = (0, 0, 255), (255, 255, 255)
    return image


# the pixels a camera stores for an upright view, by EXIF orientation (where the stored row 0 and
# column 0 are seen): 6 = shown rotated 90 degrees clockwise, 8 = counter-clockwise, 5 and 7 mirrored
STORED = {
    2: np.fliplr,
    3: lambda a: np.rot90(a, 2),
    4: np.flipud,
    5: lambda a: a.transpose(1, 0, 2),
    6: lambda a: np.rot90(a, 1),
    7: lambda a: np.rot90(a, 2).transpose(1, 0, 2),
    8: lambda a: np.rot90(a, -1),
}


def jpeg(pixels: np.ndarray, orientation: int | None = None) -> bytes:
    """``pixels`` as a JPEG (quality 95), with an EXIF orientation tag where one is given."""
    from PIL import Image

    image = Image.fromarray(np.ascontiguousarray(pixels))
    exif = Image.Exif()
    if orientation is not None:
        exif[0x0112] = orientation  # Orientation
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=95, exif=exif.tobytes())
    return buffer.getvalue()
