"""Per-step global batch digests, gathered from every rank, written by rank 0.

``batch_digests.jsonl`` holds one line per optimizer step: ``{"step": s, "digest": "...",
"dp": D}``. The digest is zephon's global step digest (SHA-256 of the step's batches in (lane,
index) order), so two runs saw the same data at step ``s`` exactly when their lines agree,
whatever their numbers of GPUs.
"""

from __future__ import annotations

import json
import os

import torch.distributed as dist

from zephon.batch import global_step_digest


class StepDigestWriter:
    def __init__(self, path: str, dp_world_size: int):
        self.path, self.dp = path, dp_world_size

    def write(self, step: int, triples: list[tuple[int, int, str]]) -> None:
        """Collective: every rank calls it with its batches of ``step``."""
        if dist.is_available() and dist.is_initialized():
            gathered: list = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, triples)
            rank = dist.get_rank()
        else:
            gathered, rank = [triples], 0
        if rank != 0:
            return
        unique = {}
        for part in gathered:  # ranks of one TP/CP/PP group send the same batches
            for lane, index, digest in part:
                if unique.setdefault((lane, index), digest) != digest:
                    raise RuntimeError(f"ranks disagree on batch (lane {lane}, index {index})")
        triples = [(lane, index, digest) for (lane, index), digest in unique.items()]
        line = {"step": step, "digest": global_step_digest(triples), "dp": self.dp}
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")
