"""Scale: what a job start and a restart cost the store, measured with real processes on a moto S3
store, and the formula of each cost, checked against the measured points and carried to 16,384
ranks and a million files.

Measured (moto's S3 server on 127.0.0.1, every request logged with its User-Agent, so that each
rank's requests are its own):

- one plan of ``--files`` Parquet files (20 documents each): its requests and bytes;
- a job of ``--ranks`` rank processes (64 lanes, one per rank) started together, sharing one plan:
  rank 0 plans and saves it, the others load it (the engine's way; TorchTitan sends it over the
  process group), each reads until its first batch;
- the same job the way every rank planned before this round (``--baseline-ranks`` processes, each
  planning alone), to check the per-rank formula;
- a restart: rank 0 lists the files again to check the plan still holds (``jobplan.changes``);
- a plan of a million files given their listing: time, size in memory and on disk.

Then the model: per job start and per restart, requests and bytes against the store, plan size,
planning time, memory per rank and time to every rank's first batch, for ranks 8 to 16,384, files
1k to 1M, lanes up to 65,536, with a store at S3's 5,500 requests/s per prefix and 20 ms a request.

    python benchmarks/scale.py                     # about 5 minutes on 2 cores
    python benchmarks/scale.py --ranks 16 --files 200   # quicker
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]  # benchmarks.common; the tests' moto server

from benchmarks.common import write_json, write_result  # noqa: E402

ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
       "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}  # fmt: skip
LANES = 64

# -- the model ----------------------------------------------------------------------------------------

LIST_PAGE = 1000  # keys per listing request
STORE_RATE = 5500  # requests/s an S3 prefix serves
LATENCY = 0.020  # seconds a request takes
PROCESS_SLOTS = 64  # io_options max_requests: a process's requests in flight
BROADCAST_BW = 10e9  # bytes/s of a process group broadcast (NCCL over InfiniBand)
STARTUP = 3.0  # seconds every rank spends before it asks anything (imports, tokenizer), measured here


def model(ranks: int, files: int, lanes: int, meta: float, fixed: int, first: float, bytes_per_file: float,
          spans_per_file: float, chunks_per_file: float, prefixes: int = 1,
          client: float = 0.0) -> dict:  # fmt: skip
    """Each cost of a job start and a restart, in the ranks, files and lanes.

    ``meta``: metadata requests per file to plan it (Parquet: its footer; JSON lines: 0);
    ``fixed``: requests of a listing besides its pages; ``first``: requests a rank makes until its
    first batch (its first lane's first chunks: a footer and a row group); plan bytes:
    ``bytes_per_file`` a file and 36 a span; every rank also holds a chunk permutation (4 bytes a
    chunk); the store serves ``STORE_RATE`` requests/s per prefix, over ``prefixes`` prefixes."""
    pages = math.ceil(files / LIST_PAGE)
    listing = fixed + pages
    plan_requests = listing + meta * files
    store = STORE_RATE * prefixes
    plan_alone = plan_seconds(files, meta, LATENCY, STORE_RATE, 1, prefixes, client)  # rank 0's
    plan_split = plan_seconds(files, meta, LATENCY, STORE_RATE, ranks, prefixes, client)  # all ranks'
    plan_bytes = files * bytes_per_file + 36 * files * spans_per_file
    first_requests = ranks * first
    first_seconds = max(first * LATENCY, first_requests / store)
    broadcast = plan_bytes / BROADCAST_BW + math.ceil(math.log2(max(ranks, 2))) * 50e-6
    return {
        "start_requests_today": ranks * plan_requests + first_requests,
        "start_requests": plan_requests + first_requests,
        "restart_requests": listing + first_requests,
        "plan_bytes": plan_bytes,
        "memory_per_rank": plan_bytes + 4 * files * chunks_per_file,
        "plan_alone": plan_alone,
        "plan_split": plan_split,
        "first_batch_today": STARTUP + max(plan_alone, ranks * plan_requests / store) + first_seconds,
        "first_batch": STARTUP + plan_alone + broadcast + first_seconds,
        "first_batch_split": STARTUP + plan_split + broadcast + first_seconds,
        "restart_first_batch": STARTUP + pages * LATENCY + broadcast + first_seconds,
    }


# -- one rank process -----------------------------------------------------------------------------------


def rank_main(args) -> None:
    """One rank: its pipeline (rank ``args.rank`` of ``args.ranks``); rank 0 plans and saves the
    plan, the others wait for it (``--shared``), or every rank plans alone; then its first batch.
    Prints one JSON line."""
    from zephon import Dataset, Pipeline
    from zephon.jobplan import JobPlan

    client = {"endpoint_url": args.endpoint, "region_name": "us-east-1"}
    # the store counts each rank's requests by its User-Agent; 64 ranks importing at once on 2
    # cores starve the store (one process here), so a request may take long to be answered
    config = {"user_agent_extra": f"zephon-rank-{args.rank}", "read_timeout": 600, "connect_timeout": 600}
    storage = {"client_kwargs": client, "config_kwargs": config, "skip_instance_cache": True}
    dataset = Dataset.from_path("pq", "s3://corpus/pq/", storage_options=storage, exhausted="repeat")
    patient = {"retries": {"budget": 1200.0, "attempts": 20}}
    pipeline = (
        Pipeline(dataset)
        .options(num_lanes=LANES, dp_rank=args.rank, dp_world_size=args.ranks, runner="inline")
        .options(io_options=patient)
        .tokenize(args.gpt2).pack_flat(128).batch(1)
    )  # fmt: skip
    if args.shared and args.rank == 0:
        plan = pipeline.plan()
        plan.save(args.plan + ".part")  # the others wait for the whole file
        os.replace(args.plan + ".part", args.plan)
    elif args.shared:
        while not os.path.exists(args.plan):
            time.sleep(0.05)
        plan = JobPlan.load(args.plan)
    if args.shared:
        pipeline = pipeline.with_plan(plan)
    next(iter(pipeline))
    io_stats = pipeline.stats()["io"]["pq"]
    print(json.dumps({"rank": args.rank, "first_batch": time.time() - args.t0, **io_stats}), flush=True)
    pipeline.close()


def launch(ranks: int, shared: bool, endpoint: str, gpt2: str, plan: str) -> list[dict]:
    t0 = time.time()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--rank",
                str(r),
                "--of",
                str(ranks),
                "--endpoint",
                endpoint,
                "--gpt2",
                gpt2,
                "--plan",
                plan,
                "--t0",
                str(t0),
                *(["--shared"] if shared else []),
            ],
            preexec_fn=lambda: os.nice(10),  # the store (this process) answers first
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **ENV},
        )
        for r in range(ranks)
    ]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=1800)
        if p.returncode:
            raise RuntimeError(f"a rank failed: {stderr[-2000:]}")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


# -- the measurements ---------------------------------------------------------------------------------


def per_rank(server, ranks: int) -> list[int]:
    counts = [0] * ranks
    for agent in server.agents:
        for word in agent.split():
            if word.startswith("zephon-rank-"):
                counts[int(word.rsplit("-", 1)[1])] += 1
    return counts


def measure_store(args, tmp: str, gpt2: str, calibrate_only: bool = False) -> dict:
    import boto3
    from support.fakes3 import CountingMotoServer

    from zephon import Dataset
    from zephon.jobplan import changes, make_plan
    from zephon.runners import planning_map
    from zephon.testing import synthetic_documents, write_parquet

    server = CountingMotoServer(port=0)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket="corpus")
    docs = synthetic_documents(20 * args.files, seed=3)
    keys = [f"pq/part-{i:05d}.parquet" for i in range(args.files)]
    for i, key in enumerate(keys):
        buffer = io.BytesIO()
        write_parquet(buffer, docs[20 * i : 20 * (i + 1)], row_group_size=20)
        client.put_object(Bucket="corpus", Key=key, Body=buffer.getvalue())
    storage = {
        "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        "skip_instance_cache": True,
    }
    out = {"files": args.files, "ranks": args.ranks, "lanes": LANES}
    try:
        server.reset()
        start = time.monotonic()
        dataset = Dataset.from_path("pq", "s3://corpus/pq/", storage_options=storage)
        plan = make_plan([dataset], LANES, None, None, _io(), planning_map(_io()))
        out["plan_seconds"] = time.monotonic() - start
        out["plan_requests"] = len(server.log)
        out["plan_bytes_read"] = server.bytes_served
        out["plan_size"] = plan.nbytes
        out["plan_spans"] = sum(len(d.chunks.first) - 1 for d in plan.datasets)
        out["plan_chunks"] = plan.chunks
        latencies = []
        for _ in range(20):
            t = time.monotonic()
            client.head_object(Bucket="corpus", Key=keys[0])
            latencies.append(time.monotonic() - t)
        out["latency"] = sorted(latencies)[len(latencies) // 2]
        out["store_rate"] = store_rate(client, keys)
        if calibrate_only:
            return out

        server.reset()
        shared = launch(args.ranks, True, endpoint, gpt2, os.path.join(tmp, "job.zplan"))
        counts = per_rank(server, args.ranks)
        out["shared"] = {"requests": counts, "total": len(server.log), "ranks": shared,
                         "rank0_plan_requests": shared[0]["plan_requests"]}  # fmt: skip

        server.reset()
        alone = launch(args.baseline_ranks, False, endpoint, gpt2, os.path.join(tmp, "unused.zplan"))
        out["alone"] = {
            "requests": per_rank(server, args.baseline_ranks),
            "total": len(server.log),
            "ranks": alone,
        }

        server.reset()
        fresh = Dataset.from_path("pq", "s3://corpus/pq/", storage_options=storage)
        start = time.monotonic()
        out["restart_changes"] = changes(plan, [fresh], _io())
        out["restart_seconds"] = time.monotonic() - start
        out["restart_requests"] = len(server.log)
    finally:
        server.stop()
    return out


def store_rate(client, keys: list[str]) -> float:
    """Requests/s this store serves: every file's last 64 KiB (a footer read, as planning makes
    it), ``PROCESS_SLOTS`` requests in flight, timed together."""
    from concurrent.futures import ThreadPoolExecutor

    def footer(key: str) -> None:
        client.get_object(Bucket="corpus", Key=key, Range="bytes=-65536")["Body"].read()

    start = time.monotonic()
    with ThreadPoolExecutor(PROCESS_SLOTS) as pool:
        list(pool.map(footer, keys))
    return len(keys) / (time.monotonic() - start)


def plan_seconds(
    files: int,
    meta: float,
    latency: float,
    rate: float,
    ranks: int = 1,
    prefixes: int = 1,
    client: float = 0.0,
) -> float:
    """The formula of a plan's time: its listing pages one after the other, then its metadata
    reads, P in flight per process, bound by the store's rate or by the processes' own work
    (``client`` seconds a read in one process, shared by the ``ranks``)."""
    per_read = max(1 / min(ranks * PROCESS_SLOTS / latency, rate * prefixes), client / ranks)
    return math.ceil(files / LIST_PAGE) * latency + meta * files * per_read


def _io():
    from zephon.io import IOConfig

    return IOConfig()


def measure_million(files: int = 1_000_000) -> dict:
    """A plan of ``files`` JSON lines files of 16 MB given their listing (no store involved): the
    time to cut them into chunks and make the plan, and its size in memory and on disk."""
    import numpy as np

    from zephon.io import Dataset
    from zephon.io.chunks import FileTable
    from zephon.io.formats import format_for
    from zephon.jobplan import make_plan

    names = [f"s3://bucket/crawl/{i // 1000:04d}/part-{i:07d}.jsonl" for i in range(files)]
    versions = [f"{i:032x}" for i in range(files)]
    sizes = np.full(files, 16 << 20, np.int64)
    listing = FileTable.of([__import__("zephon.io.chunks", fromlist=["Shard"]).Shard(u, int(s), v)
                            for u, s, v in zip(names, sizes, versions, strict=True)])  # fmt: skip
    del names, versions
    dataset = Dataset.from_path("web", "s3://bucket/crawl/")
    dataset._cache.update(shards=listing, format=format_for("jsonl", None), fields=None)
    tracemalloc.start()
    start = time.monotonic()
    plan = make_plan([dataset], 65536, None, None, _io())
    seconds = time.monotonic() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    start = time.monotonic()
    data = plan.to_bytes()
    again = type(plan).from_bytes(data)
    roundtrip = time.monotonic() - start
    return {"files": files, "chunks": plan.chunks, "plan_seconds": seconds, "peak_bytes": peak,
            "plan_bytes": plan.nbytes, "file_bytes": len(data), "save_load_seconds": roundtrip,
            "same": again.summary() == plan.summary()}  # fmt: skip


# -- the report -----------------------------------------------------------------------------------------


def human(n: float) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= size:
            return f"{n / size:.1f}{unit}"
    return f"{n:.0f}"


def fitted(store: dict) -> dict:
    """The model's parameters read off the measured points."""
    files = store["files"]
    fixed = store["restart_requests"] - math.ceil(files / LIST_PAGE)
    others = store["shared"]["requests"][1:]
    return {
        "meta": (store["plan_requests"] - store["restart_requests"]) / files,
        "fixed": fixed,
        "first": sorted(others)[len(others) // 2] if others else 0,
        "bytes_per_file": (store["plan_size"] - 36 * store["plan_spans"]) / files,
        # seconds of the planning process per metadata read (bound by itself, not by the store)
        "client": (store["plan_seconds"] - math.ceil(files / LIST_PAGE) * store["latency"])
        / max(store["plan_requests"] - store["restart_requests"], 1),
    }


def pct(formula: float, measured: float) -> str:
    return f"{formula:,.0f} vs {measured:,.0f} ({100 * (measured - formula) / formula:+.1f}%)"


def _bound(store: dict, client: float) -> str:
    """Whether the measured plan was bound by the store or by the planning process's own work."""
    store_bound = 1 / min(PROCESS_SLOTS / store["latency"], store["store_rate"])
    if client <= 1.1 * store_bound:
        return ": the plan is bound by the store, as the formula says"
    return (
        f": the plan here is bound by the planning process itself, c = {client * 1e3:.1f} ms a metadata "
        "read (an s3fs request and a pyarrow footer parse, on 2 cores), which the model carries (c / R a "
        "read when R ranks share the reads)"
    )


def _seconds(formula: float, measured: float) -> str:
    return f"{formula:.2f} s vs {measured:.2f} s ({100 * (measured - formula) / formula:+.1f}%)"


def report(store: dict, million: dict) -> list[str]:
    files, ranks, p = store["files"], store["ranks"], fitted(store)
    shared, alone = store["shared"], store["alone"]
    n_alone, first = len(alone["requests"]), p["first"]
    times = [r["first_batch"] for r in shared["ranks"]]
    lines = [
        "# Scale: one plan per job",
        "",
        "`python benchmarks/scale.py` (moto's S3 server on 127.0.0.1; every rank a real process; "
        "each request counted by its rank's User-Agent).",
        "",
        f"## Measured: {files:,} Parquet files (20 documents each), {LANES} lanes, {ranks} rank processes",
        "",
        f"- one plan: {store['plan_requests']:,} requests, {human(store['plan_bytes_read'])}B read, "
        f"{store['plan_seconds']:.1f} s; the plan {human(store['plan_size'])}B "
        f"({store['plan_spans']:,} spans, "
        f"{store['plan_chunks']:,} chunks); a request to this store takes {store['latency'] * 1e3:.1f} ms",
        f"- {ranks} ranks started together, sharing one plan: {shared['total']:,} requests until every "
        f"rank's first batch; rank 0 {shared['requests'][0]:,} (its plan, {shared['rank0_plan_requests']:,} "
        f"counted by zephon, and its first batch), every other rank {min(shared['requests'][1:], default=0)}"
        f"-{max(shared['requests'][1:], default=0)} (median {first}): its first chunks, no listing, no "
        "planning read",
        f"- {n_alone} ranks each planning alone, as before this round: {alone['total']:,} requests, "
        f"{min(alone['requests']):,}-{max(alone['requests']):,} per rank",
        f"- a restart: rank 0 lists the files again, {store['restart_requests']:,} requests in "
        f"{store['restart_seconds']:.2f} s ({store['restart_requests'] / store['plan_requests']:.3f} of a "
        f"plan's); changes found: {store['restart_changes'] or 'none'}",
        f"- seconds from the start to each rank's first batch, all {ranks} started together on 2 cores: "
        f"{min(times):.1f}-{max(times):.1f} (most of it {ranks} interpreters importing on 2 cores)",
        "",
        f"## Measured: a plan of {million['files']:,} JSON lines files given their listing, 65,536 lanes",
        "",
        f"- {million['chunks']:,} chunks, made in {million['plan_seconds']:.1f} s on one core; "
        f"{human(million['plan_bytes'])}B in memory ({million['plan_bytes'] / million['files']:.0f} bytes a "
        f"file), {human(million['file_bytes'])}B on disk, saved and loaded in "
        f"{million['save_load_seconds']:.1f} "
        f"s; peak of the making {human(million['peak_bytes'])}B besides the listing",
        "",
        "## The formulas",
        "",
        "R ranks, F files, m metadata requests per file to plan it (Parquet: its footer, here "
        f"{p['meta']:.2f}; "
        f"JSON lines: 0), a listing: {p['fixed']} requests plus one per 1,000 files, k requests a rank makes "
        f"until its first batch (here {first}), t = {LATENCY * 1e3:.0f} ms a request, X = {STORE_RATE:,} "
        f"requests/s a prefix serves, P = {PROCESS_SLOTS} requests a process has in flight "
        "(io_options max_requests):",
        "",
        f"- a plan: Q = {p['fixed']} + ceil(F / 1000) + m F requests; made by rank 0 alone in "
        "ceil(F / 1000) t + m F max(1 / min(P / t, X), c) seconds, with its metadata reads split over "
        "the ranks in ceil(F / 1000) t + m F max(1 / min(R P / t, X x prefixes), c / R); c: a process's "
        "own seconds a metadata read (measured below)",
        "- a job start: R Q + R k requests before this round, Q + R k with one plan",
        f"- a restart: R Q + R k before, {p['fixed']} + ceil(F / 1000) + R k now (rank 0 lists again)",
        f"- plan size: {p['bytes_per_file']:.0f} bytes a file + 36 bytes a span (a file of a line format, a "
        "row group); memory per rank: the plan + 4 bytes a chunk (an epoch's permutation)",
        "- seconds to every rank's first batch: startup (3 s) + planning + broadcast (size / 10 GB/s) + "
        "max(k t, R k / X); a restart: startup + ceil(F / 1000) t + broadcast + max(k t, R k / X)",
        "",
        "Checked against the measured points:",
        "",
        f"- requests of {ranks} ranks sharing one plan, Q + R k: "
        f"{pct(store['plan_requests'] + ranks * first, shared['total'])}",
        f"- requests of {n_alone} ranks each planning, R Q + R k: "
        f"{pct(n_alone * (store['plan_requests'] + first), alone['total'])}",
        f"- plan size: {pct(p['bytes_per_file'] * files + 36 * store['plan_spans'], store['plan_size'])}",
        f"- plan time, ceil(F / 1000) t + m F / min(P / t, X) with this store's t = "
        f"{store['latency'] * 1e3:.1f} ms and X = {store['store_rate']:,.0f} requests/s (measured: "
        f"{PROCESS_SLOTS} footer reads in flight): "
        + _seconds(
            plan_seconds(files, p["meta"], store["latency"], store["store_rate"]), store["plan_seconds"]
        )
        + _bound(store, p["client"]),
        f"- plan size at {million['files']:,} files: "
        f"{pct(p['bytes_per_file'] * million['files'] + 36 * million['files'], million['plan_bytes'])} bytes",
        "",
        "## The model per job start and restart (t = 20 ms, 5,500 requests/s per prefix)",
        "",
        "| ranks | files | format | start requests, before | one plan | restart | plan size | memory/rank | "
        "plan, rank 0 | plan, split | first batch, rank 0 plans | split | split, 8 prefixes | restart |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    cases = ((8, 1_000, 64), (64, 1_000, 64), (512, 10_000, 512), (1_024, 10_000, 4_096),
             (4_096, 100_000, 16_384), (16_384, 1_000_000, 65_536))  # fmt: skip
    for ranks_, files_, lanes_ in cases:
        for fmt, meta in (("Parquet", p["meta"]), ("JSON lines", 0.0)):
            args = (ranks_, files_, lanes_, meta, p["fixed"], first, p["bytes_per_file"], 1.0, 16.0)
            c = model(*args, client=p["client"])
            eight = model(*args, 8, client=p["client"])
            lines.append(
                f"| {ranks_:,} | {files_:,} | {fmt} | {human(c['start_requests_today'])} | "
                f"{human(c['start_requests'])} | {human(c['restart_requests'])} | "
                f"{human(c['plan_bytes'])}B | "
                f"{human(c['memory_per_rank'])}B | {c['plan_alone']:.1f} s | {c['plan_split']:.1f} s | "
                f"{c['first_batch']:.1f} s | {c['first_batch_split']:.1f} s | "
                f"{eight['first_batch_split']:.1f} s | "
                f"{c['restart_first_batch']:.1f} s |"
            )
    return lines


def plot(store: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p = fitted(store)
    ranks = [8, 64, 512, 4096, 16384]

    def curve(key: str, files: int, meta: float, prefixes: int = 1) -> list[float]:
        return [model(r, files, max(r, 64), meta, p["fixed"], p["first"], p["bytes_per_file"], 1, 16,
                      prefixes, p["client"])[key] for r in ranks]  # fmt: skip

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for files, style in ((10_000, "-"), (1_000_000, "--")):
        axes[0].plot(ranks, curve("start_requests_today", files, p["meta"]), "r" + style,
                     label=f"every rank plans, {files:,} Parquet files")  # fmt: skip
        axes[0].plot(ranks, curve("start_requests", files, p["meta"]), "g" + style,
                     label=f"one plan per job, {files:,} Parquet files")  # fmt: skip
        axes[1].plot(
            ranks, curve("first_batch", files, p["meta"]), "b" + style, label=f"rank 0 plans, {files:,} files"
        )
        axes[1].plot(ranks, curve("first_batch_split", files, p["meta"], 8), "m" + style,
                     label=f"split over the ranks, 8 prefixes, {files:,} files")  # fmt: skip
        axes[1].plot(
            ranks,
            curve("restart_first_batch", files, p["meta"]),
            "c" + style,
            label=f"restart, {files:,} files",
        )
    axes[0].scatter(
        [store["ranks"]], [store["shared"]["total"]], color="k", zorder=5, label="measured (moto)"
    )
    alone = store["alone"]
    axes[0].scatter([len(alone["requests"])], [alone["total"]], color="k", marker="x", label="measured, each")
    for ax in axes:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("ranks")
        ax.legend(fontsize=7)
    axes[0].set_ylabel("store requests per job start")
    axes[1].set_ylabel("seconds to every rank's first batch (Parquet)")
    axes[1].axhline(60, color="gray", lw=0.5)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--baseline-ranks", type=int, default=4)
    parser.add_argument(
        "--million", type=int, default=1_000_000, help="files of the plan made from a listing"
    )
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help="measure only the plan's time and the store's rate again; the rest from results/scale.json",
    )
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--of", type=int, dest="ranks_of", help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--gpt2", help=argparse.SUPPRESS)
    parser.add_argument("--plan", help=argparse.SUPPRESS)
    parser.add_argument("--t0", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--shared", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        args.ranks = args.ranks_of
        return rank_main(args)
    from zephon.testing import gpt2_tokenizer_dir

    os.environ.update(ENV)
    with tempfile.TemporaryDirectory(prefix="zephon-scale-") as tmp:
        gpt2 = gpt2_tokenizer_dir(os.path.join(tmp, "gpt2"))
        store = measure_store(args, tmp, gpt2, calibrate_only=args.calibrate)
    if args.calibrate:
        with open(os.path.join(ROOT, "benchmarks", "results", "scale.json")) as f:
            saved = json.load(f)
        store, million = {**saved["store"], **store}, saved["million"]
    else:
        million = measure_million(args.million)
    write_json("scale.json", {"store": store, "million": million})
    write_result("scale.md", report(store, million))
    plot(store, os.path.join(ROOT, "benchmarks", "results", "scale.png"))


if __name__ == "__main__":
    main()
