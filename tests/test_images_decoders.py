"""images(decoder=...): every decoder gives Pillow's pixels (within decoders.TOLERANCE) on real
photographs, turns JPEGs upright by their EXIF orientation, refuses the images Pillow refuses, is
part of the recipe, and a missing library is named with what to pip install."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image
from support.exif import STORED, jpeg, quadrants
from support.photos import photo_pipelines

from zephon.ops import decoders
from zephon.ops.images import Images
from zephon.testing.images import photos


def installed(name: str) -> bool:
    try:
        decoders.load(name)
    except ValueError:
        return False
    return True


DECODERS = [
    pytest.param(n, marks=pytest.mark.skipif(not installed(n), reason=f"{n} is not installed"))
    for n in decoders.DECODERS
]


@pytest.fixture(scope="module")
def samples():
    return photos()


def within_tolerance(got: np.ndarray, want: np.ndarray) -> bool:
    difference = np.abs(got.astype(np.int16) - want.astype(np.int16))
    return difference.max() <= decoders.TOLERANCE["max"] and difference.mean() <= decoders.TOLERANCE["mean"]


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize(("size", "resize"), [(224, "crop"), (224, "fit"), (64, "crop")])
def test_every_decoder_gives_pillows_pixels_on_the_photographs(samples, decoder, size, resize):
    """At 64 pixels a JPEG is decoded at a quarter or an eighth of its size (the DCT scaling)."""
    reference, op = Images(size=size, resize=resize), Images(size=size, resize=resize, decoder=decoder)
    for key, _, data, _ in samples:
        got, want = op.patches(data), reference.patches(data)
        assert got.grid.tolist() == want.grid.tolist(), key
        assert within_tolerance(got.pixels, want.pixels), key


def test_a_grey_image_resized_as_one_channel_has_the_pixels_of_its_rgb_copy(samples):
    data = next(d for k, _, d, _ in samples if k == "camera")
    image = Image.open(io.BytesIO(data))
    assert image.mode == "L"
    pixels = Images(size=64, patch=16).patches(data).pixels.reshape(4, 4, 16, 16, 3)
    want = np.asarray(image.convert("RGB").resize((64, 64), Image.BICUBIC))
    assert np.array_equal(pixels.transpose(0, 2, 1, 3, 4).reshape(64, 64, 3), want)


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("orientation", sorted(STORED))
def test_every_decoder_turns_a_jpeg_upright_as_pillow_does(decoder, orientation):
    turned = jpeg(STORED[orientation](quadrants()), orientation)
    got = Images(size=32, patch=8, resize="fit", decoder=decoder).patches(turned)
    want = Images(size=32, patch=8, resize="fit").patches(turned)
    assert got.grid.tolist() == want.grid.tolist() and within_tolerance(got.pixels, want.pixels)


def cut(data: bytes) -> bytes:
    return data[: len(data) * 2 // 3]


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("damage", ["not an image", "cut-off JPEG", "cut-off PNG", "cut-off grey PNG"])
def test_every_decoder_refuses_what_pillow_refuses(samples, decoder, damage):
    by_key = {k: d for k, _, d, _ in samples}
    data = {
        "not an image": b"\x89PNG not really",
        "cut-off JPEG": cut(by_key["china"]),
        "cut-off PNG": cut(by_key["coffee"]),
        "cut-off grey PNG": cut(by_key["camera"]),
    }[damage]
    with pytest.raises(ValueError, match=r"images\(field='image'\): cannot decode the image"):
        Images(size=64, decoder=decoder).patches(data)


@pytest.mark.parametrize("decoder", [d for d in DECODERS if d.values[0] != "pillow"])
def test_the_decoder_and_its_version_are_part_of_the_recipe(decoder):
    pillow, other = Images().params(), Images(decoder=decoder).params()
    assert "decoder" not in pillow, "a checkpoint from before decoders could be chosen restores"
    assert other["decoder"] == f"{decoder} {decoders.load(decoder).version}"
    assert {k: v for k, v in other.items() if k != "decoder"} == pillow


def test_a_checkpoint_made_with_another_decoder_is_refused_by_name(tmp_path, gpt2):
    from zephon.testing import drain

    if not installed("opencv"):
        pytest.skip("opencv is not installed")
    pipeline = photo_pipelines(str(tmp_path), gpt2)
    p = pipeline(decoder="opencv")
    drain(p, 1)
    with pytest.raises(ValueError, match=r"operators\[0\]\.decoder: 'opencv [^']+' -> '<absent>'"):
        pipeline(decoder="pillow").load_state_dict(p.state_dict())


def test_a_missing_decoder_library_names_what_to_pip_install(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "cv2", None)  # import cv2 fails as if not installed
    decoders._load.cache_clear()
    try:
        with pytest.raises(ValueError, match=r"images\(decoder='opencv'\) needs .*pip install opencv-python"):
            Images(decoder="opencv")
    finally:
        decoders._load.cache_clear()


def test_an_unknown_decoder_is_named_with_the_choices():
    with pytest.raises(ValueError, match=r"images\(decoder='cv2'\): expected one of \('pillow', 'opencv'"):
        Images(decoder="cv2")
