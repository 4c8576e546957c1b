"""One job plan per job: global rank 0 makes it, every rank gets it over the process group.

Without this every rank would list and plan the whole recipe by itself: ranks x (listing pages +
metadata reads) requests against the store at every start. Here the store sees one plan's
requests per job start, and a restart reads the plan saved under the dump folder
(``<dump_folder>/zephon/plans/<key>.zplan``, the key a digest of what the plan depends on) after
rank 0 alone lists the datasets again to check that their files did not change (one listing
request per 1,000 files, no metadata read); if they did, it plans again, and the restore then
refuses the changed data by name, as always.

Rank 0's failure to plan reaches every rank (as a RuntimeError naming it), so that no rank waits
for a plan that never comes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os

import torch.distributed as dist

from zephon.jobplan import JobPlan, changes
from zephon.pipeline import Pipeline

log = logging.getLogger(__name__)


def plan_path(folder: str, pipeline: Pipeline) -> str:
    """Where a job keeps the plan of ``pipeline``'s recipe: named by what the plan depends on."""
    identity = pipeline.spec().plan_identity()
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return os.path.join(folder, f"{key}.zplan")


def shared_plan(pipeline: Pipeline, path: str) -> JobPlan:
    """The job's plan for ``pipeline``'s recipe, the same on every rank. ``path``: where it is
    kept between starts ("" keeps it in memory only)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return _plan(pipeline, path)
    box: list = [None, None]
    if dist.get_rank() == 0:
        try:
            box[0] = _plan(pipeline, path).to_bytes()
        except Exception as e:
            box[1] = f"{type(e).__name__}: {e}"
            dist.broadcast_object_list(box, src=0)  # the other ranks hear of it, then rank 0 raises
            raise
    dist.broadcast_object_list(box, src=0)
    if box[1] is not None:
        raise RuntimeError(f"rank 0 could not plan the job's data: {box[1]}")
    return JobPlan.from_bytes(box[0])


def _plan(pipeline: Pipeline, path: str) -> JobPlan:
    """The saved plan where the listing says it still holds, else a new one (saved)."""
    spec = pipeline.spec()
    if path and os.path.exists(path):
        saved = JobPlan.load(path)
        changed = changes(saved, spec.source.datasets, spec.options.io)
        if not changed:
            log.info(
                "zephon: the job plan %s still holds (%s; its files listed again)", path, saved.summary()
            )
            return saved
        log.warning(
            "zephon: the data changed since the job plan %s was made: %s; planning again",
            path,
            "; ".join(changed),
        )
    plan = pipeline.plan()
    if path:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        plan.save(path)
        log.info("zephon: saved the job plan %s", path)
    return plan
