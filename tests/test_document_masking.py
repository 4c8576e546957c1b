"""Document masking, end to end on CPU: zephon's positions -> TorchTitan's masks -> its attention.

TorchTitan's llama3 debug model (flex and varlen attention, through zephon's CPU kernels) on
rows of the debug recipe: a packed row must train exactly as its documents would alone.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from train_jobs import ROOT

from zephon.torchtitan import attention
from zephon.torchtitan.recipe import build_pipeline, load_recipe

SEQ_LEN = 128
RECIPE = f"{ROOT}/zephon_recipes/debug.toml"
# varlen attention runs in bfloat16 (TorchTitan casts q, k, v), flex in float32
TOLERANCE = {"flex": 1e-5, "varlen": 2e-3}


def debug_model(backend: str):
    """TorchTitan's llama3 debug model, float32 on CPU, seeded, on zephon's CPU attention."""
    attention.install()
    return attention.debug_model(backend, SEQ_LEN)


def first_batch(document_mask: bool = True) -> dict[str, torch.Tensor]:
    recipe = load_recipe(RECIPE, {"packing": {"document_mask": document_mask}})
    pipeline = build_pipeline(recipe, dp_rank=0, dp_world_size=1, seq_len=SEQ_LEN, microbatch_size=2)
    batch = next(iter(pipeline))
    pipeline.close()
    return {k: torch.from_numpy(v) for k, v in batch.to_training().items()} | {
        "starts": torch.from_numpy(batch.starts[:, :-1])
    }


def token_losses(model, ids, labels, positions) -> torch.Tensor:
    """Per-token losses of rows, attention masked as TorchTitan's trainer masks it."""
    logits = model(ids, positions=positions, attention_masks=model.get_attention_masks(positions))
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view(labels.shape)


def segments(positions: torch.Tensor) -> list[tuple[int, int]]:
    """The documents of a row as TorchTitan finds them: a run from each position 0."""
    starts = [*(positions == 0).nonzero().flatten().tolist(), len(positions)]
    return list(itertools.pairwise(starts))


def grads(model) -> list[torch.Tensor]:
    out = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    return out


@pytest.fixture(scope="module")
def batch():
    return first_batch()


@pytest.mark.parametrize("backend", ["flex", "varlen"])
def test_a_packed_rows_token_losses_and_gradients_equal_its_documents_run_alone(batch, backend):
    model = debug_model(backend)
    ids, labels, positions = batch["input_ids"], batch["labels"], batch["positions"]
    packed = token_losses(model, ids, labels, positions)
    packed.sum().backward()
    packed_grads = grads(model)
    tol = TOLERANCE[backend]
    for row in range(len(ids)):
        docs = segments(positions[row])
        assert len(docs) >= 3, "the row packs several documents"
        for a, b in docs:
            alone = token_losses(model, ids[row : row + 1, a:b], labels[row : row + 1, a:b],
                                 torch.arange(b - a)[None])  # fmt: skip
            alone.sum().backward()
            assert torch.allclose(alone[0], packed[row, a:b], atol=tol, rtol=0), (row, a, b)
    alone_grads = grads(model)
    for g, h in zip(packed_grads, alone_grads, strict=True):
        assert torch.allclose(g, h, atol=tol * 10, rtol=tol * 10)


def test_without_document_masking_a_rows_documents_see_each_other():
    model = debug_model("flex")
    masked, unmasked = first_batch(True), first_batch(False)
    assert torch.equal(masked["input_ids"], unmasked["input_ids"]), "the switch changes positions only"
    assert torch.equal(unmasked["positions"], torch.arange(SEQ_LEN).expand(2, SEQ_LEN))
    ids, labels = masked["input_ids"], masked["labels"]
    with torch.no_grad():
        a = token_losses(model, ids, labels, masked["positions"])
        b = token_losses(model, ids, labels, unmasked["positions"])
    first, second = segments(masked["positions"][0])[:2]
    assert torch.allclose(a[0, slice(*first)], b[0, slice(*first)], atol=1e-5), "nothing before it"
    assert (a[0, slice(*second)] - b[0, slice(*second)]).abs().max() > 1e-2


def test_a_cut_documents_rest_begins_its_row_at_position_0_as_a_document_of_its_own(batch):
    starts, positions = batch["starts"], batch["positions"]
    cut = [r for r in range(len(starts)) if not starts[r, 0]]
    assert cut, "a row that begins inside a document"
    assert all(positions[r, 0] == 0 for r in range(len(positions)))
    # TorchTitan's varlen metadata then starts a segment at every row start
    from torchtitan.models.common.attention import create_varlen_metadata_for_document

    bounds = create_varlen_metadata_for_document(positions).cu_seq_q.tolist()
    assert all(r * SEQ_LEN in bounds for r in range(len(positions)))


def test_the_cpu_flex_kernel_equals_flex_attention_on_torchtitans_mask():
    attention.install()
    from torch.nn.attention.flex_attention import flex_attention
    from torchtitan.models.common.attention import FlexAttention

    model = debug_model("flex")
    positions = first_batch()["positions"]
    mask = model.get_attention_masks(positions)
    q, k, v = torch.randn(3, 2, 16, SEQ_LEN, 16).unbind(0)
    want = flex_attention(q, k, v, block_mask=mask)  # CPU FlexAttention runs without grad
    got, _ = FlexAttention.compiled_flex_attn(
        q, k, v, score_mod=None, block_mask=mask, scale=None, enable_gqa=False, return_aux=None,
        kernel_options={},
    )  # fmt: skip
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(got, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))


@pytest.mark.parametrize("group", [5, attention.GROUP_TOKENS])
def test_the_cpu_varlen_kernel_attends_within_each_segment_and_window(group, monkeypatch):
    monkeypatch.setattr(attention, "GROUP_TOKENS", group)
    bounds = [0, 3, 7, 8, 20]
    q, k, v = torch.randn(3, 20, 2, 4).unbind(0)
    cu = torch.tensor(bounds, dtype=torch.int32)
    for window in [(-1, 0), (2, 0), (-1, -1)]:
        got = attention.dense_varlen_attention(q, k, v, cu, cu, 12, 12, window_size=window)
        want = []
        for a, b in itertools.pairwise(bounds):
            i = np.arange(b - a)
            allowed = np.ones((b - a, b - a), bool)
            if window[1] >= 0:
                allowed &= i[None, :] <= i[:, None] + window[1]
            if window[0] >= 0:
                allowed &= i[None, :] >= i[:, None] - window[0]
            qs, ks, vs = (x[a:b].transpose(0, 1) for x in (q, k, v))
            out = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=torch.from_numpy(allowed))
            want.append(out.transpose(0, 1))
        assert torch.allclose(got, torch.cat(want), atol=1e-6), window


def test_the_gpu_attention_check_passes_on_cpu_and_fails_on_a_mask_crossing_documents(tmp_path, monkeypatch):
    import gpu_attention  # scripts/: the check run on a lent GPU machine (its CPU parts here)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the CPU parts, wherever it runs
    out = tmp_path / "report.txt"
    small = ["--seq-len", "128", "--rows", "2", "--heads", "2", "--dim", "8"]
    assert gpu_attention.main([*small, "--out", str(out)]) == 0
    report = out.read_text()
    assert "TorchTitan's mask, dense on cpu: the same as every document alone" in report
    assert "TorchTitan's cu_seqlens: the same as every document's bounds" in report
    # on CPU: flex 4 + 4 (two masks), varlen 4, the debug model 2 (a GPU adds 16)
    assert report.count(" ok\n") == 14 and report.endswith("GPU attention check passed\n")

    def causal_only(positions):  # what CPU runs did before document masking
        return lambda b, h, q, kv: q >= kv

    monkeypatch.setattr(gpu_attention, "document_causal", causal_only)
    failed = gpu_attention.check_attention(seq_len=128, rows=2, heads=2, dim=8).failed
    assert "this script's flex mask" in failed and "this script's mask, CPU (zephon's kernel) out" in failed
    assert "TorchTitan's flex mask" not in failed, "TorchTitan's mask is checked on its own"


def test_the_gpu_attention_check_fails_a_varlen_kernel_that_attends_across_documents(monkeypatch):
    import gpu_attention

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    dense = attention.dense_varlen_attention

    def whole_rows(q, k, v, cu_q, cu_k, max_q, max_k):  # each row one segment: documents see each other
        rows = torch.arange(0, len(q) + 1, 128, dtype=torch.int32)
        return dense(q, k, v, rows, rows, 128, 128)

    monkeypatch.setattr(gpu_attention.attention, "dense_varlen_attention", whole_rows)
    failed = gpu_attention.check_attention(seq_len=128, rows=2, heads=2, dim=8).failed
    assert "CPU (zephon's dense kernel) out" in failed and "CPU (zephon's dense kernel) dq" in failed


def test_the_gpu_attention_check_fails_where_torchtitans_masks_should_be_there_and_are_not(monkeypatch):
    import gpu_attention

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(gpu_attention, "torchtitan_masks", lambda: (None, "ImportError: (simulated)"))
    report = gpu_attention.check_attention(seq_len=128, rows=2, heads=2, dim=8)
    assert torch.__version__.startswith("2.13"), "the torch TorchTitan 0.3.0 is made for"
    assert report.failed == ["TorchTitan's flex mask not run", "TorchTitan's cu_seqlens not run"]
    assert "  not run: TorchTitan's flex mask: ImportError: (simulated)" in report.lines
