#!/usr/bin/env python
"""What TorchTitan's attention costs on CPU: the debug model's forward and backward per step.

TorchTitan 0.3.0's llama3 debug model (6 layers, dim 256, 16 heads), float32, one thread (a
rank of a 2-rank job on 2 cores), microbatches of 2 rows of the debug recipe (KJV verses, about
4 documents a row), masks built by ``Decoder.get_attention_masks`` from zephon's positions in
every microbatch, as TorchTitan's trainer builds them. Per step: the 4 microbatches one rank
of the debug job (global batch 16, 2 ranks, 2 rows a microbatch) runs. Attention paths:

- SDPA, causal only: what zephon's CPU support ran before (documents attend across each other);
- flex / varlen, zephon's CPU kernels: TorchTitan's modules and masks, dense kernels
  (zephon.torchtitan.attention), what CPU runs use now;
- flex, eager ``flex_attention``: torch 2.13 refuses its backward on CPU; measured with that
  check bypassed, for comparison only;
- flex, compiled (TorchTitan's own kernel), with and without that check: fails on CPU, the
  error is shown.

Rounds interleave the paths; the table shows medians. Writes benchmarks/results/cpu_attention.txt.

    python benchmarks/cpu_attention.py [--rounds 7] [--seq-len 128]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import time

import torch
import torch.nn.functional as F

from zephon.torchtitan import attention

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MICROBATCHES = 4  # a rank's microbatches per step in the debug job on 2 ranks


def microbatches(seq_len: int) -> list[dict[str, torch.Tensor]]:
    from zephon.torchtitan.recipe import build_pipeline, load_recipe

    recipe = load_recipe(os.path.join(ROOT, "zephon_recipes", "debug.toml"))
    pipeline = build_pipeline(recipe, dp_rank=0, dp_world_size=1, seq_len=seq_len, microbatch_size=2)
    out = []
    for batch in pipeline:
        out.append({k: torch.from_numpy(v) for k, v in batch.to_training().items()})
        if len(out) == MICROBATCHES:
            break
    pipeline.close()
    return out


@contextlib.contextmanager
def eager_flex():
    """Eager flex_attention as FlexAttention's kernel, torch's CPU backward check bypassed."""
    import torch.nn.attention.flex_attention as fa
    from torchtitan.models.common.attention import FlexAttention

    saved = fa._validate_device, FlexAttention.compiled_flex_attn

    def kernel(q, k, v, *, score_mod, block_mask, scale, enable_gqa, return_aux, kernel_options):
        return fa.flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale,
                                 enable_gqa=enable_gqa, return_aux=return_aux)  # fmt: skip

    fa._validate_device = lambda *args: None
    FlexAttention.compiled_flex_attn = staticmethod(kernel)
    try:
        yield
    finally:
        fa._validate_device, FlexAttention.compiled_flex_attn = saved[0], staticmethod(saved[1])


@contextlib.contextmanager
def compiled_flex(bypass: bool):
    """TorchTitan's own compiled FlexAttention kernel (torch's CPU backward check bypassed)."""
    import torch.nn.attention.flex_attention as fa
    from torchtitan.models.common.attention import FlexAttention

    saved = fa._validate_device, FlexAttention.compiled_flex_attn
    FlexAttention.compiled_flex_attn = staticmethod(ORIGINAL_FLEX)
    if bypass:
        fa._validate_device = lambda *args: None
    try:
        yield
    finally:
        fa._validate_device, FlexAttention.compiled_flex_attn = saved[0], staticmethod(saved[1])


def step(model, batches, masked: bool) -> float:
    start = time.perf_counter()
    for b in batches:
        positions = b["positions"]
        masks = model.get_attention_masks(positions) if masked else None
        logits = model(b["input_ids"], positions=positions, attention_masks=masks)
        F.cross_entropy(logits.flatten(0, 1), b["labels"].flatten(), ignore_index=-100).backward()
    model.zero_grad()
    return time.perf_counter() - start


def try_compiled(model, batches, bypass: bool) -> str:
    torch._dynamo.reset()  # else a compile that failed before runs eagerly now
    try:
        with compiled_flex(bypass):
            step(model, batches[:1], True)
    except Exception as e:  # the point is to show how it fails
        return f"fails: {type(e).__name__}: {str(e).strip().splitlines()[0][:60]}"
    return "runs"


ORIGINAL_FLEX = None


def main() -> None:
    global ORIGINAL_FLEX
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--seq-len", type=int, default=128)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from torchtitan.models.common.attention import FlexAttention

    ORIGINAL_FLEX = FlexAttention.compiled_flex_attn
    attention.install()
    batches = microbatches(args.seq_len)
    paths = {
        "SDPA, causal only (CPU runs before)": ("sdpa", False, contextlib.nullcontext),
        "flex, zephon's dense CPU kernel (now)": ("flex", True, contextlib.nullcontext),
        "varlen, zephon's dense CPU kernel": ("varlen", True, contextlib.nullcontext),
        "flex, eager flex_attention, check bypassed": ("flex", True, eager_flex),
    }
    models = {name: attention.debug_model(backend, args.seq_len) for name, (backend, _, _) in paths.items()}
    times: dict[str, list[float]] = {name: [] for name in paths}
    for name, (_, masked, context) in paths.items():  # warm-up
        with context():
            step(models[name], batches, masked)
    for _ in range(args.rounds):
        for name, (_, masked, context) in paths.items():
            with context():
                times[name].append(step(models[name], batches, masked))
    flex = models["flex, zephon's dense CPU kernel (now)"]
    compiled = try_compiled(flex, batches, False), try_compiled(flex, batches, True)
    base = statistics.median(times["SDPA, causal only (CPU runs before)"])
    lines = [
        "TorchTitan's attention on CPU: forward + backward of the llama3 debug model per step",
        f"({MICROBATCHES} microbatches of 2 x {args.seq_len} tokens of the debug recipe, masks built",
        "from zephon's positions in every microbatch), float32, 1 thread. Medians of "
        f"{args.rounds} interleaved rounds.",
        f"Machine: {platform.machine()}, {os.cpu_count()} CPUs (shared), torch {torch.__version__}.",
        f"Command: python benchmarks/cpu_attention.py --seq-len {args.seq_len}",
        "",
        f"{'attention path':<46} {'s/step':>7} {'vs SDPA':>8}   range",
    ]
    for name, ts in times.items():
        med = statistics.median(ts)
        lines.append(f"{name:<46} {med:>7.3f} {med / base:>7.2f}x   {min(ts):.3f}-{max(ts):.3f}")
    lines += [
        f"{'flex, compiled (TorchTitan on GPUs)':<46} {compiled[0]}",
        f"{'flex, compiled, check bypassed':<46} {compiled[1]}",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    out = os.path.join(HERE, "results", f"cpu_attention{'' if args.seq_len == 128 else args.seq_len}.txt")
    with open(out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
