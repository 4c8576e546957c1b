"""Digests of the batches of 11 recipes, to show that a change leaves the data as it was.

    python scripts/batch_digests.py before.json          # on the code before the change
    python scripts/batch_digests.py after.json           # after it
    python scripts/batch_digests.py --compare before.json after.json

The recipes cover mixtures by tokens and by documents, schedules, wrap and best-fit packing,
document masks off, ``max_documents_per_row``, ``balance_attention``, ``on_error="skip"`` and
datasets that stop, on the real text of ``zephon.testing.data`` (KJV verses and chapters, Python
files) and synthetic JSON lines (with broken lines), text and Parquet. For each: the digests of
its first batches inline (1,500 for the benchmark's recipe, 400 for the others), whether a run
restored at 4 points gives the same next batches, whether the thread and process runners (2
workers) give the same batches, and for three recipes whether the HF backend does. ``--quick``
leaves the process runner out. About 20 seconds on 2 cores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WEIGHTS = {"verses": 0.4, "chapters": 0.35, "code": 0.25}


def corpora(folder: str) -> dict[str, str]:
    """The data in ``folder`` (made once): the three real-text datasets and three synthetic ones."""
    from zephon.testing import gpt2_tokenizer_dir, synthetic_documents, write_parquet, write_text
    from zephon.testing.data import real_text_corpora

    marker = os.path.join(folder, "done")
    if not os.path.exists(marker):
        real_text_corpora(folder)
        gpt2_tokenizer_dir(os.path.join(folder, "gpt2"))
        rng = random.Random(1)
        with open(os.path.join(folder, "bad.jsonl"), "w") as f:
            for doc in synthetic_documents(3000, seed=3, min_words=0, max_words=400):
                r = rng.random()
                if r < 0.02:
                    f.write('{"text": "broken\n')
                elif r < 0.04:
                    f.write(json.dumps({"other": 1}) + "\n")
                elif r < 0.05:
                    f.write("\n")
                elif r < 0.06:
                    f.write(json.dumps({"text": ""}) + "\n")
                else:
                    f.write(json.dumps(doc) + "\n")
        write_parquet(
            os.path.join(folder, "syn.parquet"), synthetic_documents(2000, seed=5), row_group_size=97
        )
        write_text(os.path.join(folder, "syn.txt"), synthetic_documents(2000, seed=6))
        open(marker, "w").close()
    return {n: os.path.join(folder, f"{n}.jsonl") for n in WEIGHTS}


def recipes(folder: str) -> dict:
    """name -> make(runner, workers, backend): a pipeline."""
    from zephon import Dataset, Pipeline
    from zephon.work import MixtureWorkSource
    from zephon.work.source import ScheduledMixtureWorkSource

    files, tok = corpora(folder), os.path.join(folder, "gpt2")
    later = {"verses": 0.1, "chapters": 0.1, "code": 0.8}

    def ds(**kw):
        return [Dataset.from_path(n, p, exhausted="repeat", **kw) for n, p in files.items()]

    def base(source, runner, workers, backend, lanes=8, **opts):
        opts = {"num_lanes": lanes, "runner": runner, **opts}
        return Pipeline(source).options(**opts).tokenize(tok, parallelism=workers, backend=backend)

    def mix(unit, seed=0):
        return MixtureWorkSource(ds(), WEIGHTS, unit=unit, seed=seed)

    def scheduled(unit, at, weights):
        points = [{"at": 0, "weights": WEIGHTS}, {"at": at, "weights": weights, "ramp": "linear"}]
        return ScheduledMixtureWorkSource(ds(), points, unit=unit, seed=8)

    def skipping(runner, workers, backend):
        data = [
            Dataset.from_path("bad", os.path.join(folder, "bad.jsonl"), on_error="skip", exhausted="stop"),
            Dataset.from_path("txt", os.path.join(folder, "syn.txt"), exhausted="repeat"),
            Dataset.from_path("pq", os.path.join(folder, "syn.parquet"), exhausted="repeat"),
        ]
        source = MixtureWorkSource(data, {"bad": 2, "txt": 1, "pq": 1}, unit="tokens", seed=9)
        p = base(source, runner, workers, backend, lanes=2, chunk_bytes=40_000, chunk_size=150)
        return p.pack_flat(300).shuffle(16).batch(2)

    def single(name, runner, workers, backend, **opts):
        return (
            Pipeline(Dataset.from_path(name, files[name]))
            .options(num_lanes=4, runner=runner, **opts)
            .tokenize(tok, parallelism=workers, backend=backend)
        )

    def balanced(*a):
        p = base(mix("documents", 5), *a, lanes=2, chunk_bytes=250_000)
        return p.pack_flat(900, "best_fit", max_documents_per_row=5).shuffle(50, seed=1)

    return {
        "bench": lambda *a: base(mix("tokens"), *a).pack_flat(2048).shuffle(256).batch(8),
        "docs_bestfit": lambda *a: base(mix("documents", 7), *a, lanes=4, chunk_bytes=200_000)
        .pack_flat(512, "best_fit").shuffle(64, seed=3).batch(4),
        "tokens_nomask": lambda *a: base(mix("tokens", 2), *a, lanes=2, chunk_bytes=300_000)
        .pack_flat(1024, document_mask=False).batch(4),
        "wrap_maxdocs": lambda *a: base(mix("tokens", 4), *a, lanes=4, chunk_bytes=150_000)
        .pack_flat(700, max_documents_per_row=3).shuffle(32).batch(2),
        "bestfit_maxdocs_balance": lambda *a: balanced(*a).batch(4, balance_attention=True),
        "balance_wrap": lambda *a: base(mix("tokens", 6), *a, lanes=4)
        .pack_flat(2048).shuffle(64).batch(4, balance_attention=True),
        "schedule": lambda *a: base(scheduled("tokens", 2_000_000, later), *a, lanes=4, chunk_bytes=400_000)
        .pack_flat(1024).shuffle(64).batch(4),
        "schedule_docs": lambda *a: base(scheduled("documents", 3000, later), *a, lanes=2)
        .pack_flat(1024, "best_fit").batch(4),
        "skip_bad_stop": skipping,
        "single_stop": lambda *a: single("verses", *a, chunk_bytes=1 << 17)
        .pack_flat(128, "best_fit").batch(8),
        "single_wrap_stop": lambda *a: single("code", *a).pack_flat(4096).shuffle(8).batch(2),
    }  # fmt: skip


def digest(batch) -> str:
    h = hashlib.sha256(batch.digest().encode())
    if batch.starts is not None:
        h.update(batch.starts.tobytes())
    h.update(json.dumps(batch.counters, sort_keys=True).encode())
    return h.hexdigest()[:16]


def batches(make, n: int, keep_states=()) -> tuple[list[str], dict]:
    pipeline, out, states = make(), [], {}
    for i, batch in enumerate(pipeline):
        out.append(digest(batch))
        if i + 1 in keep_states:
            states[i + 1] = pipeline.state_dict()
        if len(out) >= n:
            break
    pipeline.close()
    return out, states


def one(name: str, make, quick: bool) -> dict:
    n = 1500 if name == "bench" else 400
    ref, states = batches(lambda: make("inline", 1, "auto"), n, (3, 17, 64, n // 2))
    result: dict = {"digests": ref}
    for k, state in states.items():
        pipeline, tail = make("inline", 1, "auto"), []
        pipeline.load_state_dict(state)
        for batch in pipeline:
            tail.append(digest(batch))
            if len(tail) >= min(40, n - k):
                break
        pipeline.close()
        result[f"restore{k}"] = tail == ref[k : k + len(tail)]
    for runner in ("thread",) if quick else ("thread", "process"):
        got, _ = batches(lambda runner=runner: make(runner, 2, "auto"), min(n, 300))
        result[f"{runner}2"] = got == ref[: len(got)]
    if name in ("bench", "docs_bestfit", "skip_bad_stop"):
        got, _ = batches(lambda: make("inline", 1, "tokenizers"), min(n, 200))
        result["hf"] = got == ref[: len(got)]
    return result


def compare(before: str, after: str) -> int:
    with open(before) as f:
        a = json.load(f)
    with open(after) as f:
        b = json.load(f)
    problems = [f"{name}: not in {before}" for name in b if name not in a]
    for name, result in b.items():
        for key, value in result.items():
            if value is False:
                problems.append(f"{name}: {key} differs from its inline run")
            elif name in a and key in a[name] and a[name][key] != value:
                problems.append(f"{name}: {key} changed")
    print("\n".join(problems) or f"the same: {len(b)} recipes")
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", help="where to write the digests (JSON)")
    parser.add_argument("--quick", action="store_true", help="leave the process runner out")
    parser.add_argument("--only", nargs="*", help="these recipes only")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    parser.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "zephon-batch-digests"))
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    if not args.out:
        parser.error("give the file to write, or --compare BEFORE AFTER")
    sys.path.insert(0, ROOT)
    os.makedirs(args.data, exist_ok=True)
    out = {}
    for name, make in recipes(args.data).items():
        if args.only and name not in args.only:
            continue
        start = time.perf_counter()
        out[name] = one(name, make, args.quick)
        checks = {k: v for k, v in out[name].items() if isinstance(v, bool)}
        print(
            f"{name}: {len(out[name]['digests'])} batches, {checks}, {time.perf_counter() - start:.1f} s",
            flush=True,
        )
    with open(args.out, "w") as f:
        json.dump(out, f, indent=0, sort_keys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
