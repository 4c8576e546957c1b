"""TorchTitan 0.3.0's own text loader (``HuggingFaceTextDataLoader`` over
``HuggingFaceTextDataset``), built as its trainer builds it and as
``zephon.torchtitan.baseline`` configures it for comparisons: dataset ``"c4_test"`` (whose
loader is ``datasets.load_dataset(path, split="train")``) with a local ``dataset_path``,
TorchTitan's ``HuggingFaceTokenizer`` on ``setup.tokenizer``, ``seq_len``,
``local_batch_size = setup.microbatch``, dp rank 0 of 1, ``infinite=True``.

What it cannot do, and what stands in:

- One dataset, no mixture: ``dataset_path`` is a folder (in the temporary directory, kept and
  named by the files, so that ``datasets`` reuses the Arrow cache it writes the first time)
  holding links to all of ``setup.files``. ``load_dataset`` reads them as one map-style
  dataset, file after file in name order; ``setup.weights`` are ignored.
- No shuffle buffer: ``setup.shuffle`` is unused. Epoch 0 is read in file order; later epochs
  (``infinite=True``) reshuffle the whole dataset.
- Documents are ``BOS + text + EOS`` (its tokenizer adds both; for GPT-2 both are
  ``<|endoftext|>``), packed with no padding. Inputs and labels are shifted within each
  document, so with BOS = EOS the row ``inputs + last label`` is the plain token stream
  (``row[1:]`` equals the labels). A row advances the stream by ``seq_len`` tokens: its last
  token is the first token of the next row. ``valid`` is all True.
- Workers: its ``num_workers`` is ``StatefulDataLoader``'s (processes). The dataset is an
  ``IterableDataset`` that does not split itself among workers, so every worker reads the
  whole dataset and each row would come ``num_workers`` times. The trainer's default, 0, is
  used (loading runs in the calling thread) and ``setup.workers`` / ``setup.method`` are
  ignored, unless ``setup.options["num_workers"]`` asks for workers anyway.

``setup.options["interleaved"] = True``: TorchTitan's mixing loader instead,
``InterleavedHuggingFaceTextDataLoader``, one source per file (each its own ``c4_test``
folder, ``infinite=True``) with ``setup.weights``, seeded by ``setup.seed``. It draws whole
packed rows from the sources by weight, so the weights are a token ratio; each row holds one
source's documents.

Needs ``zephon.torchtitan.cpu.install()`` on a machine without a GPU (done here, before
TorchTitan is imported).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import tempfile

import numpy as np

from benchmarks.peers.common import Out, Setup


def _torchtitan():
    from zephon.torchtitan import cpu

    if cpu.on_cpu():
        cpu.install()
    from torchtitan.components.tokenizer import HuggingFaceTokenizer
    from torchtitan.hf_datasets import text_datasets

    return HuggingFaceTokenizer, text_datasets


def dataset_folder(files: dict[str, str]) -> str:
    """A folder holding the JSON lines ``files`` (linked, else copied), one name each.

    Its path depends only on the files (name, path, size, time), so that ``load_dataset``
    finds the Arrow cache it wrote the first time (in ``~/.cache/huggingface/datasets``)
    instead of converting the files again, and storing another copy, on every call."""
    key = hashlib.sha256()
    for name, path in sorted(files.items()):
        st = os.stat(path)
        key.update(f"{name}\0{os.path.abspath(path)}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    root = os.path.join(tempfile.gettempdir(), f"torchtitan_loader_{key.hexdigest()[:16]}")
    folder = os.path.join(root, "data")
    if os.path.isdir(folder):
        return folder
    os.makedirs(root, exist_ok=True)
    staging = tempfile.mkdtemp(prefix="staging_", dir=root)
    for name, path in files.items():
        link = os.path.join(staging, name + (".jsonl.gz" if path.endswith(".gz") else ".jsonl"))
        try:
            os.symlink(os.path.abspath(path), link)
        except OSError:
            shutil.copyfile(path, link)
    try:
        os.rename(staging, folder)
    except OSError:  # made by another process meanwhile
        shutil.rmtree(staging, ignore_errors=True)
    return folder


def build(setup: Setup):
    """The loader, as TorchTitan's trainer builds it (``Config.build`` with runtime objects)."""
    HuggingFaceTokenizer, text_datasets = _torchtitan()
    tokenizer = HuggingFaceTokenizer(tokenizer_path=setup.tokenizer)
    workers = int(setup.options.get("num_workers", 0))
    if setup.options.get("interleaved"):
        config = text_datasets.InterleavedHuggingFaceTextDataLoader.Config(
            sources=[
                text_datasets.HFDataSource(
                    dataset="c4_test",
                    dataset_path=dataset_folder({name: path}),
                    weight=float(setup.weights[name]),
                    infinite=True,
                )
                for name, path in setup.files.items()
            ],
            seed=setup.seed,
            num_workers=workers,
        )
    else:
        config = text_datasets.HuggingFaceTextDataLoader.Config(
            dataset="c4_test",
            dataset_path=dataset_folder(setup.files),
            infinite=True,
            num_workers=workers,
        )
    return config.build(
        dp_world_size=1,
        dp_rank=0,
        tokenizer=tokenizer,
        seq_len=setup.seq_len,
        local_batch_size=setup.microbatch,
    )


def to_out(inputs: dict, labels) -> Out:
    """TorchTitan's ``({"input": [B, seq_len], ...}, labels [B, seq_len])`` as one
    ``[B, seq_len + 1]`` row each: the inputs and the last label."""
    x = inputs["input"].numpy()
    tokens = np.concatenate([x, labels.numpy()[:, -1:]], axis=1)
    return Out(tokens, np.ones(tokens.shape, dtype=bool))


def batches(setup: Setup):
    for inputs, labels in build(setup):
        yield to_out(inputs, labels)


def state_bytes(what, batches_taken: int = 40) -> int:
    """Bytes of the loader's checkpoint, pickled: its ``state_dict()`` holds the pickled state
    of ``StatefulDataLoader`` (the dataset's sample index and epoch and its carried token
    buffers, lists of ints). ``what``: the loader (measured as it stands) or a :class:`Setup`
    (a loader is built, ``batches_taken`` batches taken, then measured)."""
    if not isinstance(what, Setup):
        return len(pickle.dumps(what.state_dict()))
    loader = build(what)
    it = iter(loader)
    for _ in range(batches_taken):
        next(it)
    return len(pickle.dumps(loader.state_dict()))
