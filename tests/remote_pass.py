"""One pass over remote datasets in a fresh process (only the disk cache survives between
passes): ``python tests/remote_pass.py SPEC_JSON``; prints the batch digests as JSON."""

from __future__ import annotations

import json
import sys

from zephon import Dataset, Pipeline
from zephon.testing import drain


def main(spec: dict) -> None:
    ds = Dataset.from_path("d", spec["path"], storage_options=spec.get("storage_options"))
    pipeline = (
        Pipeline(ds)
        .options(
            runner=spec.get("runner", "thread"), chunk_size=200, chunk_bytes=1 << 16, io_options=spec["io"]
        )
        .tokenize(spec["tokenizer"], parallelism=2)
        .pack_flat(128)
        .batch(4)
    )
    print(json.dumps([b.digest() for b in drain(pipeline, spec.get("batches", 10**6))]))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
