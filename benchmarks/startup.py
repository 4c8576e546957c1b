#!/usr/bin/env python
"""Start-up: what the first batch waits for, part by part, and the first batch in a training job.

The throughput benchmark times its first batch from building the loader, in a fresh process:
``import zephon`` included, and the tokenizer's loading. This measures the parts of that time
alone, each in a fresh process, interleaved ``--reps`` times (medians):

- ``import zephon``;
- loading GPT-2's ``tokenizer.json`` with Hugging Face ``tokenizers`` (``Tokenizer.from_str``,
  the reference, which encodes a run's first chunks) and with ``fastokens``
  (``Tokenizer.from_json_str``, wall and CPU), each with its library imported first; and
  ``fastokens`` from the form zephon keeps of the file after a first load (its merges as
  strings), which later loads build from;
- the first batch of the throughput benchmark's recipe (inline runner, default backend), built
  and iterated at once, as the throughput benchmark times it;
- the same recipe built, then iterated ``--pause`` seconds later, as TorchTitan does: its trainer
  builds the data loader before the model, and iterates it once the model is built, compiled and
  its checkpoint loaded; the time from ``iter`` to the first batch, with the inline runner and
  with two process workers, these also after ``Pipeline.warm_up()`` at the build (as zephon's
  TorchTitan loader calls it: the fork server loads meanwhile); and the rate from ``iter`` to the
  ``--tokens``-th token, what the first steps of training get.

The first of these two cannot go below ``import zephon`` plus the reference's load plus its
encoding of the first window's chunks: the fast backend takes longer to load than all three.

    python benchmarks/startup.py [--reps 7] [--pause 2] [--tokens 8000000]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # benchmarks.common and benchmarks.peers, from a source checkout

from benchmarks.common import MIXTURE, compile_project, in_fresh_process, interleaved, write_result  # noqa: E402

PARTS = {
    "import zephon": "import",
    "tokenizers load (Tokenizer.from_str)": "hf",
    "fastokens load (Tokenizer.from_json_str)": "fast",
    "fastokens load, the form zephon keeps (merges as strings)": "fast kept",
    "first batch, built and iterated at once (inline)": "at_once",
    "first batch, iterated after the pause (inline)": "paused inline",
    "first batch, iterated after the pause (2 process workers)": "paused process",
    "first batch, iterated after the pause (2 process workers, warmed up)": "paused process warm",
}


def one(part: str, setup: dict, pause: float, tokens: int) -> dict:
    """One measurement, in this (fresh) process: seconds, and CPU seconds where it says."""
    if part == "import":
        start = time.perf_counter()
        import zephon  # noqa: F401

        return {"s": time.perf_counter() - start}
    tokenizer_json = os.path.join(setup["tokenizer"], "tokenizer.json")
    if part in ("hf", "fast", "fast kept"):
        with open(tokenizer_json, "rb") as f:
            raw = f.read().decode("utf-8")
        if part == "hf":
            from tokenizers import Tokenizer

            load = Tokenizer.from_str
        else:
            from fastokens import Tokenizer

            load = Tokenizer.from_json_str
        if part == "fast kept":  # what its later loads build from (zephon.io.fast_tokenizer)
            from zephon.io.fast_tokenizer import fast_form

            raw = (fast_form(raw.encode()) or raw.encode()).decode()  # None: the file as it is
        start, cpu = time.perf_counter(), time.process_time()
        load(raw)
        return {"s": time.perf_counter() - start, "cpu": time.process_time() - cpu}
    from benchmarks.peers import zephon_self
    from benchmarks.peers.common import Setup

    method = "process" if "process" in part else "inline"
    config = Setup(**setup, method=method, workers=2 if method == "process" else 1)
    start = time.perf_counter()
    pipeline = zephon_self.pipeline(config)  # imports zephon, loads the tokenizer
    if part.endswith("warm"):
        pipeline.warm_up()
    built = time.perf_counter() - start
    if part == "at_once":
        next(iter(pipeline))
        pipeline.close()
        return {"s": time.perf_counter() - start, "built": built}
    time.sleep(pause)  # the model's build, compile and checkpoint load
    start, first, seen = time.perf_counter(), None, 0
    for batch in pipeline:
        first = time.perf_counter() - start if first is None else first
        seen += int((batch.sources >= 0).sum())
        if seen >= tokens:
            break
    rate = seen / (time.perf_counter() - start)
    pipeline.close()
    return {"s": first, "built": built, "rate": rate}


def run_one(part: str, setup: dict, pause: float, tokens: int) -> dict:
    spec = json.dumps({"part": part, "setup": setup, "pause": pause, "tokens": tokens})
    result = in_fresh_process(__file__, ["--one", spec], part, timeout=300)
    if result is None:  # every part is needed for the table
        raise RuntimeError(f"{part}: no measurement (its output is above)")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--pause", type=float, default=2.0, help="seconds between building and iterating")
    parser.add_argument("--tokens", type=int, default=8_000_000, help="tokens after iter, for the rate")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        spec = json.loads(args.one)
        print(json.dumps(one(spec["part"], spec["setup"], spec["pause"], spec["tokens"])), flush=True)
        return
    compile_project()
    from zephon.testing import gpt2_tokenizer_dir
    from zephon.testing.data import real_text_corpora

    with tempfile.TemporaryDirectory() as tmp:
        files = {name: path for name, (path, _) in real_text_corpora(tmp).items()}
        tokenizer = gpt2_tokenizer_dir(os.path.join(tmp, "gpt2"))
        setup = {"files": files, "weights": MIXTURE, "tokenizer": tokenizer}
        runs = interleaved(
            list(PARTS), args.reps, lambda label: run_one(PARTS[label], setup, args.pause, args.tokens)
        )
    _write(runs, args)


def _write(runs: dict[str, list[dict]], args) -> None:
    def median(label: str, key: str) -> float | None:
        values = [r[key] for r in runs[label] if key in r]
        return statistics.median(values) if values else None

    lines = [
        "# Start-up: the parts of the time to the first batch",
        "",
        f"`python benchmarks/startup.py --reps {args.reps} --pause {args.pause:g} --tokens {args.tokens}` on "
        f"{platform.machine()}, "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}. Each figure in a fresh process, "
        f"interleaved, medians of {args.reps}, from bytecode compiled as at install. The recipe is the "
        "throughput benchmark's (three real-text datasets, GPT-2 BPE, default backend, 8 lanes, "
        "shuffle 256, rows of 2049, microbatch 8).",
        "",
        f"| part | seconds | CPU seconds | built in (s) | tokens/s, iter to the {args.tokens:,}th token |",
        "|---|---:|---:|---:|---:|",
    ]
    for label in PARTS:
        cells = [median(label, key) for key in ("s", "cpu", "built")]
        rate = median(label, "rate")
        lines.append(
            f"| {label} | " + " | ".join("-" if c is None else f"{c:.3f}" for c in cells)
            + f" | {'-' if rate is None else f'{rate / 1e6:.2f}M'} |"
        )  # fmt: skip
    floor = median("import zephon", "s") + median("tokenizers load (Tokenizer.from_str)", "s")
    lines += [
        "",
        f"`import zephon` and the reference's load alone: {floor:.3f} s, before any encoding. The "
        "fast backend loads in a thread of its own, beside the reference (whose load holds the "
        "GIL: it begins once fastokens' is under way), and takes about as long as the whole first "
        "batch, so the first batch of a loader built and iterated at once is the reference's; in a "
        "training job the loader is built before the model, and its first batch comes "
        f"{args.pause:g} s or more after its build.",
    ]
    write_result("startup.md", lines)


if __name__ == "__main__":
    main()
