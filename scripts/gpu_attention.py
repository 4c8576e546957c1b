"""Document masking on a GPU, checked against the documents run alone: zephon's rows of the debug
recipe, attention computed by the GPU's kernels (compiled FlexAttention, FlashAttention varlen)
and by zephon's CPU kernels (``zephon.torchtitan.attention``), each compared with every document
attended alone (causal, float64, on CPU), outputs and gradients.

Runs with torch alone, so it also runs where TorchTitan 0.3.0 cannot be imported (a torch older
than it needs). A last part runs TorchTitan's llama3 debug model on the GPU and on CPU, with
TorchTitan's own masks, where TorchTitan imports: a packed row's token losses must equal its
documents' losses alone, and the CPU's (zephon's kernels) the GPU's.

    python scripts/gpu_attention.py [--seq-len 1024] [--rows 4] [--out FILE]

Exit 0 when every part that ran passed (a part that cannot run here says why), 1 otherwise.
"""

from __future__ import annotations

import argparse
import inspect
import itertools
import sys
import time
import traceback
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from zephon.torchtitan import attention  # noqa: E402
from zephon.torchtitan.recipe import build_pipeline, load_recipe  # noqa: E402

RECIPE = ROOT / "zephon_recipes" / "debug.toml"
# largest error allowed, relative to the reference's largest magnitude: float32 kernels (TF32
# off) and bfloat16 ones (varlen: FlashAttention takes half precision only)
TOLERANCE = {"float32": 1e-4, "bfloat16": 2e-2}
LOSS_TOLERANCE = {"flex": 1e-4, "varlen": 1e-3}  # packed against alone, relative to the loss
GPU_CPU_LOSS = 1e-2  # the CPU's losses against the GPU's, relative (other kernels)


class Report:
    """The check's lines, printed as they come, and the names of the checks that failed."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.failed: list[str] = []
        self.skipped: list[str] = []  # parts that cannot run here

    def say(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)

    def check(self, name: str, got: torch.Tensor, want: torch.Tensor, tolerance: float) -> None:
        e = error(got, want)
        self.verdict(e <= tolerance, name, f"  {name:<48} max error {e:.2e} (at most {tolerance:.0e})")

    def check_each(
        self, label: str, got: list[torch.Tensor], want: list[torch.Tensor], tolerance: float
    ) -> None:
        """``check`` of the output and the gradients of q, k and v, named ``label`` and which."""
        for which, g, w in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
            self.check(f"{label} {which}", g, w, tolerance)

    def same(self, same: bool, name: str, subject: str, reference: str) -> None:
        """Whether ``subject`` equals ``reference``, said; a failure named ``name`` where not."""
        self.say(f"  {subject}: {'the same as' if same else 'NOT the same as'} {reference}")
        if not same:
            self.failed.append(name)

    def skip(self, name: str, why: str) -> None:
        """A part that cannot run here: said, and named in the verdict; a failure where TorchTitan
        should import (the torch it is made for)."""
        self.say(f"  not run: {name}: {why}")
        if torch.__version__.startswith("2.13"):
            self.failed.append(f"{name} not run")
        elif name not in self.skipped:
            self.skipped.append(name)

    def verdict(self, ok: bool, name: str, line: str) -> None:
        self.say(f"{line}  {'ok' if ok else 'FAILED'}")
        if not ok:
            self.failed.append(name)


def first_batch(seq_len: int, rows: int) -> dict[str, torch.Tensor]:
    pipeline = build_pipeline(load_recipe(str(RECIPE)), dp_rank=0, dp_world_size=1, seq_len=seq_len,
                              microbatch_size=rows)  # fmt: skip
    try:
        batch = next(iter(pipeline))
    finally:
        pipeline.close()
    return {k: torch.from_numpy(v) for k, v in batch.to_training().items()}


def documents(positions: torch.Tensor) -> list[list[tuple[int, int]]]:
    """Each row's documents: a run from each position 0 (TorchTitan's convention; zephon starts
    every row at 0, a cut document's rest too)."""
    if bool((positions[:, 0] != 0).any()):
        raise ValueError("a row does not start at position 0: its first tokens belong to no document")
    out = []
    for row in positions:
        starts = [*(row == 0).nonzero().flatten().tolist(), len(row)]
        out.append(list(itertools.pairwise(starts)))
    return out


def alone_mask(docs: list[list[tuple[int, int]]], seq_len: int, device) -> torch.Tensor:
    """The dense mask of every document attended alone, causal: ``[rows, 1, L, L]``."""
    mask = torch.zeros(len(docs), 1, seq_len, seq_len, dtype=torch.bool, device=device)
    for row, spans in enumerate(docs):
        for a, b in spans:
            mask[row, 0, a:b, a:b] = torch.ones(b - a, b - a, dtype=torch.bool, device=device).tril()
    return mask


def document_causal(positions: torch.Tensor):
    """mask_mod: a query sees the keys at or before it in its own document."""
    doc = torch.cumsum((positions == 0).int(), dim=1)

    def mask_mod(b, h, q, kv):
        return (q >= kv) & (doc[b, q] == doc[b, kv])

    return mask_mod


def alone(q, k, v, docs) -> torch.Tensor:
    """Every document attended alone, causal, float64 on CPU: q/k/v ``[B, N, L, H]``."""
    q, k, v = (x.detach().double().cpu().requires_grad_() for x in (q, k, v))
    out = torch.zeros_like(q)
    for row, spans in enumerate(docs):
        for a, b in spans:
            out[row, :, a:b] = F.scaled_dot_product_attention(
                q[row : row + 1, :, a:b], k[row : row + 1, :, a:b], v[row : row + 1, :, a:b], is_causal=True
            )[0]
    return out, (q, k, v)


def error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double().cpu() - want.double()).abs().max() / want.double().abs().max())


def with_grads(fn, q, k, v, weight):
    """``fn``'s output and the gradients of ``(out * weight).sum()`` by q, k and v."""
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = fn(q, k, v)
    (out.float() * weight.to(out.device)).sum().backward()
    return out.detach(), [x.grad for x in (q, k, v)]


def torchtitan_masks():
    """TorchTitan's own mask builders (``torchtitan.models.common.attention``, which imports
    where its models do not), or the reason they are not here."""
    try:
        from torch.nn.attention.flex_attention import and_masks
        from torchtitan.models.common import attention as tt
    except ImportError as e:  # not installed, or a torch it cannot run on: said (see skipped)
        return None, f"{type(e).__name__}: {e}"

    def mask_mod(positions):  # Decoder._create_flex_attention_mask_for_document's mask_mods
        document = tt.get_efficient_causal_mask_mod_for_packed_document(positions)
        return and_masks(tt.get_causal_mask_mod(), document)

    return (mask_mod, tt.create_varlen_metadata_for_document), None


def _dense_flex(q, k, v, *, block_mask):
    return attention.dense_flex_attention(q, k, v, block_mask=block_mask)[0]


def flex_part(report: Report, positions: torch.Tensor, heads: int, dim: int) -> None:
    from torch.nn.attention.flex_attention import create_block_mask, create_mask, flex_attention

    rows, seq_len = positions.shape
    report.say(f"== FlexAttention, float32: {rows} rows x {seq_len} tokens, {heads} heads of {dim}")
    g = torch.Generator().manual_seed(0)
    q, k, v, weight = (torch.randn(rows, heads, seq_len, dim, generator=g) for _ in range(4))
    docs = documents(positions)
    ref, leaves = alone(q, k, v, docs)
    (ref * weight.double()).sum().backward()
    want = [ref.detach(), *(x.grad for x in leaves)]
    builders, why = torchtitan_masks()
    masks = {"this script's": document_causal}
    if builders is None:
        report.skip("TorchTitan's flex mask", why)
    else:
        masks["TorchTitan's"] = builders[0]
    place = "cuda" if torch.cuda.is_available() else "cpu"
    on_place = positions.to(place)
    reference = alone_mask(docs, seq_len, place)
    compiled = torch.compile(flex_attention)
    for label, mask_mod in masks.items():
        same = torch.equal(
            create_mask(mask_mod(on_place), rows, 1, seq_len, seq_len, device=place), reference
        )
        report.same(
            same, f"{label} flex mask", f"{label} mask, dense on {place}", "every document alone, causal"
        )
        cpu_mask = create_block_mask(mask_mod(positions), rows, None, seq_len, seq_len, device="cpu")
        out, grads = with_grads(partial(_dense_flex, block_mask=cpu_mask), q, k, v, weight)
        report.check_each(f"{label} mask, CPU (zephon's kernel)", [out, *grads], want, TOLERANCE["float32"])
        if place == "cpu":
            continue
        gpu_mask = create_block_mask(mask_mod(on_place), rows, None, seq_len, seq_len, device="cuda")
        start = time.perf_counter()
        on_gpu = (x.cuda() for x in (q, k, v))
        out, grads = with_grads(partial(compiled, block_mask=gpu_mask), *on_gpu, weight)
        report.say(f"  ({label} mask: compiled and ran in {time.perf_counter() - start:.1f} s)")
        report.check_each(f"{label} mask, GPU (compiled flex)", [out, *grads], want, TOLERANCE["float32"])
    if place == "cpu":
        report.say("  GPU: none here")


def varlen_part(report: Report, positions: torch.Tensor, heads: int, dim: int) -> None:
    rows, seq_len = positions.shape
    report.say(f"== varlen attention, bfloat16: {rows} rows x {seq_len} tokens, {heads} heads of {dim}")
    g = torch.Generator().manual_seed(1)
    q, k, v, weight = (torch.randn(rows * seq_len, heads, dim, generator=g).bfloat16() for _ in range(4))
    docs = documents(positions)
    bounds = sorted({row * seq_len + i for row, spans in enumerate(docs) for span in spans for i in span})
    cu_seq = torch.tensor(bounds, dtype=torch.int32)
    longest = max(b - a for a, b in itertools.pairwise(bounds))
    builders, why = torchtitan_masks()
    if builders is None:
        report.skip("TorchTitan's cu_seqlens", why)
    else:
        meta = builders[1](positions)
        same = torch.equal(meta.cu_seq_q.cpu(), cu_seq) and torch.equal(meta.cu_seq_k.cpu(), cu_seq)
        same = same and meta.max_q == meta.max_k == longest
        report.same(same, "TorchTitan's cu_seqlens", "TorchTitan's cu_seqlens", "every document's bounds")

    def as_rows(x):  # [T, N, H] -> [B, N, L, H]
        return x.view(rows, seq_len, heads, dim).transpose(1, 2)

    ref, leaves = alone(*(as_rows(x) for x in (q, k, v)), docs)
    (ref * as_rows(weight).double()).sum().backward()
    ref_grads = [x.grad for x in leaves]
    want = [ref.detach(), *ref_grads]

    def cpu(q_, k_, v_):
        return attention.dense_varlen_attention(q_, k_, v_, cu_seq, cu_seq, longest, longest)

    out, grads = with_grads(cpu, q, k, v, weight)
    report.check_each(
        "CPU (zephon's dense kernel)", [as_rows(x) for x in (out, *grads)], want, TOLERANCE["bfloat16"]
    )

    if not torch.cuda.is_available():
        report.say("  GPU: none here")
        return
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError as e:
        report.say(f"  GPU: this torch has no varlen attention ({e})")
        return
    params = inspect.signature(varlen_attn).parameters
    causal = {"window_size": (-1, 0)} if "window_size" in params else {"is_causal": True}
    report.say(f"  varlen_attn{inspect.signature(varlen_attn)}: causal by {causal}")
    cu_gpu = cu_seq.cuda()

    def gpu(q_, k_, v_):
        return varlen_attn(q_, k_, v_, cu_gpu, cu_gpu, longest, longest, **causal)

    out, grads = with_grads(gpu, *(x.cuda() for x in (q, k, v)), weight)
    report.check_each(
        "GPU (varlen_attn)", [as_rows(x.cpu()) for x in (out, *grads)], want, TOLERANCE["bfloat16"]
    )


def torchtitan_part(report: Report, batch: dict[str, torch.Tensor]) -> None:
    """TorchTitan's debug model and masks: packed rows against documents alone, GPU against CPU."""
    report.say("== TorchTitan's llama3 debug model, its own masks")
    try:
        import torchtitan.models.llama3  # noqa: F401
    except ImportError as e:  # a torch TorchTitan 0.3.0 cannot run on: said (see skipped)
        report.skip(
            "TorchTitan's debug model", f"its models do not import with torch {torch.__version__}: {e}"
        )
        return
    attention.install()
    ids, labels, positions = batch["input_ids"], batch["labels"], batch["positions"]
    docs = documents(positions)
    for backend in ("flex", "varlen"):
        model = attention.debug_model(backend, positions.shape[1])
        losses = {}
        places = ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"]
        for place in places:
            m = model.to(place)
            i, lab, pos = ids.to(place), labels.to(place), positions.to(place)
            with torch.no_grad():
                packed = _token_losses(m, i, lab, pos).cpu()
                worst = 0.0
                for row, spans in enumerate(docs):
                    for a, b in spans:
                        solo = _token_losses(m, i[row : row + 1, a:b], lab[row : row + 1, a:b],
                                             torch.arange(b - a, device=place)[None]).cpu()  # fmt: skip
                        worst = max(worst, float((solo[0] - packed[row, a:b]).abs().max()))
            losses[place] = packed
            scale = float(packed.abs().max())
            most = LOSS_TOLERANCE[backend] * scale
            line = f"  {backend:<6} on {place:<4}: packed rows against documents alone, largest token-loss"
            report.verdict(worst <= most, f"{backend} {place} packed vs alone",
                           f"{line} difference {worst:.2e} (at most {most:.1e})")  # fmt: skip
        if "cuda" in losses:
            e = error(losses["cpu"], losses["cuda"])
            line = f"  {backend:<6}: CPU token losses against the GPU's, max error {e:.2e}"
            line += f" (at most {GPU_CPU_LOSS:.0e})"
            report.verdict(e <= GPU_CPU_LOSS, f"{backend} CPU vs GPU losses", line)


def _token_losses(model, ids, labels, positions) -> torch.Tensor:
    logits = model(ids, positions=positions, attention_masks=model.get_attention_masks(positions))
    losses = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="none")
    return losses.view(labels.shape)


def check_attention(seq_len: int = 1024, rows: int = 4, heads: int = 8, dim: int = 64) -> Report:
    """Every part of the check on ``rows`` rows of ``seq_len`` tokens of the debug recipe."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    report = Report()
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    report.say(f"torch {torch.__version__}, {device}")
    batch = first_batch(seq_len, rows)
    counts = [len(d) for d in documents(batch["positions"])]
    report.say(f"rows of the debug recipe: {rows} x {seq_len} tokens, documents a row {counts}")
    positions = batch["positions"]
    for part, args in ((flex_part, (positions, heads, dim)), (varlen_part, (positions, heads, dim)),
                       (torchtitan_part, (batch,))):  # fmt: skip
        try:
            part(report, *args)
        except Exception:  # one part's crash is its failure, the others still run
            report.say(traceback.format_exc().rstrip())
            report.failed.append(f"{part.__name__} crashed")
    failed, skipped = report.failed, report.skipped
    verdict = f"FAILED: {', '.join(failed)}" if failed else "passed"
    if skipped:
        verdict += f" (not run: {', '.join(skipped)})"
    report.say(f"GPU attention check {verdict}")
    return report


def main(argv: list[str] | None = None) -> int:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--out", help="also write the report here")
    args = parser.parse_args(argv)
    if args.seq_len < 2 or args.rows < 1 or args.heads < 1 or args.dim < 1:
        parser.error("--seq-len at least 2, --rows, --heads and --dim at least 1")
    report = check_attention(args.seq_len, args.rows, args.heads, args.dim)
    if args.out:
        Path(args.out).write_text("\n".join(report.lines) + "\n")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
