"""TorchTitan's own text loader, unchanged, plus per-step digests: the baseline for comparisons.

Selected with ``[data] loader = "torchtitan"`` and ``dataset_path`` in a job config, so that
the same experiment can be run with TorchTitan's default loader and with zephon's. Its step
digest is the SHA-256 of the sorted row digests of the global batch (it has no lanes), and its
step numbers count from ``first_step`` (it does not know where a resumed run starts).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from torchtitan.hf_datasets.text_datasets import HuggingFaceTextDataLoader

from zephon.torchtitan.digests import StepDigestWriter


class DigestedTextDataLoader(HuggingFaceTextDataLoader):
    @dataclass(kw_only=True, slots=True)
    class Config(HuggingFaceTextDataLoader.Config):
        digest_file: str = ""
        global_batch_size: int = -1
        first_step: int = 1

    def __init__(self, config: Config, *, dp_world_size: int, local_batch_size: int, **kwargs):
        super().__init__(config, dp_world_size=dp_world_size, local_batch_size=local_batch_size, **kwargs)
        batch = config.global_batch_size if config.global_batch_size > 0 else local_batch_size * dp_world_size
        self.per_step = batch // (local_batch_size * dp_world_size)
        self.first_step = config.first_step
        self.digests = StepDigestWriter(config.digest_file, dp_world_size) if config.digest_file else None

    def __iter__(self):
        rows, count, step = [], 0, self.first_step
        for inputs, labels in super().__iter__():
            if self.digests is not None:
                for x, y in zip(inputs["input"], labels, strict=True):
                    rows.append(hashlib.sha256(x.numpy().tobytes() + y.numpy().tobytes()).hexdigest())
                count += 1
                if count == self.per_step:
                    self.digests.write_rows(step, rows)
                    rows, count, step = [], 0, step + 1
            yield inputs, labels
