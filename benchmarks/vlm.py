#!/usr/bin/env python
"""Figure 3 on CPU: an image-text pipeline, this project against Grain, as parallelism grows.

The pipeline, the same in every system: read Parquet rows of encoded photographs and captions
(the real photographs of scikit-image and scikit-learn, repeated), decode each image, resize its
shorter side to 224 and cut out the centre, cut it into 16 x 16 patches (196 image tokens), put
one placeholder token per patch before the caption's GPT-2 tokens and an EOS, pack documents into
rows of 2,049 tokens (a document may run on into the next row), batch 8 rows. The image work is
the same function in every system (``zephon.ops.images.Images.patches``), so what differs is how
each loader drives it and, with ``--decoder``, the library that decodes in zephon (Grain decodes
with Pillow, as its users do).

- zephon: 8 lanes, a shuffle of 16 rows per window, thread or process runner, ``parallelism`` P.
- Grain 0.2.18: a random-access source over the Parquet rows, globally shuffled and repeated,
  ``.map`` (decode, patches, tokenize), ``ConcatThenSplitIterDataset`` with the patches as a
  feature aligned with the tokens (zeros under text tokens: Grain packs features of one length),
  ``batch(8)``; "fastest": all of it in each of P ``mp_prefetch`` worker processes (its output
  depends on P), "worker-invariant": the map in P workers, packing and batching after them.

Both are built in ``benchmarks/peers/`` (``zephon_self.py``, ``grain_loader.py``), the same
modules as the throughput benchmark's, given image-text documents (``Setup.image_size``).

Usable tokens/s: non-padding tokens (image and text) per second, end to end from building the
loader to the ``--tokens``-th token, each measurement in a fresh process, systems interleaved,
``--reps`` times, medians. "Steady": the rate from the quarter mark to the end, once every
loader holds its full work in flight: what a long training run sees (the end-to-end rate also
charges the start-up and the work in flight when the count is reached; zephon holds about
``num_lanes x window_rows / 2`` rows in flight, as each lane builds a whole window at a time).
The line: what one GPU trains on, Llama 3.1 8B on H100s (TorchTitan's
docs/performance.md: 8,532 tokens/s per GPU with FSDP, compile and Float8).

The decoder was chosen by measurement: the run ends by timing every ``images(decoder=...)`` that
is installed on the photographs through the operator (decode, resize, patches), with its pixels
against Pillow's, and the resize alone (Pillow's against PyTorch's port of it), in its own
process, and writes those tables too (``python -c "from benchmarks.vlm import decoders, resizes;
print(*decoders(), *resizes(), sep=chr(10))"`` for the tables alone).

    python benchmarks/vlm.py [--tokens 2000000] [--reps 3] [--decoder pillow]
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
from dataclasses import replace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # benchmarks.common and benchmarks.peers, from a source checkout

from benchmarks.common import (  # noqa: E402
    LLAMA_8B_H100,
    PeakRSS,
    compile_project,
    in_fresh_process,
    interleaved,
    result_path,
    write_json,
    write_result,
)

CORES = os.cpu_count() or 1
SIZE, PATCH, SEQ, MICROBATCH = 224, 16, 2048, 8
IMAGE_TOKEN = 50257  # one past GPT-2's vocabulary
REPEATS = 8  # the photographs, repeated: 240 rows, about 50 MB of Parquet


# zephon with each resizer (images(resizer=...)), and Grain's two layouts
KINDS = ("zephon thread", "zephon process", "zephon thread torch", "zephon process torch", "Grain fastest",
         "Grain invariant")  # fmt: skip


def systems() -> list[str]:
    out = []
    for p in range(1, CORES + 1):
        out += [f"{kind} x{p}" for kind in KINDS]
    return out


def make_data(folder: str) -> tuple[str, str]:
    """(the Parquet file, the GPT-2 tokenizer folder), written once into ``folder``."""
    from zephon.testing import gpt2_tokenizer_dir
    from zephon.testing.images import photos, write_parquet

    path = os.path.join(folder, "photos.parquet")
    if not os.path.exists(path):
        samples = [(f"{k}-{r}", e, d, c) for r in range(REPEATS) for k, e, d, c in photos()]
        write_parquet(path, samples, row_group_size=16)
    tok = os.path.join(folder, "gpt2")
    if not os.path.exists(tok):
        gpt2_tokenizer_dir(tok)
    return path, tok


# -- the systems: benchmarks/peers, given image-text documents --------------------------------------


def batches(system: str, path: str, tok: str, decoder: str = "pillow"):
    """The microbatches (``peers.common.Out``) of ``system``, e.g. "zephon thread x2" or "zephon
    process torch x1" (resized by torch)."""
    from benchmarks.peers.common import Setup

    kind, workers = system.rsplit(" x", 1)
    name, how, *resizer = kind.split()
    setup = Setup(
        files={"photos": path}, weights={"photos": 1.0}, tokenizer=tok, seq_len=SEQ, microbatch=MICROBATCH,
        shuffle=16, workers=int(workers), image_size=SIZE, patch=PATCH, image_token=IMAGE_TOKEN,
    )  # fmt: skip
    if name == "zephon":
        from benchmarks.peers import zephon_self

        return zephon_self.batches(
            replace(setup, method=how, options={"decoder": decoder, "resizer": (resizer or ["pillow"])[0]})
        )
    from benchmarks.peers import grain_loader

    grain_setup = replace(setup, method="process", options={"read_threads": 1, "read_buffer": 4, "group": 1})
    return getattr(grain_loader, f"batches_{how}")(grain_setup)


def measure(system: str, path: str, tok: str, tokens: int, decoder: str = "pillow") -> dict:
    import torch  # noqa: F401  (before the clock: a training process has it, whatever its loader)

    rss = PeakRSS()
    start = time.perf_counter()
    made = batches(system, path, tok, decoder)
    usable, first, rows, padded, quarter = 0, None, 0, 0, None
    for out in made:
        valid = out.valid
        first = first or time.perf_counter() - start
        usable += int(valid.sum())
        rows, padded = rows + valid.size, padded + int((~valid).sum())
        if quarter is None and usable >= tokens // 4:
            quarter = (usable, time.perf_counter() - start)
        if usable >= tokens:
            break
    elapsed = time.perf_counter() - start
    made.close()
    rss.stop.set()
    steady = (usable - quarter[0]) / (elapsed - quarter[1])
    return {"tokens_per_s": usable / elapsed, "first_batch_s": first, "steady": steady,
            "peak_rss": rss.peak, "padding": padded / max(1, rows)}  # fmt: skip


# -- the decoders ------------------------------------------------------------------------------------


def decoders(reps: int = 5) -> list[str]:
    """The decoder table: each ``images(decoder=...)`` that is installed, timed on the photographs
    through the operator's own path (decode, JPEG at Pillow's draft scale, EXIF turn, Pillow's
    bicubic resize to the 224 centre crop, patches), one thread, decoders interleaved, ``reps``
    rounds, medians; and its pixels against Pillow's: the largest difference of any channel of any
    pixel, and the largest mean difference of an image. Then the same with ``resizer="torch"`` (one
    torch thread), where a decoder's pixels go to the resize without a Pillow image."""
    import numpy as np
    import torch

    from zephon.ops.decoders import DECODERS, DEFAULT
    from zephon.ops.images import Images
    from zephon.testing.images import photos

    samples = photos()
    torch.set_num_threads(1)  # as a worker has it
    ops, torch_ops = {}, {}
    for name in DECODERS:
        try:
            ops[name] = Images(size=SIZE, patch=PATCH, decoder=name)
            torch_ops[name] = Images(size=SIZE, patch=PATCH, decoder=name, resizer="torch")
        except ValueError as e:  # not installed
            print(f"decoder {name}: {e}", flush=True)
    kinds = {kind: [d for _, e, d, _ in samples if e == kind] for kind in ("jpg", "png")}
    blobs = [d for _, _, d, _ in samples]
    times = {(n, k): [] for n in ops for k in (*kinds, "torch")}
    for _ in range(reps):
        for name, op in ops.items():
            for kind, these in (*kinds.items(), ("torch", blobs)):
                run = torch_ops[name] if kind == "torch" else op
                start = time.perf_counter()
                for b in these:
                    run.patches(b)
                times[name, kind].append((time.perf_counter() - start) / len(these) * 1e3)
    want = [ops["pillow"].patches(d).pixels.astype(np.int16) for d in blobs]
    jpegs, pngs = len(kinds["jpg"]), len(kinds["png"])
    lines = [
        f"| decoder | JPEG ms/image ({jpegs}) | PNG ms/image ({pngs}) | all ({len(samples)}) | vs Pillow "
        "| all, torch resizing | vs Pillow | max abs diff | max mean abs diff |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    base = base_torch = None
    for name, op in ops.items():
        jpg, png = statistics.median(times[name, "jpg"]), statistics.median(times[name, "png"])
        every, resized = (jpg * jpegs + png * pngs) / len(samples), statistics.median(times[name, "torch"])
        base, base_torch = base or every, base_torch or resized
        diffs = [np.abs(op.patches(d).pixels.astype(np.int16) - w) for d, w in zip(blobs, want, strict=True)]
        label = (op.decoder_version or f"pillow {op.pillow}") + (" (default)" if name == DEFAULT else "")
        lines.append(
            f"| {label} | {jpg:.2f} | {png:.2f} | {every:.2f} | {base / every:.2f}x | {resized:.2f} | "
            f"{base_torch / resized:.2f}x | {max(int(d.max()) for d in diffs)} | "
            f"{max(float(d.mean()) for d in diffs):.3f} |"
        )
    return lines


def resizes(reps: int = 5) -> list[str]:
    """The resize alone, on the decoded photographs (Pillow's draft scale), as ``images(resizer=...)``
    does it: Pillow's bicubic (the default, after every decoder) against PyTorch's antialiased
    bicubic on uint8 (a port of Pillow's filter; where torch is installed), one thread, and
    PyTorch's pixels against Pillow's."""
    import io

    import numpy as np
    from PIL import Image

    from zephon.ops.images import Images
    from zephon.testing.images import photos

    images = []
    for _, _, data, _ in photos():
        image = Image.open(io.BytesIO(data))
        image.draft("RGB", (SIZE, SIZE))
        images.append(image.convert("RGB"))

    def size_of(w, h):
        s = SIZE / min(w, h)
        return max(SIZE, round(w * s)), max(SIZE, round(h * s))

    def way(resizer):
        op = Images(size=SIZE, patch=PATCH, resizer=resizer)
        return lambda image: op._resize(image, *size_of(*image.size))

    pillow = way("pillow")
    ways = {"Pillow bicubic (the default)": pillow}
    try:
        import torch

        torch.set_num_threads(1)
        version = torch.__version__.split("+")[0]
        ways[f"PyTorch {version} bicubic, antialias (`images(resizer='torch')`)"] = way("torch")
    except ImportError:
        pass
    times = {name: [] for name in ways}
    for _ in range(reps):
        for name, fn in ways.items():
            start = time.perf_counter()
            for image in images:
                fn(image)
            times[name].append((time.perf_counter() - start) / len(images) * 1e3)
    want = [pillow(image).astype(np.int16) for image in images]
    lines = ["| resize | ms/image | max abs diff | max mean abs diff |", "|---|---:|---:|---:|"]
    for name, fn in ways.items():
        diffs = [np.abs(fn(image).astype(np.int16) - w) for image, w in zip(images, want, strict=True)]
        lines.append(
            f"| {name} | {statistics.median(times[name]):.2f} | {max(int(d.max()) for d in diffs)} | "
            f"{max(float(d.mean()) for d in diffs):.3f} |"
        )
    return lines


# -- the run -----------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2_000_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--decoder", default="pillow", help="zephon's images(decoder=...)")
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "zephon-vlm-bench"))
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.makedirs(args.data, exist_ok=True)
    path, tok = make_data(args.data)
    if args.one:
        print(json.dumps(measure(args.one, path, tok, args.tokens, args.decoder)), flush=True)
        return
    compile_project()  # start-up from bytecode, as at install
    env = dict(os.environ, OMP_NUM_THREADS="1")  # as torchrun sets it for each rank

    def one_run(name: str) -> dict | None:
        argv = ["--one", name, "--tokens", str(args.tokens), "--data", args.data, "--decoder", args.decoder]
        return in_fresh_process(__file__, argv, name, timeout=900, env=env)

    def said(name: str, result: dict) -> str:
        return f"{result['tokens_per_s']:,.0f} usable tokens/s"

    results = {name: runs for name, runs in interleaved(systems(), args.reps, one_run, said).items() if runs}
    write(results, args, [*decoders(), "", "The resize alone, on the decoded photographs:", "", *resizes()])


def write(results: dict, args, decoder_lines: list[str]) -> None:
    for runs in results.values():  # the rate once the first batch is out: without start-up
        for r in runs:
            r["after_first"] = args.tokens / (args.tokens / r["tokens_per_s"] - r["first_batch_s"])
    med = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in results.items()}
    import importlib.metadata as md

    import PIL

    data = (
        f"Data: scikit-image's and scikit-learn's photographs x{REPEATS}, Parquet; {SIZE}px centre crops in "
        f"{PATCH}px patches ({(SIZE // PATCH) ** 2} tokens each), GPT-2 captions, rows of {SEQ + 1}, "
        f"batches of {MICROBATCH}."
    )

    lines = [
        "# Figure 3 on CPU: an image-text pipeline, usable tokens/s as parallelism grows",
        "",
        f"Machine: {platform.machine()}, {CORES} CPUs, Python {platform.python_version()}; "
        f"Pillow {PIL.__version__}, grain {md.version('grain')}; zephon decodes with "
        f"`images(decoder={args.decoder!r})` and resizes with Pillow or, where it says torch, "
        "`images(resizer='torch')`; Grain decodes and resizes with Pillow. Each run in a process with "
        "torch imported before the clock starts and `OMP_NUM_THREADS=1`, as a TorchTitan rank under "
        "torchrun.",
        f"Command: `python benchmarks/vlm.py --tokens {args.tokens} --reps {args.reps}"
        f"{'' if args.decoder == 'pillow' else f' --decoder {args.decoder}'}`. Medians of "
        f"{args.reps} interleaved runs, each in a fresh process, {args.tokens:,} usable tokens end to end "
        '(start-up included, from bytecode compiled as at install; "after the first batch" leaves it '
        "out).",
        data,
        f"One GPU, Llama 3.1 8B on H100s (TorchTitan docs/performance.md): {LLAMA_8B_H100:,} tokens/s.",
        "",
        "| parallelism | system | usable tokens/s | vs Grain fastest | steady | vs Grain fastest "
        "| after the first batch | first batch | peak RSS | padding |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in range(1, CORES + 1):
        grain_best = med.get(f"Grain fastest x{p}", {}).get("tokens_per_s")
        grain_steady = med.get(f"Grain fastest x{p}", {}).get("steady")
        for kind in KINDS:
            m = med.get(f"{kind} x{p}")
            if not m:
                lines.append(f"| {p} | {kind} | failed | | | | | | | |")
                continue
            ratio = f"{m['tokens_per_s'] / grain_best:.2f}x" if grain_best else "-"
            steady = f"{m['steady'] / grain_steady:.2f}x" if grain_steady else "-"
            lines.append(
                f"| {p} | {kind} | {m['tokens_per_s']:,.0f} | {ratio} | {m['steady']:,.0f} | {steady} | "
                f"{m['after_first']:,.0f} | "
                f"{m['first_batch_s']:.2f} s | "
                f"{m['peak_rss'] / 2**30:.2f} GiB | {m['padding']:.2%} |"
            )
    lines += [
        "", "## The decoder", "",
        "Each `images(decoder=...)` installed, on the photographs through the operator (decode, JPEG at "
        "Pillow's draft scale, EXIF turn, Pillow's bicubic resize to the 224 centre crop, patches), one "
        "thread, in the benchmark's process, interleaved, medians, and all of them again with "
        "`resizer='torch'` (one torch thread; a decoder's pixels go to it without a Pillow image); "
        "pixels against Pillow's:",
        "", *decoder_lines,
    ]  # fmt: skip
    write_result("vlm.md", lines, echo=False)
    write_json(
        "vlm.json", {"tokens": args.tokens, "reps": args.reps, "decoder": args.decoder, "results": results}
    )
    plot(med, result_path("vlm.png"))
    print("\n".join(lines))


def plot(med: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    xs = list(range(1, CORES + 1))
    styles = {"zephon thread": ("C2", "o-"), "zephon process": ("C2", "s--"),
              "zephon thread torch": ("C0", "o-"), "zephon process torch": ("C0", "s--"),
              "Grain fastest": ("C7", "o-"), "Grain invariant": ("C7", "s--")}  # fmt: skip
    for kind, (color, style) in styles.items():
        ys = [med.get(f"{kind} x{p}", {}).get("tokens_per_s") for p in xs]
        ax.plot(xs, ys, style, color=color, label=f"{kind}, end to end")
        ys = [med.get(f"{kind} x{p}", {}).get("steady") for p in xs]
        ax.plot(xs, ys, style, color=color, alpha=0.45, label=f"{kind}, steady")
    ax.axhline(LLAMA_8B_H100, color="k", ls=":", lw=1, label="one H100, Llama 3.1 8B (TorchTitan)")
    ax.set_xlabel("parallelism (workers)")
    ax.set_ylabel("usable tokens/s, end to end")
    ax.set_xticks(xs)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.set_title("Image-text pipeline on CPU: decode, patches, tokenize, pack, batch")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
