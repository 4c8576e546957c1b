"""Real images for tests and benchmarks, from packages on PyPI, written as image-text datasets.

- ``digits()``: scikit-learn's 1,797 handwritten digits (8 x 8 scans, 17 grey levels, from the UCI
  set), each a PNG with the caption "a handwritten digit N".
- ``photos()``: the photographs scikit-image ships (astronaut, coffee, a cat, rockets, the Hubble
  deep field, ...) and scikit-learn's two JPEG photos, each with a caption made of its name.

Writers lay samples out as WebDataset tar shards, a Parquet file with a Hugging Face style image
column (``{"bytes", "path"}``), or a folder of images with a metadata.jsonl.
"""

from __future__ import annotations

import csv
import gzip
import importlib.util
import io
import json
import os
import tarfile

Sample = tuple[str, str, bytes, str]  # key, image extension, encoded image, caption


def _package_dir(name: str) -> str:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the test images come from the package {name!r}: pip install -e '.[test]'")
    return spec.submodule_search_locations[0]


def digits(limit: int | None = None) -> list[Sample]:
    """scikit-learn's handwritten digits as PNGs, with captions."""
    import numpy as np
    from PIL import Image

    path = os.path.join(_package_dir("sklearn"), "datasets", "data", "digits.csv.gz")
    with gzip.open(path, "rt") as f:
        rows = [list(map(float, row)) for row in csv.reader(f)]
    out = []
    for i, row in enumerate(rows[:limit]):
        pixels = (np.asarray(row[:64]).reshape(8, 8) * (255 / 16)).round().astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels, "L").save(buffer, "PNG")
        out.append((f"digit{i:05d}", "png", buffer.getvalue(), f"a handwritten digit {int(row[64])}"))
    return out


def photos() -> list[Sample]:
    """The photographs shipped by scikit-image and scikit-learn, with their names as captions."""
    files = []
    sk = os.path.join(_package_dir("skimage"), "data")
    files += [os.path.join(sk, n) for n in sorted(os.listdir(sk)) if n.endswith((".png", ".jpg"))]
    sl = os.path.join(_package_dir("sklearn"), "datasets", "images")
    files += [os.path.join(sl, n) for n in sorted(os.listdir(sl)) if n.endswith(".jpg")]
    out = []
    for path in files:
        stem, ext = os.path.splitext(os.path.basename(path))
        with open(path, "rb") as f:
            data = f.read()
        out.append((stem, ext[1:], data, f"a photograph: {stem.replace('_', ' ')}"))
    return out


def write_webdataset(folder: str, samples: list[Sample], per_shard: int) -> list[str]:
    """Tar shards of ``per_shard`` samples: ``KEY.png`` (or .jpg) and ``KEY.txt``."""
    os.makedirs(folder, exist_ok=True)
    paths = []
    for n, at in enumerate(range(0, len(samples), per_shard)):
        path = os.path.join(folder, f"shard-{n:05d}.tar")
        with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tar:
            for key, ext, data, caption in samples[at : at + per_shard]:
                for name, blob in ((f"{key}.{ext}", data), (f"{key}.txt", caption.encode())):
                    info = tarfile.TarInfo(name)
                    info.size, info.mtime = len(blob), 0
                    tar.addfile(info, io.BytesIO(blob))
        paths.append(path)
    return paths


def write_parquet(path: str, samples: list[Sample], row_group_size: int = 64) -> str:
    """One Parquet file: ``image`` ({"bytes", "path"}, as a Hugging Face Image column) and ``text``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({
        "image": [{"bytes": data, "path": f"{key}.{ext}"} for key, ext, data, _ in samples],
        "text": [caption for *_, caption in samples],
    })  # fmt: skip
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def write_image_folder(folder: str, samples: list[Sample]) -> str:
    """Images in ``folder/images/`` and ``folder/metadata.jsonl`` (file_name, text)."""
    os.makedirs(os.path.join(folder, "images"), exist_ok=True)
    with open(os.path.join(folder, "metadata.jsonl"), "w") as meta:
        for key, ext, data, caption in samples:
            name = f"images/{key}.{ext}"
            with open(os.path.join(folder, name), "wb") as f:
                f.write(data)
            meta.write(json.dumps({"file_name": name, "text": caption}) + "\n")
    return folder
