"""Per-step global batch digests, gathered from every rank, written by rank 0.

``batch_digests.jsonl`` holds one line per optimizer step: ``{"step": s, "digest": "...",
"dp": D}``, plus ``"data_step": d`` where step ``s`` trained on the data of step ``d`` of a run
without skips (``[data] skip_steps``; absent where ``d == s``). The digest is zephon's global
step digest (SHA-256 of the step's batches in (lane, index) order), so two runs saw the same data
at step ``s`` exactly when their lines agree, whatever their numbers of GPUs.
"""

from __future__ import annotations

import hashlib
import json
import os

import torch.distributed as dist

from zephon.batch import global_step_digest


class StepDigestWriter:
    def __init__(self, path: str, dp_world_size: int):
        self.path, self.dp = path, dp_world_size

    def write(self, step: int, triples: list[tuple[int, int, str]], data_step: int | None = None) -> None:
        """Collective: every rank calls it with its batches of ``step`` as (lane, index, digest);
        ``data_step``: the step of a run without skips whose data they are, if not ``step``."""
        gathered = _gather(triples)
        if gathered is None:
            return
        unique = {}
        for part in gathered:  # ranks of one TP/CP/PP group send the same batches
            for lane, index, digest in part:
                if unique.setdefault((lane, index), digest) != digest:
                    raise RuntimeError(f"ranks disagree on batch (lane {lane}, index {index})")
        triples = [(lane, index, digest) for (lane, index), digest in unique.items()]
        self._append(step, global_step_digest(triples), data_step)

    def write_rows(self, step: int, rows: list[str]) -> None:
        """Collective, for loaders without lanes: the digest of the sorted row digests of all
        ranks (ranks of one TP/CP/PP group send the same rows: counted once)."""
        gathered = _gather(rows)
        if gathered is None:
            return
        seen, unique = set(), []
        for rank_rows in gathered:
            key = tuple(rank_rows)
            if key not in seen:
                seen.add(key)
                unique += rank_rows
        h = hashlib.sha256()
        for digest in sorted(unique):
            h.update(bytes.fromhex(digest))
        self._append(step, h.hexdigest())

    def _append(self, step: int, digest: str, data_step: int | None = None) -> None:
        line = {"step": step, "digest": digest, "dp": self.dp}
        if data_step is not None and data_step != step:
            line["data_step"] = data_step
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")


def _gather(item) -> list | None:
    """Every rank's ``item`` on rank 0, None elsewhere."""
    if not (dist.is_available() and dist.is_initialized()):
        return [item]
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, item)
    return gathered if dist.get_rank() == 0 else None
