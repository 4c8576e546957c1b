"""images(decoder=...): every decoder gives Pillow's pixels (within decoders.TOLERANCE) on real
photographs, turns JPEGs upright by their EXIF orientation, refuses the images Pillow refuses, is
part of the recipe, and a missing library is named with what to pip install."""

from __future__ import annotations

import io
import re
import warnings

import numpy as np
import pytest
from PIL import Image, UnidentifiedImageError
from support.exif import STORED, jpeg, quadrants
from support.photos import photo_pipelines

from zephon.ops import decoders
from zephon.ops.images import Images, decode, png_header, png_metadata
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


EXACT = ("spng", "imagecodecs")  # libspng: Pillow's very pixels wherever it decodes


@pytest.fixture(scope="module")
def samples():
    return photos()


def within_tolerance(got: np.ndarray, want: np.ndarray) -> bool:
    difference = np.abs(got.astype(np.int16) - want.astype(np.int16))
    return difference.max() <= decoders.TOLERANCE["max"] and difference.mean() <= decoders.TOLERANCE["mean"]


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize(("size", "resize"), [(224, "crop"), (224, "fit"), (64, "crop")])
@pytest.mark.parametrize("resizer", ["pillow", "torch"])
def test_every_decoder_gives_pillows_pixels_on_the_photographs(samples, decoder, size, resize, resizer):
    """At 64 pixels a JPEG is decoded at a quarter or an eighth of its size (the DCT scaling). The
    same resizer after each decoder: a decoder's pixels (torch takes them as they come, a fourth
    channel and all) resize as Pillow's do."""
    reference = Images(size=size, resize=resize, resizer=resizer)
    op = Images(size=size, resize=resize, decoder=decoder, resizer=resizer)
    for key, _, data, _ in samples:
        got, want = op.patches(data), reference.patches(data)
        assert got.grid.tolist() == want.grid.tolist(), key
        assert within_tolerance(got.pixels, want.pixels), key
        if decoder in EXACT:  # exactly Pillow's pixels, where it decodes
            assert np.array_equal(got.pixels, want.pixels), key


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


def oriented_png(orientation: int, where: str) -> bytes:
    """The quadrants stored turned, as a PNG whose chunks say how to show them: ``where`` the
    orientation is, an EXIF chunk before or after the pixels, XMP, or an EXIF profile in hex (as
    ImageMagick writes it)."""
    from PIL import PngImagePlugin

    stored = Image.fromarray(np.ascontiguousarray(STORED[orientation](quadrants())))
    exif = Image.Exif()
    exif[0x0112] = orientation
    raw = exif.tobytes()
    if where == "xmp":
        info = PngImagePlugin.PngInfo()
        info.add_itxt("XML:com.adobe.xmp", f'<x:xmpmeta><rdf:Description tiff:Orientation="{orientation}"/>')
        return _png(stored, pnginfo=info)
    if where == "hex profile":
        info = PngImagePlugin.PngInfo()
        info.add_text("Raw profile type exif", f"\nexif\n{len(raw)}\n{raw.hex()}", zip=True)
        return _png(stored, pnginfo=info)
    data = _png(stored, exif=raw)
    if where == "exif after the pixels":
        at = data.index(b"eXIf") - 4
        chunk = data[at : at + 12 + int.from_bytes(data[at : at + 4], "big")]
        data = data[:at] + data[at + len(chunk) :]
        end = data.index(b"IEND") - 4
        data = data[:end] + chunk + data[end:]
    return data


@pytest.mark.parametrize("decoder", DECODERS)
@pytest.mark.parametrize("where", ["exif", "exif after the pixels", "xmp", "hex profile"])
@pytest.mark.parametrize("orientation", [3, 6])
def test_every_decoder_turns_a_png_upright_wherever_its_orientation_is_kept(decoder, where, orientation):
    """Where Pillow finds an orientation in a PNG, every decoder shows it upright as Pillow does."""
    upright = _png(Image.fromarray(quadrants()))
    turned = oriented_png(orientation, where)
    assert png_metadata(turned) == ("after" if where == "exif after the pixels" else "before")
    want = Images(size=32, patch=8, resize="fit").patches(upright)
    got = Images(size=32, patch=8, resize="fit", decoder=decoder).patches(turned)
    assert got.grid.tolist() == want.grid.tolist() and within_tolerance(got.pixels, want.pixels)


def test_a_png_oriented_before_its_pixels_is_decoded_by_the_decoder_not_by_pillow(monkeypatch):
    """Pillow's getexif decodes a whole PNG to look for EXIF after the pixels: where the chunks
    that turn it all come first, libspng decodes it, once, and Pillow does not."""
    from PIL import PngImagePlugin

    if not installed("spng"):
        pytest.skip("pyspng is not installed")
    loads = []
    load = PngImagePlugin.PngImageFile.load
    monkeypatch.setattr(PngImagePlugin.PngImageFile, "load", lambda self: loads.append(1) or load(self))
    for where in ("xmp", "exif", "hex profile"):
        Images(size=32, patch=8, decoder="spng").patches(oriented_png(6, where))
    assert loads == []
    Images(size=32, patch=8, decoder="spng").patches(oriented_png(6, "exif after the pixels"))
    assert loads, "a PNG with EXIF after its pixels is Pillow's to decode"


def test_the_png_chunk_walk_says_where_orientation_may_lie():
    plain = _png(Image.fromarray(quadrants()))
    assert png_metadata(plain) is None
    assert png_metadata(_with_chunk(plain, b"tEXt", b"Comment\0hi")) == "before"
    assert png_metadata(plain[:-12]) == "after"  # no IEND: Pillow says what is wrong
    assert png_metadata(b"GIF89a") == "after"
    lengths_wrong = plain[:33] + (1 << 30).to_bytes(4, "big") + plain[37:]
    assert png_metadata(lengths_wrong) == "after"


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


def _png(image: Image.Image, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, "PNG", **options)
    return out.getvalue()


def _with_chunk(data: bytes, kind: bytes, body: bytes) -> bytes:
    """``data`` (a PNG) with a chunk put right after its header."""
    import struct
    import zlib

    crc = struct.pack(">I", zlib.crc32(kind + body))
    return data[:33] + struct.pack(">I", len(body)) + kind + body + crc + data[33:]


def png_kinds() -> dict[str, bytes]:
    """PNGs of every colour type and bit depth Pillow reads, and chunks that do not change pixels."""
    import cv2

    rng = np.random.default_rng(5)
    grey = rng.integers(0, 256, (37, 53), dtype=np.uint8)
    rgba = rng.integers(0, 256, (37, 53, 4), dtype=np.uint8)
    rgb = Image.fromarray(rgba[..., :3].copy())
    paletted = rgb.convert("P")
    kinds = {
        "grey": _png(Image.fromarray(grey)),
        "rgb": _png(rgb),
        "rgba": _png(Image.fromarray(rgba)),
        "grey + alpha": _png(Image.fromarray(rgba[..., :2].copy(), "LA")),
        "1 bit": _png(Image.fromarray(grey > 128)),
        "palette": _png(paletted),
        "palette with transparency": _png(paletted, transparency=3),
        "16-bit rgb": cv2.imencode(".png", rng.integers(0, 1 << 16, (37, 53, 3), dtype=np.uint16))[
            1
        ].tobytes(),
        "16-bit rgba": cv2.imencode(".png", rng.integers(0, 1 << 16, (37, 53, 4), dtype=np.uint16))[
            1
        ].tobytes(),
        "16-bit grey": cv2.imencode(".png", grey.astype(np.uint16) * 257 + 3)[1].tobytes(),
    }
    for bits in (1, 2, 4):
        small = rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=1 << bits)
        kinds[f"{bits}-bit palette"] = _png(small, bits=bits)
    for bits in (2, 4):
        few = (
            Image.fromarray(grey).convert("P", palette=Image.Palette.ADAPTIVE, colors=1 << bits).convert("L")
        )
        kinds[f"{bits}-bit grey"] = _png(few, bits=bits)
    kinds["gamma"] = _with_chunk(kinds["rgb"], b"gAMA", (100_000).to_bytes(4, "big"))
    kinds["rgb with transparency"] = _with_chunk(kinds["rgb"], b"tRNS", bytes([0, 1, 0, 2, 0, 3]))
    kinds["significant bits"] = _with_chunk(kinds["grey"], b"sBIT", bytes([5]))
    kinds["grey with transparency"] = _with_chunk(kinds["grey"], b"tRNS", bytes([0, 7]))
    return kinds


# what each libspng decoder must decode itself (the rest it may leave to Pillow)
MUST = {
    "spng": lambda kind, mode: mode in decoders.FORMATS["spng"]["PNG"],
    "imagecodecs": lambda kind, mode: not kind.startswith(("16-bit", "grey + alpha")),
}


@pytest.mark.parametrize("decoder", [d for d in DECODERS if "PNG" in decoders.FORMATS.get(d.values[0], {})])
def test_png_decoders_give_pillows_very_pixels_in_every_mode_they_read(decoder):
    """Decoded, before any resize: exactly Pillow's pixels (as the images step turns them into grey
    or RGB), or None where Pillow decodes; every mode the decoder claims is decoded by it."""
    library = decoders.load(decoder)
    claimed = decoders.FORMATS[decoder]["PNG"]
    for kind, data in png_kinds().items():
        image = Image.open(io.BytesIO(data))
        mode = image.mode
        want = np.asarray(image.convert("L" if mode == "L" else "RGB"))
        got = decoders.array(library, data, "PNG", mode, 1)
        if decoder in MUST and mode in claimed and MUST[decoder](kind, mode):
            assert got is not None, f"{kind}: {decoder} claims mode {mode} but did not decode it"
        if got is not None:
            assert got.shape == want.shape and np.array_equal(got, want), kind


@pytest.mark.parametrize("resizer", ["pillow", "torch"])
def test_a_decoders_pixels_resize_the_same_whatever_their_memory_layout(resizer):
    """turbojpeg's grey comes as a strided view, a library may give read-only memory: each resizes
    as a plain copy of itself does, and as the same pixels in a Pillow image."""
    op = Images(size=32, patch=8, resizer=resizer)
    rgb = np.random.default_rng(3).integers(0, 256, (40, 50, 3), dtype=np.uint8)
    read_only = rgb.copy()
    read_only.flags.writeable = False
    for pixels in (rgb[:, :, 0], read_only, rgb[::-1][::-1]):
        want = op.resized(Image.fromarray(np.ascontiguousarray(pixels)))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # torch warns of memory it may not write to
            assert np.array_equal(op.resized(pixels), want)


def test_thread_workers_are_told_once_when_their_decoder_holds_the_gil(tmp_path, gpt2, caplog, monkeypatch):
    """libspng holds the GIL: two thread workers take turns at it (Figure 3: 0.79x Grain against
    OpenCV's and Pillow's better), so the thread runner names it and what to choose instead."""
    import logging

    from zephon import Dataset, Pipeline
    from zephon.runners import thread
    from zephon.testing import drain
    from zephon.testing.images import write_parquet

    monkeypatch.setattr(thread, "_SAID", set())
    ds = Dataset.from_path("photos", write_parquet(str(tmp_path / "p.parquet"), photos()[:4]))

    def said(runner: str, workers: int, decoder: str) -> list[str]:
        p = (
            Pipeline(ds)
            .options(num_lanes=1, chunk_size=2, runner=runner)
            .images(size=32, patch=16, decoder=decoder, parallelism=workers)
            .tokenize(gpt2, image_token=50256, parallelism=1)
            .pack_flat(16)
            .batch(1)
        )
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="zephon"):
            drain(p, 1)
        return [r.getMessage() for r in caplog.records if "holds the GIL" in r.getMessage()]

    [message] = said("thread", 2, "spng")
    assert "images(decoder='spng')" in message and "runner='process'" in message
    assert "'opencv'" in message and "2 thread workers" in message and "decoder='imagecodecs'" in message
    assert said("thread", 2, "spng") == [], "said once a process, not at every run"
    monkeypatch.setattr(thread, "_SAID", set())
    assert said("thread", 1, "spng") == [] and said("thread", 2, "opencv") == []
    assert said("thread", 2, "imagecodecs") == []
    assert said("process", 2, "spng") == []


def _bad_gama_crc(png: bytes) -> bytes:
    """``png`` with a gAMA chunk after its header whose CRC is one bit off."""
    data = _with_chunk(png, b"gAMA", (100_000).to_bytes(4, "big"))
    at = 33 + 8 + 4  # the CRC: after the header, the chunk's length and name, and its 4 bytes
    return data[:at] + bytes([data[at] ^ 1]) + data[at + 1 :]


def test_the_png_header_read_without_pillow_is_what_pillow_opens():
    """``png_header`` answers, for the PNGs a decoder takes without Pillow, Pillow's own mode and
    size, and leaves to Pillow all else: other bit depths and colour types, a chunk that can turn
    the image, a chunk before the pixels that Pillow refuses (its CRC wrong), an unknown
    compression method, no end."""
    answered = set()
    for kind, data in png_kinds().items():
        header = png_header(data)
        if header is not None:
            image = Image.open(io.BytesIO(data))
            assert header == (image.mode, *image.size), kind
            answered.add(kind)
    assert answered == {
        "grey", "rgb", "rgba", "palette", "palette with transparency", "gamma", "rgb with transparency",
        "significant bits", "grey with transparency",
    }  # fmt: skip
    plain = png_kinds()["rgb"]
    assert png_header(_with_chunk(plain, b"tEXt", b"Comment\0hi")) is None
    bad_crc = _bad_gama_crc(plain)
    with pytest.raises(UnidentifiedImageError):  # Pillow's "broken PNG file", on opening
        Image.open(io.BytesIO(bad_crc))
    assert png_header(bad_crc) is None
    assert png_header(plain[:26] + b"\x01" + plain[27:]) is None  # compression method 1
    assert png_header(plain[:-12]) is None  # no IEND
    assert png_header(b"GIF89a") is None


@pytest.mark.parametrize("decoder", [d for d in DECODERS if d.values[0] != "pillow"])
def test_a_png_taken_without_pillow_decodes_as_through_pillow(decoder, monkeypatch):
    """The same pixels whether the PNG's header is read without Pillow or by Pillow's opening,
    and a chunk before the pixels that Pillow refuses is refused with every decoder."""
    kinds = png_kinds()
    direct = {kind: decode(data, "image", 32, decoder) for kind, data in kinds.items()}
    monkeypatch.setattr("zephon.ops.images.png_header", lambda data: None)
    for kind, data in kinds.items():
        through_pillow = decode(data, "image", 32, decoder)
        as_array = [np.asarray(x) for x in (direct[kind], through_pillow)]
        assert as_array[0].shape == as_array[1].shape and np.array_equal(*as_array), kind
    monkeypatch.undo()
    bad_crc = _bad_gama_crc(kinds["rgb"])
    with pytest.raises(ValueError, match=r"images\(field='image'\): cannot decode the image"):
        Images(size=32, patch=16, decoder=decoder).patches(bad_crc)


def _rgb_png_with(before_pixels: bytes = b"", after: bytes = b"", colour: int = 2) -> bytes:
    """A 4 x 3 RGB PNG (``colour`` 0: grey), written chunk by chunk, with ``before_pixels`` after
    its header."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    width = 4 * (3 if colour == 2 else 1)  # bytes a row
    rows = b"".join(b"\0" + bytes(range(i * width, (i + 1) * width)) for i in range(3))
    header = chunk(b"IHDR", struct.pack(">IIBBBBB", 4, 3, 8, colour, 0, 0, 0))
    pixels, end = chunk(b"IDAT", zlib.compress(rows)), chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + header + before_pixels + pixels + after + end


def damaged_or_unusual_pngs() -> dict[str, bytes]:
    """Chunks before the pixels that Pillow refuses on opening (too short, unreadable, a name that
    is not one), and unusual PNGs it opens (an APNG, a palette in an RGB image, bytes after the
    end, a bytearray): each must come out as through Pillow's opening."""
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    frames = chunk(b"acTL", struct.pack(">II", 1, 0))
    frame = chunk(b"fcTL", struct.pack(">IIIIIHHBB", 0, 4, 3, 0, 0, 1, 10, 0, 0))
    second_header = chunk(b"IHDR", struct.pack(">IIBBBBB", 4, 3, 8, 0, 0, 0, 0))
    short = [(b"gAMA", b"\0\1"), (b"cHRM", bytes(8)), (b"sRGB", b""), (b"pHYs", bytes(4))]
    short += [(b"tRNS", bytes(4)), (b"acTL", bytes(4))]
    cases = {f"{k.decode()} of {len(body)} bytes": _rgb_png_with(chunk(k, body)) for k, body in short}
    cases |= {
        "a chunk named ab-c": _rgb_png_with(chunk(b"ab-c", b"x")),
        "iCCP of compression method 1": _rgb_png_with(chunk(b"iCCP", b"p\0\1" + zlib.compress(b"abc"))),
        "a second header": _rgb_png_with(second_header),
        "grey, tRNS of 1 byte": _rgb_png_with(chunk(b"tRNS", b"\7"), colour=0),
        "grey, tRNS of 2 bytes": _rgb_png_with(chunk(b"tRNS", b"\0\7"), colour=0),
        "an APNG of one frame": _rgb_png_with(frames + frame),
        "a palette in an RGB image": _rgb_png_with(chunk(b"PLTE", bytes(6))),
        "bytes after the end": _rgb_png_with() + b"more",
        "as a bytearray": bytearray(_rgb_png_with(chunk(b"gAMA", (45_455).to_bytes(4, "big")))),
    }
    return cases


@pytest.mark.parametrize("decoder", [d for d in DECODERS if d.values[0] != "pillow"])
def test_a_png_pillow_refuses_on_opening_is_refused_the_same_without_its_opening(decoder, monkeypatch):
    """Every damaged or unusual PNG gives what it gives through Pillow's opening: the same pixels,
    or the same refusal, named as images() names it (Pillow's own ValueErrors, a truncated chunk,
    included)."""

    def outcome(data):
        try:
            return np.asarray(decode(data, "image", 32, decoder)).tobytes()
        except ValueError as e:
            assert str(e).startswith("images(field='image'): cannot decode the image"), str(e)
            return re.sub(r" at 0x[0-9a-f]+", "", str(e))  # Pillow names its file object by address

    cases = damaged_or_unusual_pngs()
    direct = {kind: outcome(data) for kind, data in cases.items()}
    monkeypatch.setattr("zephon.ops.images.png_header", lambda data: None)
    for kind, data in cases.items():
        assert outcome(data) == direct[kind], kind
    refused = {kind for kind, got in direct.items() if isinstance(got, str)}
    assert {"gAMA of 2 bytes", "a chunk named ab-c", "iCCP of compression method 1"} <= refused
    assert "grey, tRNS of 1 byte" in refused
    assert "grey, tRNS of 2 bytes" not in refused
    assert "bytes after the end" not in refused and "as a bytearray" not in refused
