"""TorchTitan's own attention on CPU: its modules and masks, with dense kernels that run there.

TorchTitan 0.3.0 builds per-document masks from the ``positions`` a loader gives
(``Decoder.get_attention_masks``: a FlexAttention ``BlockMask`` whose mask_mod is causal AND the
packed-document rule, or varlen ``cu_seqlens``). On GPUs the kernels that consume them are
compiled FlexAttention and FlashAttention varlen. On CPU, torch 2.13 has neither for training:

- ``flex_attention`` refuses inputs that require grad on CPU ("FlexAttention does not support
  backward on CPU"), eager and compiled alike; with that check bypassed, eager runs (0.40 s per
  debug-model microbatch against 0.16 s here) and compiled fails in Inductor's lowering;
- ``varlen_attn`` calls ``aten::_flash_attention_forward``, which has no CPU kernel.

So :func:`install` keeps TorchTitan's attention modules and the masks TorchTitan builds, and
swaps only those two kernels, on CPU tensors only (CUDA tensors go to TorchTitan's own):

- FlexAttention: ``scaled_dot_product_attention`` with the boolean mask evaluated from the
  BlockMask's own mask_mod at every (query, key) (``create_mask``), so the mask is TorchTitan's;
- varlen: ``scaled_dot_product_attention`` per group of whole segments of ``cu_seqlens``, each
  token attending within its segment and window (causal: ``window_size=(-1, 0)``).

TorchTitan's compiled ``create_block_mask`` is made eager on CPU (the same function; compiling
it costs about 14 s per process on 2 cores, more than a debug job's training). Nothing here
happens on import.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

_INSTALLED = False
_LAST_MASK: list = [None, None]  # the last BlockMask and its dense mask
_LAST_VARLEN: list = [None, None, None]  # the last cu_seqlens, (window, group size), masks
GROUP_TOKENS = 2048  # varlen on CPU: segments are attended in groups of about this many tokens


def install() -> None:
    """Dense CPU kernels for TorchTitan's FlexAttention and varlen attention (see the module)."""
    global _INSTALLED
    if _INSTALLED:
        return
    import torchtitan.models.common.attention as tt_attention
    from torch.nn.attention.flex_attention import create_block_mask

    _INSTALLED = True
    flex = tt_attention.FlexAttention
    flex.compiled_flex_attn = staticmethod(_on_cpu(dense_flex_attention, flex.compiled_flex_attn))
    tt_attention.varlen_attn = _on_cpu(dense_varlen_attention, tt_attention.varlen_attn)
    compiled_mask = tt_attention._compiled_create_block_mask

    def block_mask(*args, device=None, **kwargs):
        on_cpu = device is None or torch.device(device).type == "cpu"
        return (create_block_mask if on_cpu else compiled_mask)(*args, device=device, **kwargs)

    tt_attention._compiled_create_block_mask = block_mask


def _on_cpu(dense, original):
    def kernel(query, *args, **kwargs):
        return (dense if query.device.type == "cpu" else original)(query, *args, **kwargs)

    return kernel


def dense_flex_attention(
    q, k, v, *, score_mod=None, block_mask, scale=None, enable_gqa=False, return_aux=None, kernel_options=None
):
    """FlexAttention's result for a BlockMask, computed densely: ``(out, AuxOutput)``, q/k/v
    ``[B, N, L, H]``."""
    from torch.nn.attention.flex_attention import AuxOutput, create_mask

    if score_mod is not None:
        raise NotImplementedError("zephon's CPU FlexAttention takes a mask_mod only, not a score_mod")
    batch, _, q_len, _ = q.shape
    if _LAST_MASK[0] is not block_mask:  # every layer of a forward gets the same BlockMask
        mask = create_mask(block_mask.mask_mod, batch, 1, q_len, k.shape[-2], device=q.device)
        _LAST_MASK[:] = [block_mask, mask]
    mask = _LAST_MASK[1]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa)
    lse = None
    if return_aux is not None and return_aux.lse:
        lse = _log_sum_exp(q, k, mask, scale, enable_gqa)
    return out, AuxOutput(lse=lse)


def _log_sum_exp(q, k, mask, scale, enable_gqa):
    if enable_gqa:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    scores = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5 if scale is None else scale)
    return scores.masked_fill(~mask, float("-inf")).logsumexp(-1)


def dense_varlen_attention(
    q, k, v, cu_seq_q, cu_seq_k, max_q, max_k, *, scale=None, window_size=(-1, 0), enable_gqa=False,
    return_aux=None, **_kernel_options,
):  # fmt: skip
    """``varlen_attn`` computed densely: q/k/v ``[T, N, H]``, segments ``cu_seq_q``."""
    if return_aux is not None:
        raise NotImplementedError("zephon's CPU varlen attention returns no auxiliary outputs")
    if not torch.equal(cu_seq_q, cu_seq_k):
        raise NotImplementedError("zephon's CPU varlen attention needs the same segments for q and k")
    out = []
    for start, stop, mask in _varlen_masks(cu_seq_q, tuple(window_size), q.device):
        qs, ks, vs = (x[start:stop].transpose(0, 1).unsqueeze(0) for x in (q, k, v))
        o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scale, enable_gqa=enable_gqa)
        out.append(o.squeeze(0).transpose(0, 1))
    return torch.cat(out)


def _varlen_masks(cu_seq: torch.Tensor, window_size: tuple[int, int], device) -> list:
    """``(start, stop, mask)`` per group of segments; every layer of a forward gets the same
    ``cu_seq`` tensor, so the last one's are kept."""
    if _LAST_VARLEN[0] is not cu_seq or _LAST_VARLEN[1] != (window_size, GROUP_TOKENS):
        bounds, groups = [int(b) for b in cu_seq.tolist()], []
        for start, stop in _groups(bounds, GROUP_TOKENS):
            seg = _segment_ids(bounds, start, stop, device)
            mask = (seg[:, None] == seg[None, :]) & _window(stop - start, window_size, device)
            groups.append((start, stop, mask))
        _LAST_VARLEN[:] = [cu_seq, (window_size, GROUP_TOKENS), groups]
    return _LAST_VARLEN[2]


def _groups(bounds: list[int], most: int) -> list[tuple[int, int]]:
    """Consecutive whole segments, about ``most`` tokens a group (a longer segment alone)."""
    groups, start = [], bounds[0]
    for a, b in itertools.pairwise(bounds[1:]):
        if b - start > most:
            groups.append((start, a))
            start = a
    groups.append((start, bounds[-1]))
    return [(a, b) for a, b in groups if b > a]


def _segment_ids(bounds: list[int], start: int, stop: int, device) -> torch.Tensor:
    inner = torch.tensor([b for b in bounds if start < b < stop], dtype=torch.long, device=device)
    marks = torch.zeros(stop - start, dtype=torch.long, device=device)
    marks[inner - start] = 1
    return marks.cumsum(0)


def _window(n: int, window_size, device) -> torch.Tensor:
    """``(left, right)``: how far back and ahead a query attends; -1 is unlimited."""
    left, right = window_size
    i = torch.arange(n, device=device)
    offset = i[None, :] - i[:, None]  # key - query
    mask = torch.ones(n, n, dtype=torch.bool, device=device)
    if right >= 0:
        mask &= offset <= right
    if left >= 0:
        mask &= offset >= -left
    return mask


def debug_model(backend: str = "flex", seq_len: int = 2048) -> torch.nn.Module:
    """TorchTitan's llama3 debug model, float32 on CPU, seeded (for checks and benchmarks of the
    attention path): ``backend`` "flex" or "varlen" (per-document masks), or "sdpa" (causal only,
    what CPU runs used before), its rotary table ``seq_len`` long."""
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import model_registry

    config = model_registry("debugmodel", attn_backend="flex" if backend == "sdpa" else backend).model
    for layer in config.layers:
        layer.attention.rope.max_seq_len = seq_len
        if backend == "sdpa":
            layer.attention.inner_attention = ScaledDotProductAttention.Config()
    torch.manual_seed(0)
    with torch.device("meta"):
        model = config.build()
    model.to_empty(device="cpu")
    model.init_states(buffer_device=torch.device("cpu"))
    return model
