"""`ZephonDataLoader`: TorchTitan's dataloader slot, filled by a zephon recipe.

TorchTitan builds it with the rank's ``dp_rank``/``dp_world_size`` and its ``seq_len`` and
``local_batch_size``. Every batch it yields is one zephon microbatch of ``local_batch_size``
rows from one lane: a global step of ``G`` sequences takes ``G / (num_lanes * local_batch_size)``
batches from every lane, whatever the DP size, so the step's global batch is the same on any
number of ranks.

Checkpoint state goes into TorchTitan's DCP checkpoint as one key per lane (``lane_00003``) plus
``meta`` (recipe fingerprint, global batch size), each a single JSON string: each rank saves the
lanes it owns, and a job resumed on any allowed DP size asks for exactly the lanes it now owns.
``meta`` also records the skipped steps already applied (``skip_steps``, see
zephon.torchtitan.skips), so a resume on any DP size gives every later step the same data.

At the last microbatch of every log step (``log_freq``) the ranks gather the global per-dataset
token counts that ``data_metrics(step)`` then hands to TorchTitan's metrics
(zephon.torchtitan.metrics).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

import torch
from torchtitan.components.dataloader import BaseDataLoader

from zephon import merge_states
from zephon.batch import global_step_digest
from zephon.fingerprint import diff
from zephon.torchtitan import metrics
from zephon.torchtitan.checks import check_batch_geometry
from zephon.torchtitan.digests import StepDigestWriter
from zephon.torchtitan.jobfile import OVERRIDE_SECTIONS, by_section
from zephon.torchtitan.planning import plan_path, shared_plan
from zephon.torchtitan.recipe import build_pipeline, load_recipe
from zephon.torchtitan.skips import SkipPlan, range_text
from zephon.torchtitan.summary import Startup

log = logging.getLogger(__name__)


class ZephonDataLoader(BaseDataLoader):
    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):
        recipe: str = "zephon_recipes/debug.toml"
        """The data recipe (zephon_recipes/*.toml)."""
        num_lanes: int | None = None
        """Override the recipe's num_lanes (shapes the data)."""
        seed: int | None = None
        """Override the recipe's seed (shapes the data)."""
        runner: str | None = None
        """Override the recipe's runner: inline, thread or process (performance only)."""
        parallelism: int | None = None
        """Override the recipe's tokenizer parallelism (performance only)."""
        prefetch: int | None = None
        """Override the recipe's prefetch (performance only)."""
        document_mask: bool | None = None
        """Override the recipe's [packing] document_mask: positions restart at each document
        (TorchTitan then masks attention per document) or count the whole row (shapes the data)."""
        max_documents_per_row: int | None = None
        """Override the recipe's [packing] max_documents_per_row (shapes the data)."""
        balance_attention: bool | None = None
        """Override the recipe's [packing] balance_attention (shapes the data)."""
        global_batch_size: int = -1
        """Set from training.global_batch_size by zephon's job config; checked at launch."""
        digest_file: str = ""
        """Where rank 0 appends each step's global batch digest (JSON lines); empty: off."""
        skip_steps: list[str] = field(default_factory=list)
        """Training steps whose data is skipped: ["1200-1300", "7"] in TOML, 1200-1300,7 on the
        command line (see zephon.torchtitan.skips)."""
        log_freq: int = 0
        """Set from metrics.log_freq by zephon's job config: per-dataset metrics at log steps; 0: off."""
        plan_folder: str = ""
        """Where the job keeps its job plan between starts (set to <dump_folder>/zephon/plans by
        zephon's job config); empty: planned at every start (once per job, by rank 0)."""

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int,
        dp_rank: int,
        tokenizer=None,
        seq_len: int,
        local_batch_size: int,
        snapshot_every_n_steps: int | None = None,
        **kwargs,
    ):
        self.config = config
        self.recipe = load_recipe(config.recipe, recipe_overrides(config))
        self.global_batch_size = config.global_batch_size
        self.per_lane = check_batch_geometry(
            num_lanes=self.recipe.num_lanes,
            dp_world_size=dp_world_size,
            local_batch_size=local_batch_size,
            global_batch_size=config.global_batch_size,
        )
        pipeline = build_pipeline(
            self.recipe, dp_rank=dp_rank, dp_world_size=dp_world_size, seq_len=seq_len,
            microbatch_size=local_batch_size,
        )  # fmt: skip
        # the process runner's fork server loads the tokenizer and imports meanwhile (planning, then
        # the model's build and the checkpoint's load), so the first steps get every worker
        pipeline.warm_up()
        path = plan_path(config.plan_folder, pipeline) if config.plan_folder else ""
        with Startup(self.recipe, pipeline, self.per_lane, config.global_batch_size) as self._startup:
            self.pipeline = pipeline.with_plan(shared_plan(pipeline, path))  # one plan per job
        self.dp_rank, self.dp_world_size = dp_rank, dp_world_size
        self.digests = StepDigestWriter(config.digest_file, dp_world_size) if config.digest_file else None
        self.skips = SkipPlan(config.skip_steps)
        self._metrics: tuple[int, dict[str, float]] | None = None  # (step, metrics) of the last log step

    # -- batches ----------------------------------------------------------------------------

    def __iter__(self):
        per_step = self.per_lane * len(self.pipeline.owned_lanes)  # this rank's batches per step
        stream = self._startup.first_batch(iter(self.pipeline))  # logs its time (rank 0)
        step_batches, skipped = [], 0
        while True:
            if not step_batches and not self._skip_due(stream, per_step):
                return  # the data ended inside a skipped range
            batch = next(stream, None)
            if batch is None:
                return
            t = batch.to_training()
            inputs = {
                "input": torch.from_numpy(t["input_ids"]),
                "positions": torch.from_numpy(t["positions"]),
            }
            step_batches.append((batch.lane, batch.index, batch.digest()))
            if len(step_batches) == per_step:  # every rank gets here at the same microbatch
                data_step = batch.index // self.per_lane + 1
                step = data_step - self.skips.data_steps
                if self.digests is not None:
                    self.digests.write(step, step_batches, data_step)
                if metrics.should_log(step, self.config.log_freq):
                    counts = metrics.gather(self.pipeline.owned_lanes, self.pipeline.stats())
                    self._metrics = step, metrics.to_metrics(counts, self.skips.data_steps)
                step_batches = []
                skipped = self._report_skipped(step, skipped)
            yield inputs, torch.from_numpy(t["labels"])

    def _next_step(self, per_step: int) -> int:
        """The training step whose data comes next (the loader stands at a step boundary)."""
        return self.pipeline.stats()["batches"] // per_step - self.skips.data_steps + 1

    def _skip_due(self, stream, per_step: int) -> bool:
        """Consume and drop the data of a range that starts at the next step; False if the data
        ended first."""
        step = self._next_step(per_step)
        due = self.skips.due(step)
        if due is None:
            return True
        steps = due[1] - due[0] + 1
        log.info(
            "zephon: skipping the data of steps %s (%d batches per rank): step %d trains on the data "
            "of step %d of a run without skips", range_text(due), steps * per_step, step,
            step + self.skips.data_steps + steps,
        )  # fmt: skip
        for _ in range(steps * per_step):
            if next(stream, None) is None:
                return False
        self.skips.apply(due)
        return True

    def data_metrics(self, step: int) -> dict[str, float] | None:
        """Global per-dataset token counts and shares at log step ``step`` (see
        zephon.torchtitan.metrics); None if the loader has none for that step."""
        if self._metrics is None or self._metrics[0] != step:
            return None
        return self._metrics[1]

    def _report_skipped(self, step: int, before: int) -> int:
        """Logs the bad records skipped (``on_error = "skip"``) by this rank's lanes so far, when
        their number grew during ``step``; returns it."""
        now = self.pipeline.stats()["counters"].get("skipped_records", 0)
        if now > before:
            log.warning(
                "zephon: step %d: %d bad records skipped so far by rank %d's lanes (on_error = \"skip\"; "
                "the warnings above name them)", step, now, self.dp_rank,
            )  # fmt: skip
        return now

    # -- checkpoint state -------------------------------------------------------------------

    def state_dict(self) -> dict[str, str]:
        state = self.pipeline.state_dict()
        meta = {k: v for k, v in state.items() if k != "lanes"}
        meta["global_batch_size"] = self.global_batch_size
        meta["skips"] = self.skips.state()
        out = {"meta": json.dumps(meta, sort_keys=True)}
        out.update({_lane_key(lane): json.dumps(value) for lane, value in state["lanes"].items()})
        return out

    def load_state_dict(self, state_dict: dict[str, str]) -> None:
        if "meta" not in state_dict:
            raise ValueError(
                "the checkpoint holds no zephon dataloader state (was it made with another loader?)"
            )
        meta = json.loads(state_dict["meta"])
        saved_batch = meta.pop("global_batch_size", None)
        saved_skips = meta.pop("skips", None)
        if saved_batch != self.global_batch_size:
            raise ValueError(
                f"training.global_batch_size was {saved_batch} when the checkpoint was made and is "
                f"{self.global_batch_size} now: it decides which data makes each step, keep it"
            )
        changes = diff(meta.get("fingerprint"), self.pipeline.fingerprint())
        if changes:
            named = "; ".join(_readable(c) for c in changes)
            raise ValueError(
                f"the data recipe changed since the checkpoint; changed: {named}. Resume with the "
                "recipe the checkpoint was made with, or start a new run in a folder of its own "
                "(--dump_folder DIR): a job resumes the latest checkpoint under its dump folder"
            )
        lanes = {
            str(int(k[len("lane_") :])): json.loads(v) for k, v in state_dict.items() if k.startswith("lane_")
        }
        self.pipeline.load_state_dict(merge_states([{**meta, "lanes": lanes}]))
        data_steps = self.pipeline.stats()["batches"] // (self.per_lane * len(self.pipeline.owned_lanes))
        self.skips.load(saved_skips, data_steps - (saved_skips or {}).get("data_steps", 0))


PACKING_OVERRIDES = OVERRIDE_SECTIONS["packing"]


def recipe_overrides(config: ZephonDataLoader.Config) -> dict[str, dict]:
    """What the loader's config overrides in its recipe (None: the recipe's value)."""
    return by_section(lambda key: getattr(config, key))


def _lane_key(lane: str | int) -> str:
    return f"lane_{int(lane):05d}"


_NAMES = {
    "options.num_lanes": "[recipe] num_lanes",
    "options.window_rows": "[recipe] window_rows / [shuffle] buffer_size",
    "options.chunk_size": "[recipe] chunk_size",
    "options.chunk_bytes": "[recipe] chunk_bytes",
    "source.seed": "[recipe] seed",
    "source.mixture": "[[datasets]] weight",
    "source.mixture_unit": "[mixture] unit",
}


def _readable(change: str) -> str:
    """A fingerprint path in the recipe's words, e.g. operators[1].max_length -> seq_len."""
    path = change.split(":", 1)[0]
    for prefix, name in sorted(_NAMES.items(), key=lambda kv: -len(kv[0])):  # the longest first
        if path == prefix or path.startswith(prefix + "."):
            return f"{name} ({change})"
    leaf = path.rsplit(".", 1)[-1]
    if path.startswith("operators") and leaf in ("seed", "buffer_size"):
        return f"[shuffle] {leaf} ({change})"
    if path.endswith((".algorithm", ".pad_id", *(f".{k}" for k in PACKING_OVERRIDES))):
        return f"[packing] {path.rsplit('.', 1)[-1]} ({change})"
    if path.endswith((".field", ".add_bos", ".add_eos")):
        return f"[tokenizer] {path.rsplit('.', 1)[-1]} ({change})"
    if path.endswith(".max_length"):
        return f"training.seq_len / [packing] max_length ({change})"
    if path.endswith(".microbatch_size"):
        return f"training.local_batch_size ({change})"
    if path.endswith(".tokenizer"):
        return f"[tokenizer] id ({change})"
    if path.startswith("source.datasets"):
        return f"[[datasets]] ({change})"
    return change


__all__ = ["ZephonDataLoader", "global_step_digest"]
