"""One job plan per job, made by the job's ranks together and the same on all of them.

Without this every rank would list and plan the whole recipe by itself: ranks x (listing pages +
metadata reads) requests against the store at every start. Here global rank 0 lists the datasets
and sends the listing over the process group; every rank reads the metadata of its share of the
files (Parquet footers, Arrow batches, tar headers: none for JSON lines), the ranks exchange what
they read, and each makes the same plan from it (``zephon.jobplan.listing``, ``groups``,
``from_groups``). The store sees one plan's requests per job start, spread over the ranks, so that a
million Parquet files plan at the store's rate rather than at one process's (see
benchmarks/results/scale.md, whose model chose this).

A restart reads the plan saved under the dump folder (``<dump_folder>/zephon/plans/<key>.zplan``,
the key a digest of what the plan depends on) after rank 0 alone lists the datasets again to check
that their files did not change (one listing request per 1,000 files, no metadata read), and sends
it to every rank; if they changed, the ranks plan again, and the restore then refuses the changed
data by name, as always.

A failure to plan on any rank reaches every rank (a RuntimeError naming it), so that no rank waits
for a plan that never comes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time

import torch.distributed as dist

from zephon.jobplan import JobPlan, changes, from_groups, groups, listing
from zephon.pipeline import Pipeline
from zephon.runners import planning_map

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
        return _saved(pipeline, path) or _save(pipeline.plan(), path)
    spec, rank, world = pipeline.spec(), dist.get_rank(), dist.get_world_size()
    datasets, options = spec.source.datasets, spec.options
    start = time.monotonic()
    saved, listed = _on_rank_0(lambda: _saved_or_listing(pipeline, path))
    if saved is not None:
        return JobPlan.from_bytes(saved)
    listed = JobPlan.from_bytes(listed)
    parts = _from_every_rank(
        lambda: groups(listed, datasets, rank, world, options.io, planning_map(options.io))
    )
    plan = from_groups(listed, datasets, parts, time.monotonic() - start)
    if rank == 0:
        log.info("zephon: planned %s in %.1f s, its metadata read by %d ranks", plan.summary(),
                 plan.stats["seconds"], world)  # fmt: skip
        _save(plan, path)
    return plan


def _saved_or_listing(pipeline: Pipeline, path: str) -> list:
    """On rank 0: [the saved plan's bytes, None] where it still holds, else [None, a listing's]."""
    saved = _saved(pipeline, path)
    if saved is not None:
        return [saved.to_bytes(), None]
    spec = pipeline.spec()
    options = spec.options
    listed = listing(
        spec.source.datasets, options.num_lanes, options.chunk_size, options.chunk_bytes, options.io
    )
    return [None, listed.to_bytes()]


def _on_rank_0(make):
    """``make()`` on rank 0, its result sent to every rank; its error raised on every rank."""
    box: list = [None, None]
    if dist.get_rank() == 0:
        try:
            box[0] = make()
        except Exception as e:
            box[1] = f"{type(e).__name__}: {e}"
            dist.broadcast_object_list(box, src=0)  # the other ranks hear of it, then rank 0 raises
            raise
    dist.broadcast_object_list(box, src=0)
    if box[1] is not None:
        raise RuntimeError(f"rank 0 could not plan the job's data: {box[1]}")
    return box[0]


def _from_every_rank(make) -> list:
    """``make()`` on every rank, every rank's result on every rank; any rank's error raised on all."""
    try:
        mine, error = make(), None
    except Exception as e:
        mine, error = None, f"{type(e).__name__}: {e}"
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (mine, error))
    failed = [(rank, e) for rank, (_, e) in enumerate(everyone) if e is not None]
    if failed:
        rank, error = failed[0]
        raise RuntimeError(f"rank {rank} could not plan its share of the job's data: {error}")
    return [part for part, _ in everyone]


def _saved(pipeline: Pipeline, path: str) -> JobPlan | None:
    """The plan saved at ``path`` where the listing says it still holds, else None."""
    if not (path and os.path.exists(path)):
        return None
    spec = pipeline.spec()
    saved = JobPlan.load(path)
    changed = changes(saved, spec.source.datasets, spec.options.io)
    if not changed:
        log.info("zephon: the job plan %s still holds (%s; files listed again)", path, saved.summary())
        return saved
    log.warning("zephon: the data changed since the job plan %s was made (%s): planning again",
                path, "; ".join(changed))  # fmt: skip
    return None


def _save(plan: JobPlan, path: str) -> JobPlan:
    if path:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        plan.save(path)
        log.info("zephon: saved the job plan %s", path)
    return plan
