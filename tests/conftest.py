"""Shared fixtures: the real GPT-2 tokenizer, small synthetic corpora, a fake Hugging Face hub
and a real S3 API (moto) on 127.0.0.1.

huggingface_hub reads HF_ENDPOINT when it is imported, so the fake hub is started and the
environment set here, at import time: pytest imports this file before any test module.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile

import pytest

# the tests' own helpers (tests/support: fake stores, failing functions) and the job helpers the
# scripts share (scripts/train_jobs.py): neither is part of the installed package
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [_HERE, os.path.join(os.path.dirname(_HERE), "scripts")]

from support.fakehub import FakeHub  # noqa: E402

if "huggingface_hub" in sys.modules or "datasets" in sys.modules:
    raise RuntimeError("huggingface_hub was imported before the fake hub's HF_ENDPOINT was set")

_TMP = tempfile.mkdtemp(prefix="zephon-tests-")
os.makedirs(os.path.join(_TMP, "hub"))
HUB = FakeHub(os.path.join(_TMP, "hub")).start()
os.environ.update(
    HF_ENDPOINT=HUB.endpoint,
    HF_HOME=os.path.join(_TMP, "hf_home"),
    HF_HUB_OFFLINE="0",
    HF_DATASETS_OFFLINE="0",
    HF_HUB_DISABLE_TELEMETRY="1",
    HF_HUB_DISABLE_IMPLICIT_TOKEN="1",
    HF_HUB_DISABLE_PROGRESS_BARS="1",
    HF_HUB_ETAG_TIMEOUT="5",
    HF_HUB_DOWNLOAD_TIMEOUT="5",
    AWS_ACCESS_KEY_ID="testing",
    AWS_SECRET_ACCESS_KEY="testing",
    AWS_DEFAULT_REGION="us-east-1",
)
for _name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
    os.environ.pop(_name, None)
atexit.register(lambda: (HUB.stop(), shutil.rmtree(_TMP, ignore_errors=True)))

from support.corpora import rank_pipeline, write_corpus  # noqa: E402

from zephon.testing import gpt2_tokenizer_dir, synthetic_documents  # noqa: E402


@pytest.fixture(scope="session")
def gpt2(tmp_path_factory) -> str:
    return gpt2_tokenizer_dir(str(tmp_path_factory.mktemp("gpt2")))


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> str:
    """A folder of 3 JSON lines shards, 1500 synthetic documents in all."""
    return write_corpus(str(tmp_path_factory.mktemp("corpus")))


@pytest.fixture(scope="session")
def corpus_docs() -> list[dict]:
    return synthetic_documents(1500, seed=7)


@pytest.fixture(scope="session")
def make_rank(corpus, gpt2):
    """make(D, r, runner="thread", parallelism=2, seed=5, **options) -> rank r of D's pipeline over
    the corpus (support.corpora.rank_pipeline): 8 lanes, windows of 8 rows = 4 batches."""

    def make(world: int, rank: int, **kwargs):
        return rank_pipeline(corpus, gpt2, world, rank, **kwargs)

    return make


@pytest.fixture(scope="session")
def hub() -> FakeHub:
    """The fake hub, with the example repos of support.hubdata (real text)."""
    from support.hubdata import populate_hub

    if not os.path.exists(os.path.join(HUB.root, "datasets")):
        populate_hub(str(HUB.root))
    return HUB


@pytest.fixture(scope="session")
def s3(tmp_path_factory):
    """moto's S3 server on 127.0.0.1 with bucket ``corpus``: (server, storage_options)."""
    from support.fakes3 import moto_s3

    server, storage = moto_s3()
    yield server, storage
    server.stop()


# The files of real torchrun jobs, the longest first. The README's command runs the tests on two
# xdist workers, a file to a worker (`--dist loadfile`) in the order collected
# (`--no-loadscope-reorder`): these start at once, one on each worker, and the short files fill in
# around them. A torchrun job leaves part of a core idle (importing, gloo, checkpoints), so two
# workers fit on 2 cores: the suite took 521 s so, 951 s on one (732 s with xdist's own order,
# which sends the files with the most tests first and these last).
LONGEST_FIRST = ("test_torchtitan.py", "test_multinode.py", "test_torchtitan_cli.py")


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        name = os.path.basename(str(item.path))
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: each file's tests keep their order
