"""images(resizer="torch"): PyTorch's antialiased bicubic gives Pillow's pixels within
decoders.TOLERANCE on real photographs, the same pixels whatever torch's thread count or the CPU's
vector instructions, and is part of the recipe; a bad or unavailable resizer is named."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest
from support.photos import photo_pipelines

from zephon.ops import decoders
from zephon.ops.images import Images
from zephon.testing.images import photos

torch = pytest.importorskip("torch")  # a test dependency: never skipped in CI


@pytest.fixture(scope="module")
def samples():
    return photos()


@pytest.mark.parametrize(("size", "resize"), [(224, "crop"), (224, "fit"), (64, "crop"), (16, "fit")])
def test_the_torch_resizer_gives_pillows_pixels_within_tolerance_on_the_photographs(samples, size, resize):
    """Down by up to 46x at 16 pixels; the photographs of 102 and 200 pixels are scaled up at 224."""
    patch = 8 if size == 16 else 16
    reference = Images(size=size, patch=patch, resize=resize)
    op = Images(size=size, patch=patch, resize=resize, resizer="torch")
    differing = 0
    for key, _, data, _ in samples:
        got, want = op.patches(data), reference.patches(data)
        assert got.grid.tolist() == want.grid.tolist(), key
        difference = np.abs(got.pixels.astype(np.int16) - want.pixels.astype(np.int16))
        assert difference.max() <= decoders.TOLERANCE["max"], (key, int(difference.max()))
        assert difference.mean() <= decoders.TOLERANCE["mean"], (key, float(difference.mean()))
        differing += int(difference.any())
    assert differing, "not Pillow under another name: some pixels differ (a rounding apart)"


DIGEST = """
import hashlib, sys
import torch
from zephon.ops.images import Images
from zephon.testing.images import photos
torch.set_num_threads(int(sys.argv[1]))
op, digest = Images(resizer="torch"), hashlib.sha256()
for _, _, data, _ in photos():
    digest.update(op.patches(data).pixels.tobytes())
print(torch.backends.cpu.get_cpu_capability(), digest.hexdigest())
"""


def _digest(threads: int, capability: str | None = None) -> tuple[str, str]:
    env = dict(os.environ)
    if capability:
        env["ATEN_CPU_CAPABILITY"] = capability
    out = subprocess.run(
        [sys.executable, "-c", DIGEST, str(threads)], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    found, digest = out.stdout.split()
    return found, digest


def test_the_torch_resizer_gives_the_same_pixels_on_any_thread_count_and_vector_instructions(samples):
    """A job whose ranks run on other CPUs, or with other OMP_NUM_THREADS, sees the same pixels."""
    here = hashlib.sha256()
    op = Images(resizer="torch")
    for _, _, data, _ in samples:
        here.update(op.patches(data).pixels.tobytes())
    plain = _digest(1, "default")
    assert plain[0] == "DEFAULT", plain  # torch's kernels without AVX2 or AVX-512
    assert _digest(2) == (torch.backends.cpu.get_cpu_capability(), here.hexdigest())
    assert plain[1] == here.hexdigest(), "the generic kernel gives the vectorized one's pixels"


def test_the_resizer_and_torchs_version_are_part_of_the_recipe():
    pillow, other = Images().params(), Images(resizer="torch").params()
    assert "resizer" not in pillow, "a checkpoint from before resizers could be chosen restores"
    assert other["resizer"] == f"torch {torch.__version__.split('+')[0]}"
    assert {k: v for k, v in other.items() if k != "resizer"} == pillow


def test_a_checkpoint_made_with_another_resizer_is_refused_by_name(tmp_path, gpt2):
    from zephon.testing import drain

    pipeline = photo_pipelines(str(tmp_path), gpt2)
    p = pipeline(resizer="torch")
    drain(p, 1)
    with pytest.raises(ValueError, match=r"operators\[0\]\.resizer: 'torch [^']+' -> '<absent>'"):
        pipeline(resizer="pillow").load_state_dict(p.state_dict())


def test_an_unknown_resizer_is_named_with_the_choices():
    with pytest.raises(ValueError, match=r"images\(resizer='cv2'\): expected one of \('pillow', 'torch'\)"):
        Images(resizer="cv2")


def test_the_torch_resizer_without_torch_names_what_to_pip_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch fails as if not installed
    with pytest.raises(ValueError, match=r"images\(resizer='torch'\) needs PyTorch: pip install torch"):
        Images(resizer="torch")
