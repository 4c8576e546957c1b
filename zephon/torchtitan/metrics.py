"""Per-dataset token counts and shares in TorchTitan's metrics, at every log step.

At the last microbatch of a log step (TorchTitan's rule: step 1 and every ``metrics.log_freq``)
every rank sends its lanes' delivery counts (``Pipeline.stats()``) to every other with one
``all_gather_object``; ranks of one TP/CP/PP group own the same lanes and are counted once. The
numbers are global and cumulative over the run (across restores): every token the lanes
delivered, the data of skipped steps included. :func:`attach` (called by
``python -m zephon.torchtitan.train``) wraps the trainer's ``MetricsProcessor.log`` so that its
``extra_metrics`` gain::

    data/tokens/<dataset>    tokens delivered
    data/share/<dataset>     its share of all delivered tokens (0..1)
    data/skipped_records     bad records left out (on_error = "skip"), when any
    data/skipped_steps       data steps skipped ([data] skip_steps), when any
    data/requests/<dataset>  requests the job's processes made of its store since they started
                             (planning and reading: every process reads, TP peers included)
    data/bytes_read/<dataset> the bytes those requests brought

and rank 0 prints one line, e.g. ``zephon: step 8: data kjv 100.0% (16,384 tokens)``.
"""

from __future__ import annotations

import logging

import torch.distributed as dist

log = logging.getLogger(__name__)


def should_log(step: int, log_freq: int) -> bool:
    """TorchTitan's MetricsProcessor.should_log; ``log_freq`` 0: never (no trainer asks)."""
    return log_freq > 0 and (step == 1 or step % log_freq == 0)


def gather(lanes: list[int], stats: dict) -> dict:
    """Collective: this rank's lanes and their ``stats()`` in, the global counts out."""
    io = {name: (c["plan_requests"] + c["read_requests"], c["plan_bytes"] + c["read_bytes"])
          for name, c in stats.get("io", {}).items()}  # fmt: skip
    mine = (tuple(lanes), stats["tokens"], stats["counters"].get("skipped_records", 0), io)
    if dist.is_available() and dist.is_initialized():
        parts: list = [None] * dist.get_world_size()
        dist.all_gather_object(parts, mine)
    else:
        parts = [mine]
    unique = {p[0]: p for p in parts}  # ranks that own the same lanes deliver the same counts
    tokens: dict[str, int] = {}
    for _, counts, _, _ in unique.values():
        for name, n in counts.items():
            tokens[name] = tokens.get(name, 0) + n
    requests: dict[str, list[int]] = {}
    for *_, io in parts:  # every process reads for itself: all of them count
        for name, (r, b) in io.items():
            total = requests.setdefault(name, [0, 0])
            total[0], total[1] = total[0] + r, total[1] + b
    return {"tokens": tokens, "skipped_records": sum(p[2] for p in unique.values()), "requests": requests}


def to_metrics(counts: dict, skipped_steps: int) -> dict[str, float]:
    total = sum(counts["tokens"].values())
    metrics: dict[str, float] = {}
    for name, n in counts["tokens"].items():
        metrics[f"data/tokens/{name}"] = n
        metrics[f"data/share/{name}"] = n / total if total else 0.0
    for name, (r, b) in counts.get("requests", {}).items():
        metrics[f"data/requests/{name}"] = r
        metrics[f"data/bytes_read/{name}"] = b
    if counts["skipped_records"]:
        metrics["data/skipped_records"] = counts["skipped_records"]
    if skipped_steps:
        metrics["data/skipped_steps"] = skipped_steps
    return metrics


def console_line(step: int, metrics: dict[str, float]) -> str:
    """``zephon: step 8: data kjv 100.0% (16,384 tokens)``, datasets in the recipe's order."""
    names = [key[len("data/tokens/") :] for key in metrics if key.startswith("data/tokens/")]
    metrics = {k: v for k, v in metrics.items() if not k.startswith(("data/requests/", "data/bytes_read/"))}
    parts = [
        f"{n} {100 * metrics[f'data/share/{n}']:.1f}% ({metrics[f'data/tokens/{n}']:,} tokens)" for n in names
    ]
    extra = [f"{k.split('/', 1)[1]} {v:,}" for k, v in metrics.items() if k.count("/") == 1]
    return f"zephon: step {step}: data " + ", ".join(parts) + "".join(f"; {e}" for e in extra)


def attach(trainer) -> None:
    """Wrap ``trainer.metrics_processor.log`` to add the loader's data metrics of the step."""
    loader, processor = trainer.dataloader, trainer.metrics_processor
    if not hasattr(loader, "data_metrics"):  # TorchTitan's own loader, for comparisons
        return
    original = processor.log

    def log_with_data(step, *args, extra_metrics=None, **kwargs):
        data = loader.data_metrics(step)
        if data:
            extra_metrics = {**(extra_metrics or {}), **data}
        original(step, *args, extra_metrics=extra_metrics, **kwargs)
        if data and (not dist.is_initialized() or dist.get_rank() == 0):
            log.info(console_line(step, data))

    processor.log = log_with_data
