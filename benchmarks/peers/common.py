"""What every system in the throughput benchmark is given, and what it gives back.

A system module (``benchmarks/peers/<name>.py``) defines ``batches(setup: Setup)``, a generator of
:class:`Out` (one microbatch each), built as that system's documentation recommends, from the
JSON lines files in ``setup.files``, with the ``tokenizer.json`` in ``setup.tokenizer``, packing
documents into rows of ``setup.seq_len + 1`` tokens (EOS after each document), shuffling with a
buffer of ``setup.shuffle`` rows or documents where the system can, mixing the datasets by
``setup.weights`` (token ratios where the system can, else its own notion, said in its module
docstring), ``setup.microbatch`` rows per batch, ``setup.workers`` workers (threads or processes,
``setup.method``). Optional: ``state_bytes(iterator)`` (a checkpoint's size) where the system has
a checkpoint.

The image-text benchmark (``benchmarks/vlm.py``) gives ``setup.image_size`` > 0: then
``setup.files`` holds one Parquet file of encoded images and captions (``zephon.testing.images``),
and a document is one placeholder token (``setup.image_token``) per ``setup.patch`` square of the
image, cut from its centre ``image_size`` square (``zephon.ops.images.Images``), then the caption's
tokens and EOS.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Setup:
    files: dict[str, str]  # dataset name -> JSON lines file (records with "text")
    weights: dict[str, float]  # mixture weights, by tokens where the system can
    tokenizer: str  # a folder with tokenizer.json (GPT-2 BPE)
    seq_len: int = 2048  # rows hold seq_len + 1 tokens: inputs and labels shifted by one
    microbatch: int = 8
    shuffle: int = 256
    lanes: int = 8  # logical streams, for the systems that have them
    workers: int = 2
    method: str = "thread"  # thread | process | inline
    seed: int = 0
    options: dict = field(default_factory=dict)  # system-specific, e.g. {"backend": "fast"}
    image_size: int = 0  # > 0: image-text documents, images cut to this size (see above)
    patch: int = 16  # the side of an image patch, in pixels
    image_token: int = 50257  # the id of an image patch's placeholder: one past GPT-2's vocabulary
    copies: int = 1  # each file holds its documents this many times over (throughput.py --copies)

    @property
    def tokenizer_json(self) -> str:
        return os.path.join(self.tokenizer, "tokenizer.json")


@dataclass
class Out:
    """One microbatch: ``tokens`` int [B, seq_len + 1] (or [B, seq_len] with ``labels`` beside),
    and ``valid``: bool, same shape, False on padding."""

    tokens: np.ndarray
    valid: np.ndarray
