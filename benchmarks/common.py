"""What the benchmarks share: the text mixture they measure, what one GPU consumes, the sampler of
a process tree's memory, a measurement in a fresh process, and where results go.

A script puts the repository on ``sys.path`` (it runs from a source checkout) and imports from
here: ``from benchmarks.common import MIXTURE, write_result``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")

# The three real-text datasets of zephon.testing.data.real_text_corpora (KJV verses, KJV chapters,
# Python standard-library files), mixed by tokens.
MIXTURE = {"verses": 0.4, "chapters": 0.35, "code": 0.25}

# What one GPU consumes, in tokens/s, training common model sizes (public figures):
# TorchTitan docs/performance.md, Llama 3.1 8B on 8 H100s, FSDP + compile + Float8: 8,532 TPS/GPU;
# Llama 3.1 405B on 128 H100s, FSDP + TP + Float8 + async TP: 185 TPS/GPU. Nanotron's benchmark
# logs (huggingface.co/nanotron/old_bench, llama-1B, 8 GPUs, dp-4 tp-2): about 33,300 tokens/s/GPU.
GPU_TOKENS_PER_S = {"Llama 1B (nanotron, H100)": 33_300, "Llama 3.1 8B (TorchTitan, H100)": 8_532,
                    "Llama 3.1 405B (TorchTitan, H100)": 185}  # fmt: skip
LLAMA_8B_H100 = GPU_TOKENS_PER_S["Llama 3.1 8B (TorchTitan, H100)"]


def write_copies(files: dict[str, str], copies: int) -> dict[str, int]:
    """Each file rewritten as ``copies`` copies of itself, back to back: the same documents in a
    file the size of a corpus, which a loader reads as such (``--copies`` of the throughput
    benchmark and the profile). Returns each file's size in bytes."""
    for path in files.values() if copies > 1 else ():
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            for _ in range(copies):
                f.write(data)
    return {name: os.path.getsize(path) for name, path in files.items()}


def text_setup(tmp: str, copies: int = 1, **fields):
    """The throughput benchmark's ``Setup`` (``benchmarks.peers.common``) over the real text of
    ``zephon.testing.data`` written under ``tmp``, each file ``copies`` times over: the three
    datasets mixed by ``MIXTURE``, GPT-2 BPE; ``fields`` as ``Setup``'s (runner, workers, options)."""
    from benchmarks.peers.common import Setup
    from zephon.testing import gpt2_tokenizer_dir
    from zephon.testing.data import real_text_corpora

    files = {name: path for name, (path, _) in real_text_corpora(tmp).items()}
    write_copies(files, copies)
    return Setup(files, MIXTURE, gpt2_tokenizer_dir(os.path.join(tmp, "gpt2")), **fields)


def refuse_fewer_than_one_copy(parser, copies: int) -> None:
    """``--copies`` (throughput.py, time_profile.py) under 1: an argparse error saying what to give
    (0 had divided by zero in the tokenizers-alone baseline)."""
    if copies < 1:
        parser.error(f"--copies {copies}: give 1 or more (the times each dataset is written over)")


def compile_project() -> None:
    """Writes the bytecode of the project's modules, as pip does at install and Python at a first
    import, so that a run's start-up is measured as users meet it (and as the peers' installed
    packages are). This machine sets PYTHONDONTWRITEBYTECODE, and the project is installed
    editable: each measuring process compiled zephon's sources anew (side by side here: 0.53 s to
    the first batch against 0.47 s from bytecode, medians of 8)."""
    import compileall

    compileall.compile_dir(os.path.join(ROOT, "zephon"), quiet=1)


def in_fresh_process(
    script: str, args: list[str], label: str, timeout: float, env: dict | None = None
) -> dict | None:
    """Runs ``script`` again with ``args`` in a fresh interpreter (from the repository's root) and
    returns the last JSON object it printed: one measurement, its start-up included. Where it
    fails or runs past ``timeout`` seconds, says so with the tail of its output, under ``label``,
    and returns None (the caller decides whether a missing run stops the benchmark)."""
    command = [sys.executable, os.path.abspath(script), *args]
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        print(f"  {label}: timed out after {timeout:.0f} s", flush=True)
        return None
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        print(f"  {label}: failed ({done.returncode})\n{(done.stdout + done.stderr)[-2000:]}", flush=True)
        return None
    return json.loads(lines[-1])


def interleaved(
    labels: list,
    reps: int,
    measure: Callable[[Any], dict | None],
    say: Callable[[Any, dict], str] = lambda label, result: str(result),
    required: str | None = None,
    name: Callable[[Any], str] = str,
) -> dict[Any, list[dict]]:
    """Each of ``labels`` measured ``reps`` times (``measure(label)``, in a fresh process as a
    rule), interleaved: every label's first run, then every label's second, so that the host's
    drift over the benchmark falls on all of them alike. Each run is printed as it ends (``say``
    its result), with the time left at the pace so far. Returns ``{label: [results]}``, every
    label a list; a run that gives None is left out, or, with ``required`` (the benchmark's
    name), ends the benchmark with nothing written (what failed is printed above). ``name``: a
    label as printed."""
    runs: dict[Any, list[dict]] = {label: [] for label in labels}
    began, total = time.monotonic(), reps * len(labels)
    for rep in range(reps):
        for i, label in enumerate(labels):
            result = measure(label)
            done = rep * len(labels) + i + 1
            left = (time.monotonic() - began) / done * (total - done)
            if result is None and required:
                sys.exit(f"{required}: the run {name(label)} failed (above); nothing written")
            if result is not None:
                runs[label].append(result)
            said = "failed" if result is None else say(label, result)
            print(
                f"[{done}/{total}] rep {rep + 1}/{reps}, {name(label)}: {said}; about {left:.0f} s left",
                flush=True,
            )
    return runs


def result_path(name: str) -> str:
    """``benchmarks/results/NAME``, its folder made."""
    os.makedirs(RESULTS, exist_ok=True)
    return os.path.join(RESULTS, name)


def write_result(name: str, lines: list[str] | str, echo: bool = True) -> str:
    """Writes ``lines`` (one string or a list of lines) to ``benchmarks/results/NAME``, printing
    them where ``echo``; the path."""
    text = lines if isinstance(lines, str) else "\n".join(lines) + "\n"
    path = result_path(name)
    with open(path, "w") as f:
        f.write(text)
    if echo:
        print(text.rstrip("\n"))
    return path


def write_json(name: str, record: dict) -> str:
    """Writes ``record`` as indented JSON to ``benchmarks/results/NAME``; the path."""
    path = result_path(name)
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
    return path


class PeakRSS:
    """The largest resident set of this process and its children, sampled in a thread (``peak``:
    the sum of their resident sets, where a page several processes share counts in each, as a
    fork server's tokenizer does in every worker forked from it and a shared-memory arena in the
    worker and the rank process), and the largest sum of their proportional sets (``peak_pss``:
    a page shared by n processes counts 1/n in each, so the sum is the memory they take
    together; read every ``pss_every`` seconds, half a millisecond a process)."""

    def __init__(self, every: float = 0.1, relist: float = 1.0, pss_every: float = 0.5):
        import psutil

        self.process, self.peak, self.every, self.relist = psutil.Process(), 0, every, relist
        self.peak_pss, self.pss_every = 0, pss_every
        self.stop = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        # Listing the children scans every process of the machine: once a second, not at every
        # sample, so that the sampler itself takes little of the CPU (and of the GIL) it measures.
        import psutil

        tree, listed, pss_read = [self.process], 0.0, 0.0
        while not self.stop.is_set():
            if time.monotonic() - listed > self.relist:
                with contextlib.suppress(psutil.Error):
                    tree, listed = [self.process, *self.process.children(recursive=True)], time.monotonic()
            total = 0
            for p in tree:
                with contextlib.suppress(psutil.Error):  # a child that just ended
                    total += p.memory_info().rss
            self.peak = max(self.peak, total)
            if time.monotonic() - pss_read >= self.pss_every:
                pss_read, total = time.monotonic(), 0
                for p in tree:
                    with contextlib.suppress(psutil.Error, AttributeError):  # no pss: not Linux
                        total += p.memory_full_info().pss
                self.peak_pss = max(self.peak_pss, total)
            self.stop.wait(self.every)
