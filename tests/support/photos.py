"""Image-text pipelines over a few real photographs, for tests that vary one images() setting."""

from __future__ import annotations

import os


def photo_pipelines(folder: str, gpt2: str):
    """``pipeline(**images)``: four photographs in Parquet under ``folder``, through ``images(size=32,
    patch=16, **images)``, GPT-2 captions, rows of 16, batches of 1; each call a new pipeline."""
    from zephon import Dataset, Pipeline
    from zephon.testing.images import photos, write_parquet

    ds = Dataset.from_path("photos", write_parquet(os.path.join(folder, "p.parquet"), photos()[:4]))

    def pipeline(**images):
        p = Pipeline(ds).options(num_lanes=1, chunk_size=2).images(size=32, patch=16, **images)
        return p.tokenize(gpt2, image_token=50256).pack_flat(16).batch(1)

    return pipeline
