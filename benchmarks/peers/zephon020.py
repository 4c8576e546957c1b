"""zephon 0.2.0 from PyPI (DatologyAI's loader, a different codebase that shares our import name).

Because both packages are imported as ``zephon``, 0.2.0 lives in its own folder,
``benchmarks/.peers/zephon-0.2.0`` (``ensure_installed()`` puts it there with
``pip install --no-deps --target``), and this module must run in a process of its own: the first
call of ``batches`` puts that folder first on ``sys.path`` and imports ``zephon`` from it, and
refuses to run if the project's ``zephon`` was already imported in the process (spawned workers
inherit that ``sys.path``). Only numpy and
``benchmarks.peers.common`` are imported at module level. 0.2.0's own dependencies
(backports.zstd, cloudpickle, filelock, msgpack, numpy, optree, tenacity, wrapt; transformers for
its tokenizer loading) must be installed in the environment.

The pipeline is built the way its README shows, from its public API:

- one ``Dataset.from_path(name, folder)`` per JSON lines file. ``from_path`` takes a folder, not
  a file, so each file is linked into a folder of its own under the temporary directory
  (``zephon020-datasets/<name>-<hash of the path>/``), reused by later runs;
- ``StaticMixtureWorkSource(datasets, MixtureSpec(setup.weights), seed=setup.seed,
  exhausted_policy="repeat", token_estimation=TokenEstimation())``. The mixture is **by tokens**:
  passing ``TokenEstimation`` selects 0.2.0's token-aware allocation, which measures each
  dataset's tokens per byte with the pipeline's tokenizer before the first batch (its
  "priming" step, cached on disk per data, tokenizer and seed; it runs when the pipeline is
  started, so its time is part of the first batch). Every dataset repeats forever
  (``exhausted_policy="repeat"``, no repeat cap); the caller stops when it has enough tokens.
  ``chunk_size`` is 0.2.0's default (16384 records per chunk), halved until 0.2.0 accepts it if it
  refuses a repeating dataset with fewer records than its share of one chunk;
  ``setup.options["chunk_size"]`` sets it;
- ``Pipeline(source).decode_text().tokenize(tokenizer_id=setup.tokenizer, field="text",
  special_tokens="eos")``: the Hugging Face tokenizer loaded from the local folder
  (``tokenizer.json`` + ``tokenizer_config.json``) through transformers' ``AutoTokenizer``, one
  EOS appended after each document (its default ``"bos_eos"`` would also put a BOS before each
  document);
- ``.pack_flat(setup.seq_len + 1, algorithm="wrap", emit_positions=False)``: 0.2.0 packs to
  exactly ``max_length`` tokens and its ``to_training(return_labels=True)`` shifts inside the
  row, so rows of ``seq_len + 1`` give ``seq_len`` inputs and labels, the same convention as ours.
  ``wrap`` (the classic concatenated blocks: documents are split at row ends, no padding) is the
  default here; ``setup.options["algorithm"]`` picks ``"best_fit_wrap"``, ``"first_fit"`` or
  ``"best_fit"`` (the last two need ``setup.options["num_bins"]``, default 64, and drop documents
  longer than a row), which pad with the EOS id. With ``best_fit_wrap`` a few rows hold a piece of
  one document right after a piece of another, with no EOS between them;
- ``.shuffle(setup.shuffle, seed=setup.seed)`` after packing (a buffer of packed rows),
  ``.batch(setup.microbatch)``;
- ``.options(runner=..., canonical_replicas=setup.lanes, worker_allocation="per_stage_fixed",
  max_workers=setup.workers)``: ``setup.method`` "thread" | "process" | "inline" maps to its
  runners "threads" | "process" | "inline". Its planner fuses everything before ``batch`` into one
  stage and runs ``batch`` inline after it. With ``per_stage_fixed`` the thread runner's pool has
  ``setup.workers`` threads, shared by all the operators of that stage; the process runner starts
  one process per operator instance, so ``tokenize`` (the costly operator) gets
  ``parallelism=setup.workers`` instances, and fetch and decode_text one each (packing and
  shuffling are serial in 0.2.0). More fetch or decode instances were slower in a short test
  here (0.2.0 reads a JSON lines shard by scanning it from its start on every fetch).
  ``setup.options["parallelism"]`` (a dict by operator: fetch, decode, tokenize) overrides these;
  ``setup.options["mtp_mode"]`` runs its engine in a child process (its GIL isolation).

Each batch goes through ``SampleBatch.to_training(dtype=np.int64, return_padding_mask=True)``:
``Out.tokens`` is int64 ``[B, seq_len + 1]``, ``Out.valid`` is the negated padding mask.

``state_bytes`` gives the size of ``pipeline.checkpoint()`` pickled; it takes a ``Setup`` (and
checkpoints after 40 batches), a 0.2.0 ``Pipeline``, or a generator returned by ``batches``.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

from benchmarks.peers.common import Out, Setup

VERSION = "0.2.0"
BENCHMARKS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDER = os.path.join(BENCHMARKS, ".peers", f"zephon-{VERSION}")
RUNNERS = {"thread": "threads", "process": "process", "inline": "inline"}
DEFAULT_CHUNK_SIZE = 16384  # StaticMixtureWorkSource's default
# what 0.2.0 reads as JSON lines shards
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst", ".jsonl.bz2", ".jsonl.xz")


def ensure_installed() -> str:
    """Installs zephon 0.2.0 (without its dependencies) into its own folder if it is not there;
    returns the folder."""
    marker = os.path.join(FOLDER, f"zephon-{VERSION}.dist-info", "METADATA")
    if not (os.path.isfile(marker) and os.path.isfile(os.path.join(FOLDER, "zephon", "__init__.py"))):
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--target", FOLDER, f"zephon=={VERSION}"]
        subprocess.run(cmd, check=True)
    return FOLDER


def _zephon020() -> Any:
    """Imports zephon 0.2.0 from its folder (first on sys.path), never the project's."""
    folder = ensure_installed()
    loaded = sys.modules.get("zephon")
    if loaded is not None:
        where = os.path.abspath(getattr(loaded, "__file__", "") or "")
        if not where.startswith(folder + os.sep):
            raise RuntimeError(
                f"zephon is already imported from {where}: zephon {VERSION} must run in a process "
                "that has not imported the project's zephon"
            )
    if not sys.path or sys.path[0] != folder:
        if folder in sys.path:
            sys.path.remove(folder)
        sys.path.insert(0, folder)  # also inherited by its spawned workers
    import zephon

    if zephon.__version__ != VERSION:
        raise RuntimeError(
            f"expected zephon {VERSION} in {folder}, got {zephon.__version__} ({zephon.__file__})"
        )
    return zephon


def _dataset_folder(name: str, path: str) -> str:
    """A folder holding only a link to ``path`` (``Dataset.from_path`` reads folders of shards)."""
    real = os.path.realpath(path)
    digest = hashlib.sha256(real.encode()).hexdigest()[:16]
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    folder = os.path.join(tempfile.gettempdir(), "zephon020-datasets", f"{safe}-{digest}")
    base = os.path.basename(real)
    link = os.path.join(folder, base if base.endswith(JSONL_SUFFIXES) else base + ".jsonl")
    os.makedirs(folder, exist_ok=True)
    if not (os.path.islink(link) and os.readlink(link) == real):
        tmp = f"{link}.{os.getpid()}.tmp"
        os.symlink(real, tmp)
        os.replace(tmp, link)
    return folder


def _eos_id(tokenizer_dir: str) -> int:
    from transformers import AutoTokenizer

    eos = AutoTokenizer.from_pretrained(tokenizer_dir).eos_token_id
    if eos is None:
        raise ValueError(f"the tokenizer in {tokenizer_dir} has no EOS token")
    return int(eos)


def build(setup: Setup, chunk_size: int = DEFAULT_CHUNK_SIZE) -> Any:
    """The 0.2.0 ``Pipeline`` for ``setup`` (not started)."""
    # transformers warns, in every worker, about documents longer than GPT-2's context
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    zephon = _zephon020()
    from zephon.work import TokenEstimation

    if setup.method not in RUNNERS:
        raise ValueError(f"method must be one of {sorted(RUNNERS)}, got {setup.method!r}")
    opts = dict(setup.options)
    workers = max(1, int(setup.workers))
    par = {"fetch": 1, "decode": 1, "tokenize": workers, **opts.get("parallelism", {})}
    algorithm = opts.get("algorithm", "wrap")

    datasets = [
        zephon.Dataset.from_path(name, _dataset_folder(name, file)) for name, file in setup.files.items()
    ]
    source = zephon.StaticMixtureWorkSource(
        datasets=datasets,
        mixture=zephon.MixtureSpec(dict(setup.weights)),
        chunk_size=chunk_size,
        seed=setup.seed,
        exhausted_policy="repeat",
        token_estimation=TokenEstimation(),
    )
    pack: dict[str, Any] = {"algorithm": algorithm, "emit_positions": False}
    if algorithm != "wrap":
        pack["pad_token_id"] = _eos_id(setup.tokenizer)
    if algorithm in ("first_fit", "best_fit"):
        pack["num_bins"] = int(opts.get("num_bins", 64))
    pipeline = (
        zephon.Pipeline(source)
        .fetch(parallelism=par["fetch"])
        .decode_text(parallelism=par["decode"])
        .tokenize(
            tokenizer_id=setup.tokenizer, field="text", special_tokens="eos", parallelism=par["tokenize"]
        )
        .pack_flat(setup.seq_len + 1, **pack)
        .shuffle(setup.shuffle, seed=setup.seed)
        .batch(setup.microbatch)
    )
    pipeline.options(
        runner=RUNNERS[setup.method],
        canonical_replicas=setup.lanes,
        worker_allocation="per_stage_fixed",
        max_workers=workers,
        mtp_mode=bool(opts.get("mtp_mode", False)),
    )
    return pipeline


def _start(setup: Setup) -> tuple[Any, Iterator[Any]]:
    """Builds the pipeline and starts it (``iter`` validates it and measures the token ratios),
    with 0.2.0's default chunk size, or ``setup.options["chunk_size"]``. When 0.2.0 refuses that
    chunk size because a repeating dataset has fewer records than its share of one chunk, halves
    it until it is accepted (the measured ratios are cached, so a retry is quick)."""
    chunk = int(setup.options.get("chunk_size", DEFAULT_CHUNK_SIZE))
    while True:
        pipeline = build(setup, chunk)
        try:
            return pipeline, iter(pipeline)
        except ValueError as e:
            if "chunk_size" in setup.options or chunk == 1 or "decrease chunk_size" not in str(e):
                raise
            chunk //= 2


def batches(setup: Setup) -> Iterator[Out]:
    """Microbatches of 0.2.0's pipeline for ``setup``, forever (the datasets repeat)."""
    pipeline, it = _start(setup)  # noqa: RUF059 (state_bytes reads `pipeline` from this frame)
    try:
        for batch in it:
            out = batch.to_training(dtype=np.int64, return_padding_mask=True, exclude_fields=("ids", "texts"))
            tokens = np.asarray(out["input_ids"])
            valid = ~np.asarray(out["padding_mask"], dtype=bool)
            yield Out(tokens=tokens, valid=valid)
    finally:
        it.close()  # stops its engine: threads, worker processes


def state_bytes(target: Any, n_batches: int = 40) -> int:
    """Size in bytes of 0.2.0's ``pipeline.checkpoint()``, pickled. ``target`` is a ``Setup`` (its
    pipeline is run for ``n_batches`` batches, checkpointed, then closed), a 0.2.0 ``Pipeline``, or
    a generator from :func:`batches` that has yielded at least one batch."""
    if isinstance(target, Setup):
        gen = batches(target)
        try:
            for _ in range(n_batches):
                next(gen)
            return state_bytes(gen)
        finally:
            gen.close()
    pipeline = target
    frame = getattr(target, "gi_frame", None)
    if frame is not None:
        if "pipeline" not in frame.f_locals:
            raise ValueError("state_bytes needs a batches() generator that has yielded a batch")
        pipeline = frame.f_locals["pipeline"]
    elif not hasattr(target, "checkpoint"):
        raise TypeError("state_bytes takes a Setup, a zephon 0.2.0 Pipeline or a batches() generator")
    with warnings.catch_warnings():
        # it warns when a checkpoint falls between window boundaries (lanes at unequal counts)
        warnings.filterwarnings("ignore", message=r".*Checkpoint taken mid-window", category=RuntimeWarning)
        state = pipeline.checkpoint()
    return len(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))
