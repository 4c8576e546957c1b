"""This project, as its README shows it: a token mixture, ``pack_flat``, a row shuffle, batches.

``setup.options["backend"]``: ``"auto"`` (fastokens where verified exact) or ``"tokenizers"``.
With ``setup.image_size``: one image-text dataset, ``images`` then ``tokenize`` (README, image-text
data), on ``setup.workers`` workers each.
"""

from __future__ import annotations

import json

from benchmarks.peers.common import Out, Setup


def pipeline(setup: Setup, **options):
    from zephon import Dataset, MixtureWorkSource, Pipeline

    datasets = [Dataset.from_path(name, path, exhausted="repeat") for name, path in setup.files.items()]
    source = MixtureWorkSource(datasets, setup.weights, unit="tokens", seed=setup.seed)
    backend = setup.options.get("backend", "auto")
    return (
        Pipeline(source)
        .options(num_lanes=setup.lanes, runner=setup.method, **options)
        .tokenize(setup.tokenizer, parallelism=setup.workers, backend=backend)
        .pack_flat(setup.seq_len)
        .shuffle(setup.shuffle, seed=setup.seed)
        .batch(setup.microbatch)
    )


def image_pipeline(setup: Setup):
    from zephon import Dataset, Pipeline

    [(name, path)] = setup.files.items()
    return (
        Pipeline(Dataset.from_path(name, path, exhausted="repeat"))
        .options(num_lanes=setup.lanes, runner=setup.method)
        .images(
            size=setup.image_size,
            patch=setup.patch,
            parallelism=setup.workers,
            decoder=setup.options.get("decoder", "pillow"),
            resizer=setup.options.get("resizer", "pillow"),
        )
        .tokenize(setup.tokenizer, image_token=setup.image_token, parallelism=setup.workers)
        .pack_flat(setup.seq_len)
        .shuffle(setup.shuffle, seed=setup.seed)
        .batch(setup.microbatch)
    )


def batches(setup: Setup):
    p = image_pipeline(setup) if setup.image_size else pipeline(setup)
    try:
        for batch in p:
            yield Out(batch.tokens, batch.sources >= 0)
    finally:
        p.close()


def state_bytes(setup: Setup, batches_taken: int = 40) -> int:
    """The largest lane's checkpoint state, in bytes of JSON, after some batches."""
    from zephon.testing import take

    p = pipeline(setup)
    take(p, batches_taken)
    state = p.state_dict()
    p.close()
    return max(len(json.dumps(lane)) for lane in state["lanes"].values())
