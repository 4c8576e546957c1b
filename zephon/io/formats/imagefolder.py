"""A folder of images with a captions file: ``metadata.jsonl`` (one JSON object per line with the
image's ``file_name``, relative to the metadata file's folder, and its other fields, such as the
caption), as Hugging Face's ``imagefolder`` lays it out. Local or any fsspec URL.

The metadata file is planned and read as JSON lines; each record gains ``image``: the bytes of its
file. The dataset lists the image files with their sizes and versions when it is resolved; they are
in the recipe's fingerprint (a restore after an image changed names it), and a remote image is read
at its listed version.
"""

from __future__ import annotations

import posixpath

from zephon.io.chunks import Shard
from zephon.io.formats.base import BadRecord, ChunkRead, DataError, content_digest
from zephon.io.formats.lines import JsonLinesFormat

METADATA = ("metadata.jsonl",)
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff")


class ImageFolderFormat(JsonLinesFormat):
    name = "imagefolder"

    def __init__(self, compression: str | None = None):
        super().__init__(compression)
        self.images: dict[str, Shard] = {}  # URL -> the image file's shard, from the listing

    def read(
        self, shard, start, stop, columns, opener, skip_bad: bool = False, digest: str = "xxh3"
    ) -> ChunkRead:
        wanted = None if columns is None else (*(c for c in columns if c != "image"), "file_name")
        lines = super().read(shard, start, stop, wanted, opener, skip_bad, digest)
        records, images = lines.records, []
        folder = shard.url.rsplit("/", 1)[0]
        for i, record in enumerate(records):
            if isinstance(record, BadRecord):
                continue
            try:
                record["image"] = self._image(folder, record, opener)
                images.append(record["image"])
            except ValueError as e:
                if not skip_bad:
                    line = self.line_of(shard, start, stop, i, opener)
                    raise DataError(f"{shard.url}, line {line}: {e}") from None
                records[i] = BadRecord(str(e))
        return ChunkRead(records, content_digest(lines.digest.encode(), *images, algorithm=digest))

    def _image(self, folder: str, record: dict, opener) -> bytes:
        name = record.get("file_name")
        if not isinstance(name, str):
            raise ValueError(f"expected 'file_name', the image's path relative to the folder; got {name!r}")
        url = posixpath.normpath(posixpath.join(folder, name)) if "://" not in folder else f"{folder}/{name}"
        image = self.images.get(url)
        if image is None:
            raise ValueError(f"file_name {name!r}: no such image file in the folder")
        with opener.open(image) as f:
            return f.read()

    def bind(self, images: list[Shard]) -> None:
        """The folder's image files (called by the dataset once it has listed them)."""
        self.images = {s.url: s for s in images}


def is_metadata(url: str) -> bool:
    return posixpath.basename(url) in METADATA


def is_image(url: str) -> bool:
    return url.lower().endswith(IMAGE_SUFFIXES)
