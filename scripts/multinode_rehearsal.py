#!/usr/bin/env python
"""A multi-node rehearsal on one machine: two torchrun launchers as two nodes, the data in S3.

TorchTitan's llama3 debug model on the debug recipe, its corpus (assets/debug_corpus, 4 Parquet
files) in a bucket of moto's S3 server on 127.0.0.1, which logs every request it serves:

1. one job plan made by ``pipeline.plan()`` alone: what planning once costs the store;
2. ``NNODES=2 NODE_RANK=0|1 NGPU=2 ./run_train.sh --training.steps 6 --checkpoint.interval 3``:
   4 ranks on 2 nodes (two launchers, a c10d rendezvous on 127.0.0.1), a checkpoint at step 3;
3. the same job resumed from step 3 on one node with 1 rank, then with 4.

Prints every step's global batch digest of the 2-node run next to the resumed runs', and the
store requests of each start: listings, HEADs and Parquet footer reads (planning), range reads
(chunks). Exits 1 if a resumed batch differs, if the 2-node start planned more than once, or if a
restart did more planning than listing the files. About 3 minutes on 2 cores.

    python scripts/multinode_rehearsal.py [--keep DIR]
"""

from __future__ import annotations

import argparse
import glob
import logging
import os
import re
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(os.path.dirname(HERE), "tests")]  # train_jobs; support.fakes3

from train_jobs import ROOT, by_step, digest_lines, recipe_copy, run_train, run_train_nodes  # noqa: E402

BUCKET = "corpus"
PREFIX = "debug_corpus/"
STEPS, CHECKPOINT = 6, 3
RESUMES = (1, 4)
Request = tuple[str, str, "str | None", int]  # kind, object path, range, response body bytes


@dataclass
class Start:
    """One start of the job: its digests by step, its DP sizes, the store requests it made in the
    order served, whether it made a job plan (else it reused the saved one), how long it took."""

    digests: dict[int, str]
    dp: set[int]
    requests: list[Request]
    planned: bool
    seconds: float

    def first(self, n: int) -> Counter:
        """Its first ``n`` requests (kind, object, range), in any order."""
        return Counter(r[:3] for r in self.requests[:n])


@dataclass
class Rehearsal:
    plan: Start  # pipeline.plan() alone, no training
    nodes: Start  # 2 nodes x 2 ranks, steps 1-6
    resumed: dict[int, Start] = field(default_factory=dict)  # ranks -> the resume from step 3

    def listing(self) -> list[Request]:
        return [r for r in self.plan.requests if r[0] in ("list", "head")]

    def planning(self, start: Start) -> int:
        """How many of ``start``'s first requests are its planning: rank 0 plans (or lists the files
        again, to check the saved plan) while every other rank waits for the plan, so these come
        first; then the ranks read chunks, each process reading the footer of every Parquet file it
        reads from once (the plan has chunk tables, not footers)."""
        return len(self.plan.requests) if start.planned else len(self.listing())

    def phases(self, start: Start) -> Counter:
        """``start``'s requests by kind, footers by phase, and ``plan bytes``."""
        first, phases = self.planning(start), Counter()
        for i, (kind, _, _, n) in enumerate(start.requests):
            phases[f"footer, {'plan' if i < first else 'read'}" if kind == "footer" else kind] += 1
            phases["plan bytes"] += n if i < first else 0
        return phases


def upload_corpus(client) -> dict[str, int]:
    """The debug corpus under s3://corpus/debug_corpus/: {object path: size}."""
    sizes = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "assets", "debug_corpus", "*.parquet"))):
        key = PREFIX + os.path.basename(path)
        client.upload_file(path, BUCKET, key)
        sizes[f"/{BUCKET}/{key}"] = os.path.getsize(path)
    return sizes


def s3_recipe(folder: str, endpoint: str) -> str:
    """The debug recipe, its dataset read from the bucket (credentials: AWS_* in the environment)."""
    local = f'path = "{ROOT}/assets/debug_corpus"'
    remote = (
        f'path = "s3://{BUCKET}/{PREFIX}"\nstorage_options = '
        f'{{ client_kwargs = {{ endpoint_url = "{endpoint}", region_name = "us-east-1" }} }}'
    )
    return recipe_copy(folder, **{local: remote})


def kind(method: str, path: str, rng: str | None, sizes: dict[str, int]) -> str:
    """list (a bucket listing), head, footer (a range read that ends at the object's last byte:
    Parquet metadata), read (any other range read: a chunk's bytes), or other."""
    if method == "HEAD":
        return "head"
    if method != "GET":
        return "other"
    if path.strip("/") == BUCKET:
        return "list"
    end = re.fullmatch(r"bytes=\d*-(\d+)", rng or "")
    if end and path in sizes and int(end.group(1)) == sizes[path] - 1:
        return "footer"
    return "read"


def plan_alone(recipe: str, server, sizes: dict[str, int]) -> Start:
    """What one plan of the recipe costs the store, made in this process without training."""
    from zephon.torchtitan.recipe import build_pipeline, load_recipe

    server.reset()
    start = time.monotonic()
    pipeline = build_pipeline(load_recipe(recipe), dp_rank=0, dp_world_size=1, seq_len=128, microbatch_size=2)
    pipeline.plan()
    return _start(server, sizes, ({}, set()), "saved the job plan", start)


def rehearse(workdir: str, server, endpoint: str, client, echo=print) -> Rehearsal:
    """Upload, plan once, train on 2 nodes, resume on 1 and on 4 ranks; the job's dump folder is
    ``workdir``/run."""
    sizes = upload_corpus(client)
    recipe = s3_recipe(workdir, endpoint)
    dump = os.path.join(workdir, "run")
    args = ["--dataloader.recipe", recipe, "--training.steps", str(STEPS)]
    args += ["--checkpoint.interval", str(CHECKPOINT)]
    plan = plan_alone(recipe, server, sizes)

    def start(command: str, extra: list[str], launch) -> Start:
        echo(f"$ {command} ./run_train.sh --dump_folder {dump} {' '.join(args + extra)}")
        before, began = len(digest_lines(dump)), time.monotonic()
        server.reset()
        ok, output = launch()
        if not ok:
            raise RuntimeError(f"{command} ./run_train.sh failed:\n{output[-6000:]}")
        started = _start(server, sizes, _digests(dump, before), output, began)
        echo(f"  done in {started.seconds:.0f}s")
        return started

    def nodes():
        rcs, outputs = run_train_nodes(2, 2, dump, *args, timeout=600)
        return rcs == [0, 0], "\n".join(outputs)

    def resume(ngpu: int):
        rc, output = run_train(ngpu, dump, *args, *load, timeout=600)
        return rc == 0, output

    load = ["--checkpoint.load_step", str(CHECKPOINT)]
    rehearsal = Rehearsal(
        plan, start("NNODES=2 NODE_RANK=0|1 RDZV_ENDPOINT=127.0.0.1:PORT NGPU=2", [], nodes)
    )
    for ngpu in RESUMES:
        rehearsal.resumed[ngpu] = start(f"NGPU={ngpu}", load, lambda n=ngpu: resume(n))
    return rehearsal


def _digests(dump: str, before: int) -> tuple[dict[int, str], set[int]]:
    lines = digest_lines(dump)[before:]
    return by_step(lines), {line["dp"] for line in lines}


def _start(server, sizes: dict[str, int], digests: tuple, output: str, start: float) -> Start:
    requests = [(kind(m, p, r, sizes), p, r, n) for m, p, r, _, n in list(server.log)]
    if "saved the job plan" not in output and "still holds" not in output:
        raise RuntimeError(f"rank 0 logged neither a new job plan nor a saved one:\n{output[-4000:]}")
    planned = "saved the job plan" in output  # rank 0's log; else "the job plan ... still holds"
    return Start(*digests, requests, planned, time.monotonic() - start)


def problems(rehearsal: Rehearsal) -> list[str]:
    """What the rehearsal shows wrong: empty when it passed."""
    found, nodes, plan, listing = [], rehearsal.nodes, rehearsal.plan, rehearsal.listing()
    if sorted(nodes.digests) != list(range(1, STEPS + 1)) or nodes.dp != {4}:
        found.append(f"the 2-node run wrote steps {sorted(nodes.digests)} on DP sizes {nodes.dp}")
    if not nodes.planned or nodes.first(len(plan.requests)) != plan.first(len(plan.requests)):
        found.append(f"the 2-node start did not begin with one plan: {nodes.requests[:10]}")
    for ngpu, resumed in rehearsal.resumed.items():
        expected = {s: nodes.digests.get(s) for s in range(CHECKPOINT + 1, STEPS + 1)}
        if resumed.digests != expected or resumed.dp != {ngpu}:
            found.append(f"the resume on {ngpu} rank(s) saw other global batches")
        if resumed.planned or resumed.first(len(listing)) != plan.first(len(listing)):
            found.append(f"the resume on {ngpu} rank(s) planned again: {resumed.requests[:10]}")
    for name, start in [
        ("2-node start", nodes),
        *((f"resume on {n}", s) for n, s in rehearsal.resumed.items()),
    ]:
        kinds = Counter(r[0] for r in start.requests)
        if kinds["list"] + kinds["head"] != len(listing):
            found.append(f"the {name} listed the files more than once: {dict(kinds)}")
    return found


COLUMNS = ("list", "head", "footer, plan", "plan bytes", "footer, read", "read")


def report(rehearsal: Rehearsal) -> str:
    nodes, resumed = rehearsal.nodes, rehearsal.resumed
    head = f"step  {'2 nodes x 2 ranks':<24}" + "".join(f"  {f'resumed, {n} rank(s)':<24}" for n in resumed)
    lines = [head]
    for step in range(1, STEPS + 1):
        a = nodes.digests.get(step, "-")
        row = [resumed[n].digests.get(step, "" if step <= CHECKPOINT else "-") for n in resumed]
        same = "" if step <= CHECKPOINT else ("  same" if all(b == a for b in row) else "  DIFFERENT")
        lines.append(f"{step:>4}  {a[:24]:<24}" + "".join(f"  {b[:24]:<24}" for b in row) + same)
    lines += ["", f"{'store requests':<21}" + "".join(f"  {c}" for c in COLUMNS) + "  seconds"]
    starts = {"one plan, alone": rehearsal.plan, "2 nodes x 2 ranks": nodes}
    starts.update({f"restart, {n} rank(s)": s for n, s in resumed.items()})
    for name, start in starts.items():
        phases = rehearsal.phases(start)
        lines.append(
            f"{name:<21}" + "".join(f"  {phases[c]:>{len(c)}}" for c in COLUMNS) + f"  {start.seconds:>7.1f}"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keep", help="a folder for the job's outputs (default: a temporary one, removed)")
    args = parser.parse_args()
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(name, "testing")  # moto takes any; the ranks read them from here
    import boto3
    from support.fakes3 import CountingMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # moto's server logs every request
    server = CountingMotoServer(port=0)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    try:
        with tempfile.TemporaryDirectory(prefix="zephon-nodes-") as tmp:
            workdir = args.keep or tmp
            os.makedirs(workdir, exist_ok=True)
            rehearsal = rehearse(workdir, server, endpoint, client, echo=lambda s: print(s, flush=True))
    finally:
        server.stop()
    print("\n" + report(rehearsal) + "\n")
    found = problems(rehearsal)
    print(
        "\n".join(found) or "every resumed step trained on the 2-node run's global batch; one plan per start"
    )
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
