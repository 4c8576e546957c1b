"""Image-text data: the three layouts (WebDataset tar shards, Parquet with image bytes, a folder of
images with a metadata.jsonl), local and on S3; the images operator; image tokens in packed rows
and what a training step gets; and the same determinism as text: any DP size, runner and resume
schedule gives the same global steps.

Real images: scikit-learn's handwritten digits and the photographs of scikit-image and
scikit-learn (zephon.testing.images).
"""

from __future__ import annotations

import functools
import io
import itertools
import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image
from support.damage import cut_tar, declared_size, mid_member
from support.exif import STORED, jpeg, quadrants

from zephon import Dataset, MixtureWorkSource, Pipeline
from zephon.fingerprint import of_dataset
from zephon.io.formats import BadRecord, DataError
from zephon.ops.containers import Patches, fresh
from zephon.ops.images import Images
from zephon.testing import check_conformance, drain, run_job
from zephon.testing.images import digits, photos, write_image_folder, write_parquet, write_webdataset

IMAGE_TOKEN = 50257  # one past GPT-2's vocabulary: the id a model adds for image patches
LAYOUTS = ("webdataset", "parquet", "imagefolder")


@pytest.fixture(scope="module")
def samples():
    return digits(240)


@pytest.fixture(scope="module")
def layouts(tmp_path_factory, samples) -> dict[str, str]:
    root = tmp_path_factory.mktemp("vlm")
    write_webdataset(str(root / "wds"), samples, per_shard=80)
    write_parquet(str(root / "digits.parquet"), samples, row_group_size=50)
    write_image_folder(str(root / "folder"), samples)
    return {"webdataset": str(root / "wds"), "parquet": str(root / "digits.parquet"),
            "imagefolder": str(root / "folder")}  # fmt: skip


def dataset(layouts, layout: str, name: str = "digits", **kwargs) -> Dataset:
    fmt = "imagefolder" if layout == "imagefolder" else None
    return Dataset.from_path(name, layouts[layout], format=fmt, **kwargs)


def fields(layout: str) -> tuple[str, str]:
    """(image field, caption field) of a layout's records."""
    return ("png", "txt") if layout == "webdataset" else ("image", "text")


def records(ds: Dataset, **chunking) -> list[dict]:
    table = ds.chunks(1, **chunking)
    return [r for i in range(len(table)) for r in ds.read(table.chunk(0, i))]


def image_bytes(record: dict, field: str) -> bytes:
    value = record[field]
    return value["bytes"] if isinstance(value, dict) else value


def pipeline(ds, layout, gpt2, world=1, rank=0, runner="thread", parallelism=2, lanes=4, **kw):
    image, text = fields(layout)
    p = Pipeline(ds).options(num_lanes=lanes, dp_rank=rank, dp_world_size=world, runner=runner, chunk_size=16)
    p = p.images(
        field=image, size=16, patch=8, resize=kw.get("resize", "crop"), parallelism=parallelism,
        resizer=kw.get("resizer", "pillow"),
    )  # fmt: skip
    p = p.tokenize(gpt2, field=text, image_token=IMAGE_TOKEN, parallelism=parallelism)
    p = p.pack_flat(40, algorithm=kw.get("algorithm", "wrap"))
    return (p.shuffle(kw["shuffle"], seed=3) if kw.get("shuffle") else p).batch(2)


# -- sources ----------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_reads_every_sample_once_in_order_with_its_caption(layouts, samples, layout):
    image, text = fields(layout)
    got = records(dataset(layouts, layout), chunk_size=7)
    assert [r[text] for r in got] == [caption for *_, caption in samples]
    assert [image_bytes(r, image) for r in got] == [data for _, _, data, _ in samples]


def test_tar_samples_are_planned_from_the_headers_into_chunks_of_whole_samples(layouts):
    ds = dataset(layouts, "webdataset")
    table = ds.chunks(1, chunk_size=7)
    assert len(ds.shards()) == 3 and ds.file_format().name == "webdataset"
    assert (table.stop - table.start).max() == 7 and len(table) == 3 * 12  # 80 = 11 * 7 + 3
    first = ds.read(table.chunk(0, 1))
    assert [r["__key__"] for r in first] == [f"digit{i:05d}" for i in range(7, 14)]


@pytest.mark.parametrize(
    ("cut", "message"),
    [
        (mid_member,
         r"the tar ends at byte [\d,]+ inside member 'digit00008\.txt', whose data runs to byte"),
        (lambda d, m: d[: m.offset + 100],
         r"the tar ends at byte 17,508 inside the header at byte 17,408 after member 'digit00008\.png'"),
        (lambda d, m: d[: m.offset],
         r"the tar ends at byte 17,408 after member 'digit00008\.png', without the end-of-archive marker"),
        (lambda d, m: d[: m.offset_data + m.size + 1],
         r"the tar ends at byte [\d,]+ in the padding after member 'digit00008\.txt'"),
        (lambda d, m: declared_size(d, m, 1 << 20),
         r"the tar ends at byte 30,720 inside member 'digit00008\.txt', whose data runs to byte 1,066,"),
        (lambda d, m: d[: m.offset] + b"x" * 512 + d[m.offset_data :],
         r"the 512 bytes at byte 17,408 after member 'digit00008\.png' are not a valid tar header"),
        (lambda d, m: d + b"garbage",
         r"trailing bytes: byte 30,720 is not zero, after the end-of-archive marker at byte 24,576"),
    ],
    ids=["in-member-data", "in-a-header", "at-a-header", "in-padding", "size-past-the-end", "bad-header",
         "trailing-garbage"],
)  # fmt: skip
def test_a_cut_off_or_damaged_tar_is_an_error_naming_the_shard_and_the_place(tmp_path, samples, cut, message):
    ds = Dataset.from_path("cut", cut_tar(str(tmp_path), samples, cut))
    with pytest.raises(DataError, match=r"/shard-00000\.tar: (truncated: )?" + message) as error:
        records(ds, chunk_size=4)
    assert "on_error='skip'" in str(error.value)


def test_a_cut_off_tar_skipping_bad_records_delivers_its_whole_samples_and_counts_one(
    tmp_path, gpt2, samples
):
    path = tmp_path / "w" / "shard-00000.tar"
    cut_tar(str(tmp_path / "w"), samples, mid_member)
    ds = Dataset.from_path("cut", str(path), on_error="skip")
    assert [r["__key__"] for r in records(ds) if not isinstance(r, BadRecord)] == [
        f"digit{i:05d}" for i in range(8)
    ]
    p = pipeline(ds, "webdataset", gpt2, lanes=1)
    got = drain(p, 50)
    images = sum(int(b.vision.mask.sum()) for b in got) // 4  # 4 tokens per 16 x 16 image
    assert p.stats()["counters"]["skipped_records"] == 1 and images == 8
    with pytest.raises(DataError, match=r"shard-00000\.tar: truncated: the tar ends at byte"):
        drain(pipeline(Dataset.from_path("cut", str(path)), "webdataset", gpt2, lanes=1), 50)


@pytest.mark.slow  # waits on timeouts or servers by design: seconds
def test_image_layouts_on_s3_read_the_same_samples(s3, layouts, samples):
    import boto3

    _, storage = s3
    client = boto3.client("s3", **storage["client_kwargs"])
    for folder, _, files in os.walk(layouts["imagefolder"]):
        for name in files:
            path = os.path.join(folder, name)
            key = "imgs/" + os.path.relpath(path, layouts["imagefolder"])
            client.upload_file(path, "corpus", key)
    for name in sorted(os.listdir(layouts["webdataset"])):
        client.upload_file(os.path.join(layouts["webdataset"], name), "corpus", f"wds/{name}")
    tars = Dataset.from_path("t", "s3://corpus/wds/", storage_options=storage)
    folder = Dataset.from_path("f", "s3://corpus/imgs/", format="imagefolder", storage_options=storage)
    captions = [caption for *_, caption in samples]
    assert [r["txt"] for r in records(tars, chunk_size=16)] == captions
    got = records(folder, chunk_bytes=1024)
    assert [r["text"] for r in got] == captions
    assert [r["image"] for r in got] == [data for _, _, data, _ in samples]


def test_a_changed_image_in_a_folder_changes_the_recipe(tmp_path, samples):
    write_image_folder(str(tmp_path), samples[:5])
    before = of_dataset(Dataset.from_path("f", str(tmp_path), format="imagefolder"))
    path = tmp_path / "images" / "digit00003.png"
    path.write_bytes(samples[4][2])
    os.utime(path, (1, 1))
    after = of_dataset(Dataset.from_path("f", str(tmp_path), format="imagefolder"))
    assert before != after


def test_a_folder_without_metadata_and_a_missing_image_are_named(tmp_path, samples):
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "a.png").write_bytes(samples[0][2])
    with pytest.raises(ValueError, match=r"format='imagefolder' reads a folder with a metadata\.jsonl"):
        Dataset.from_path("f", str(tmp_path / "bare"), format="imagefolder").shards()
    write_image_folder(str(tmp_path / "f"), samples[:5])
    os.remove(tmp_path / "f" / "images" / "digit00002.png")
    ds = Dataset.from_path("f", str(tmp_path / "f"), format="imagefolder")
    with pytest.raises(ValueError, match=r"metadata\.jsonl, line 3: file_name 'images/digit00002\.png'"):
        records(ds)


# -- the images operator -----------------------------------------------------------------------


def test_crop_patches_are_the_centre_square_cut_row_by_row():
    data = next(p[2] for p in photos() if p[0] == "chelsea")
    op = Images(size=64, patch=16)
    patches = op.patches(data)
    assert patches.pixels.shape == (16, 16 * 16 * 3) and patches.grid[:, 1:].tolist() == [[4, 4]] * 16
    image = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = image.size
    scale = 64 / min(w, h)
    sw, sh = max(64, round(w * scale)), max(64, round(h * scale))
    left, top = (sw - 64) // 2, (sh - 64) // 2
    want = np.asarray(image.resize((sw, sh), Image.BICUBIC).crop((left, top, left + 64, top + 64)))
    rebuilt = patches.pixels.reshape(4, 4, 16, 16, 3).transpose(0, 2, 1, 3, 4).reshape(64, 64, 3)
    assert np.array_equal(rebuilt, want)


def test_fit_keeps_the_aspect_in_whole_patches():
    china = next(p for p in photos() if p[0] == "china")  # 640 x 427
    patches = Images(size=64, patch=8, resize="fit").patches(china[2])
    assert patches.grid[0].tolist() == [0, 5, 8] and len(patches) == 40
    assert patches.grid[:, 0].tolist() == list(range(40))


@pytest.mark.parametrize("resize", ["crop", "fit"])
@pytest.mark.parametrize("orientation", sorted(STORED))
def test_a_jpeg_is_turned_upright_by_its_exif_orientation(orientation, resize):
    op = Images(size=32, patch=8, resize=resize)  # JPEG draft decoding at a quarter of the size
    upright = op.patches(jpeg(quadrants()))
    turned = op.patches(jpeg(STORED[orientation](quadrants()), orientation))
    assert turned.grid.tolist() == upright.grid.tolist()
    difference = np.abs(turned.pixels.astype(int) - upright.pixels.astype(int))
    assert difference.mean() < 2 and difference.max() < 64


def test_an_image_without_an_exif_orientation_or_upright_is_decoded_as_stored():
    op = Images(size=32, patch=8, resize="fit")
    sideways = STORED[6](quadrants())
    plain, tagged = op.patches(jpeg(sideways)), op.patches(jpeg(sideways, 1))
    assert plain.grid[0].tolist() == [0, 4, 2] and np.array_equal(plain.pixels, tagged.pixels)


def test_the_stored_view_agrees_with_pillows_exif_transpose():
    from PIL import ImageOps

    for orientation, stored in STORED.items():
        shown = ImageOps.exif_transpose(Image.open(io.BytesIO(jpeg(stored(quadrants()), orientation))))
        assert np.abs(np.asarray(shown).astype(int) - quadrants()).mean() < 2, orientation


def test_a_checkpoint_from_before_images_were_turned_upright_is_refused_by_name(layouts, gpt2):
    p = pipeline(dataset(layouts, "parquet"), "parquet", gpt2, lanes=1)
    drain(p, 1)
    state = p.state_dict()
    images = next(op for op in state["fingerprint"]["operators"] if op["kind"] == "images")
    del images["orientation"]  # as saved before EXIF orientations were applied
    with pytest.raises(ValueError, match=r"operators\[\d\]\.orientation: '<absent>' -> 'exif'"):
        pipeline(dataset(layouts, "parquet"), "parquet", gpt2, lanes=1).load_state_dict(state)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"size": 20, "patch": 8}, r"size must be a multiple of patch"),
        ({"resize": "stretch"}, r"resize='stretch'"),
        ({"std": (1, 0, 1)}, r"std"),
        ({"patch": 0}, r"patch=0"),
    ],
)
def test_bad_image_settings_are_explained(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Images(**kwargs)


def test_a_misspelt_image_field_is_named_at_planning(layouts, gpt2):
    p = pipeline(dataset(layouts, "webdataset"), "parquet", gpt2)  # 'image', where tar samples have 'png'
    message = r"images\(field='image'\), but no dataset has such a field: .*'png'"
    with pytest.raises(ValueError, match=message):
        drain(p, 1)


def test_tokenize_after_images_needs_an_image_token(layouts, gpt2):
    p = Pipeline(dataset(layouts, "parquet")).images()
    with pytest.raises(ValueError, match=r"pass tokenize\(image_token=\.\.\.\)"):
        p.tokenize(gpt2)
    with pytest.raises(ValueError, match=r"not a token of"):
        p.tokenize(gpt2, image_token="<image>")
    assert p.tokenize(gpt2, image_token="<|endoftext|>").operators[-1].image_id == 50256


def test_an_image_that_cannot_be_decoded_is_named_by_file_and_sample_or_skipped(tmp_path, gpt2, samples):
    broken = [*samples[:20]]
    broken[5] = (broken[5][0], "png", b"\x89PNG not really", broken[5][3])
    write_webdataset(str(tmp_path / "bad"), broken, per_shard=20)
    ds = Dataset.from_path("bad", str(tmp_path / "bad"))
    with pytest.raises(ValueError, match=r"shard-00000\.tar, row 5: images\(field='png'\): cannot decode"):
        drain(pipeline(ds, "webdataset", gpt2, lanes=1), 50)
    skipping = Dataset.from_path("bad", str(tmp_path / "bad"), on_error="skip")
    p = pipeline(skipping, "webdataset", gpt2, lanes=1)
    got = drain(p, 50)
    images = sum(int(b.vision.mask.sum()) for b in got) // 4  # 4 tokens per 16 x 16 image
    assert p.stats()["counters"]["skipped_records"] == 1 and images == 19


# -- rows, batches and what a training step gets ----------------------------------------------------


def test_a_document_is_its_image_tokens_then_its_caption_and_eos(tmp_path, gpt2, samples):
    from zephon.io.tokenizer import load_tokenizer

    one_chunk = Dataset.from_path("d", write_parquet(str(tmp_path / "d.parquet"), samples[:10]))
    p = pipeline(one_chunk, "parquet", gpt2, lanes=1)
    batch = drain(p, 1)[0]
    tok = load_tokenizer(gpt2)
    first = [*([IMAGE_TOKEN] * 4), *tok.encode_batch([samples[0][3]])[0], tok.eos_id]
    assert batch.tokens[0, : len(first)].tolist() == first
    assert batch.vision.mask[0, :4].all() and not batch.vision.mask[0, 4 : len(first)].any()
    want = Images(size=16, patch=8).patches(samples[0][2])
    assert np.array_equal(batch.vision.row(0).pixels[:4], want.pixels)


def test_training_inputs_carry_one_normalized_patch_per_image_token_and_no_loss_on_them(layouts, gpt2):
    p = pipeline(dataset(layouts, "webdataset"), "webdataset", gpt2, lanes=2, shuffle=4)
    for batch in drain(p, 12):
        t = batch.to_training()
        mask = t["image_mask"]
        assert np.array_equal(mask, t["input_ids"] == IMAGE_TOKEN)
        assert len(t["pixel_values"]) == mask.sum() and t["pixel_values"].shape[1:] == (8, 8, 3)
        assert (t["labels"][np.roll(mask, -1, axis=1) & (np.arange(40) < 39)] == -100).all()
        assert (t["labels"][:, -1][batch.vision.mask[:, -1]] == -100).all()
        assert t["pixel_values"].min() >= -1.0 and t["pixel_values"].max() <= 1.0
        spans = t["image_spans"]  # row, start, tokens, first patch, grid h, grid w
        assert spans[:, 2].sum() == mask.sum()
        for row, start, count, first, gh, gw in spans.tolist():
            assert mask[row, start : start + count].all() and gh == gw == 2 and first + count <= 4
        raw = batch.vision.patches.pixels[np.nonzero(batch.vision.mask)[1] < 40]  # inputs' patches
        assert np.allclose(t["pixel_values"].reshape(len(raw), -1), raw / 127.5 - 1, atol=1e-6)


def test_training_pixels_are_normalized_in_one_float_array_with_the_formulas_very_values(layouts, gpt2):
    import tracemalloc

    image, text = fields("webdataset")
    p = Pipeline(dataset(layouts, "webdataset")).options(num_lanes=1, runner="inline", chunk_size=16)
    p = p.images(field=image, size=64, patch=32).tokenize(gpt2, field=text, image_token=IMAGE_TOKEN)
    batch = drain(p.pack_flat(400).batch(2), 1)[0]  # 32x32 patches: the pixels outweigh all else
    batch.normalize = ((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711))
    tracemalloc.start()  # numpy reports its arrays' memory to it
    try:
        t = batch.to_training()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    values, mask = t["pixel_values"], batch.vision.mask
    raw = batch.vision.patches.pixels[np.nonzero(mask)[1] < mask.shape[1] - 1].reshape(values.shape)
    mean, std = (np.asarray(v, np.float32) for v in batch.normalize)
    want = (raw.astype(np.float32) / 255.0 - mean) / std
    assert values.dtype == np.float32 and np.array_equal(values, want)
    # the float pixels and their uint8 source at most, never a second float array at once
    assert values.nbytes > 1 << 20 and peak < 1.25 * (values.nbytes + raw.nbytes), (peak, values.nbytes)


def test_a_text_dataset_mixed_with_an_image_dataset_by_tokens(layouts, gpt2, corpus):
    text = Dataset.from_path("text", corpus, exhausted="repeat")
    images = dataset(layouts, "webdataset", exhausted="repeat")
    source = MixtureWorkSource([text, images], {"text": 0.5, "digits": 0.5},
                                     unit="tokens", seed=1)  # fmt: skip
    p = (
        Pipeline(source).options(num_lanes=2, runner="thread", chunk_size=16, chunk_bytes=4096)
        .images(field="png", size=16, patch=8).tokenize(gpt2, field="text", image_token=IMAGE_TOKEN)
        .pack_flat(64).batch(4)
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"has no such column; its columns are \['__key__', 'png', 'txt'\]"):
        drain(p, 4)  # tar samples call the caption 'txt'
    fix = Dataset.from_path("digits", layouts["parquet"], exhausted="repeat")
    source = MixtureWorkSource([text, fix], {"text": 0.5, "digits": 0.5},
                                     unit="tokens", seed=1)  # fmt: skip
    p = (
        Pipeline(source).options(num_lanes=2, runner="thread", chunk_size=16, chunk_bytes=4096)
        .images(size=16, patch=8).tokenize(gpt2, image_token=IMAGE_TOKEN).pack_flat(64).batch(4)
    )  # fmt: skip
    got = drain(p, 40)
    shares = sum(b.tokens_per_dataset(2) for b in got) / sum(b.tokens.size for b in got)
    assert abs(shares[1] - 0.5) < 0.02
    image_rows = [b.vision.mask.any(axis=1) for b in got]
    assert all(b.vision is not None for b in got) and np.concatenate(image_rows).any()
    for b in got:  # image tokens only where the digits are
        assert (b.sources[b.vision.mask] == 1).all()


def test_every_batch_of_an_image_pipeline_has_image_inputs_even_without_images(gpt2, corpus):
    text = Dataset.from_path("text", corpus, exhausted="repeat")
    p = (
        Pipeline(text).options(num_lanes=1, chunk_bytes=4096)
        .images(size=16, patch=8).tokenize(gpt2, image_token=IMAGE_TOKEN).pack_flat(64).batch(2)
    )  # fmt: skip
    t = drain(p, 1)[0].to_training()
    assert t["pixel_values"].shape == (0, 8, 8, 3) and not t["image_mask"].any()
    assert t["image_spans"].shape == (0, 6)


# -- determinism ----------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_image_text_steps_are_the_same_on_any_dp_size_runner_and_resume(layouts, gpt2, layout):
    ds = dataset(layouts, layout, exhausted="repeat")

    def make(runner):
        return lambda world, rank: pipeline(ds, layout, gpt2, world, rank, runner, lanes=4, shuffle=6)

    want, _ = run_job(make("inline"), 1, 6, per_lane=2)
    assert run_job(make("thread"), 4, 6, per_lane=2)[0] == want
    first, state = run_job(make("process"), 2, 3, per_lane=2)
    rest, _ = run_job(make("thread"), 4, 3, per_lane=2, state=state)
    assert {**first, **rest} == want
    assert len(set(want.values())) == 6


def test_with_the_torch_resizer_steps_are_the_same_on_any_dp_size_runner_and_resume(layouts, gpt2):
    ds = dataset(layouts, "parquet", exhausted="repeat")

    def make(runner, resizer="torch"):
        return lambda world, rank: pipeline(ds, "parquet", gpt2, world, rank, runner, resizer=resizer)

    want, _ = run_job(make("inline"), 1, 4, per_lane=2)
    first, state = run_job(make("process"), 2, 2, per_lane=2)
    rest, _ = run_job(make("thread"), 4, 2, per_lane=2, state=state)
    assert {**first, **rest} == want
    assert run_job(make("inline", "pillow"), 1, 4, per_lane=2)[0] != want, "the pixels are in the digests"


def test_image_text_pipelines_restore_at_every_step(layouts, gpt2):
    ds = dataset(layouts, "webdataset", exhausted="repeat")
    check_conformance(lambda: pipeline(ds, "webdataset", gpt2, lanes=2, shuffle=4, algorithm="best_fit"), 10)


def test_pixels_are_part_of_the_digest(layouts, gpt2):
    ds = dataset(layouts, "parquet", exhausted="repeat")
    a = drain(pipeline(ds, "parquet", gpt2, lanes=1), 1)[0]
    b = drain(pipeline(ds, "parquet", gpt2, lanes=1), 1)[0]
    assert a.digest() == b.digest()
    b.vision.patches.pixels[0, 0] ^= 1
    assert a.digest() != b.digest()


def _mapping(array: np.ndarray) -> dict[str, list[str]]:
    """The /proc/self/smaps entry of the mapping that holds the middle of ``array``'s memory."""
    address, entry = array.__array_interface__["data"][0] + array.nbytes // 2, None
    with open("/proc/self/smaps") as f:
        for line in f:
            name, *rest = line.split()
            if "-" in name and not name.endswith(":"):
                lo, hi = (int(x, 16) for x in name.split("-"))
                entry = {} if lo <= address < hi else None
            elif entry is not None:
                entry[name] = rest
                if name == "VmFlags:":
                    return entry
    raise AssertionError("no mapping holds the array")


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="Linux's /proc tells the page sizes")
def test_a_windows_patches_are_copied_into_memory_of_small_pages():
    # where numpy would ask for huge pages (MADV_HUGEPAGE, the 'hg' flag) the window's patches go
    # to memory of ordinary pages; small arrays stay numpy's
    items = [Patches(np.full((4000, 768), k, np.uint8), np.zeros((4000, 3), np.int32)) for k in range(3)]
    window = Patches.concat(items, 768)
    assert window.pixels.shape == (12000, 768) and window.pixels.flags.writeable
    assert [int(window.pixels[i * 4000 + 7, 5]) for i in range(3)] == [0, 1, 2]
    mapping = _mapping(window.pixels)
    assert "hg" not in mapping["VmFlags:"] and mapping["AnonHugePages:"][0] == "0"
    numpys = np.ones(window.pixels.nbytes, np.uint8)  # as numpy allocates it, same size
    if np._core.multiarray._get_madvise_hugepage():
        assert "hg" in _mapping(numpys)["VmFlags:"]
    small = fresh((10, 768), np.uint8)
    assert small.base is None and small.shape == (10, 768)


@functools.cache
def _make(root: str, layout: str, gpt2: str, recipe: tuple, runner: str, parallelism: int):
    lanes, algorithm, shuffle, resize, _ = recipe
    ds = dataset(json.loads(root), layout, exhausted="repeat")

    def make(world: int, rank: int) -> Pipeline:
        return pipeline(ds, layout, gpt2, world, rank, runner, parallelism, lanes,
                        algorithm=algorithm, shuffle=shuffle, resize=resize)  # fmt: skip

    return make


@pytest.mark.slow  # waits on timeouts or servers by design: seconds
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_image_recipe_topology_runner_and_resume_schedule_gives_the_uninterrupted_steps(
    layouts, gpt2, data
):
    lanes = data.draw(st.sampled_from([1, 2, 4]), label="num_lanes")
    layout = data.draw(st.sampled_from(LAYOUTS), label="layout")
    recipe = (
        lanes,
        data.draw(st.sampled_from(["wrap", "best_fit"]), label="packing"),
        data.draw(st.sampled_from([0, 4]), label="shuffle"),
        data.draw(st.sampled_from(["crop", "fit"]), label="resize"),
        data.draw(st.integers(1, 2), label="batches per lane per step"),
    )
    root = json.dumps(layouts)
    steps = 4
    cuts = sorted(data.draw(st.sets(st.integers(1, steps - 1), max_size=2), label="resume after steps"))
    digests, state = {}, None
    for a, b in itertools.pairwise([0, *cuts, steps]):
        world = data.draw(st.sampled_from([d for d in (1, 2, 4) if lanes % d == 0]), label="DP size")
        runner = data.draw(st.sampled_from(["inline", "thread", "process"]), label="runner")
        make = _make(root, layout, gpt2, recipe, runner, data.draw(st.integers(1, 2), label="parallelism"))
        got, state = run_job(make, world, b - a, recipe[-1], state=state)
        digests.update(got)
    want, _ = run_job(_make(root, layout, gpt2, recipe, "inline", 1), 1, steps, recipe[-1])
    assert digests == want
