"""Launch-time checks: each a ValueError that names the numbers to change, before step 1."""

from __future__ import annotations

from zephon.batch import batches_per_lane


def check_batch_geometry(
    *, num_lanes: int, dp_world_size: int, local_batch_size: int, global_batch_size: int
) -> int:
    """Batches each lane gives to one optimizer step; raises if the numbers don't fit."""
    if local_batch_size < 1:
        raise ValueError(f"training.local_batch_size = {local_batch_size}: it must be at least 1")
    if num_lanes % dp_world_size:
        raise ValueError(
            f"the data-parallel size is {dp_world_size} but the recipe has num_lanes = {num_lanes}: "
            f"every rank must own the same number of lanes, so num_lanes must be a multiple of the "
            f"DP size. Use a DP size among {divisors(num_lanes)}, "
            "or change num_lanes (that starts a new data order)"
        )
    per_step = num_lanes * local_batch_size
    try:
        return batches_per_lane(global_batch_size, num_lanes, local_batch_size)
    except ValueError:
        pass  # the same rule as the engine's, said in TorchTitan's words below
    if global_batch_size <= 0:
        raise ValueError(
            "set training.global_batch_size: it decides which data makes each step and must stay "
            f"the same on any number of GPUs (a multiple of num_lanes {num_lanes} x "
            f"training.local_batch_size {local_batch_size} = {per_step})"
        )
    if global_batch_size % per_step:
        raise ValueError(
            f"training.global_batch_size = {global_batch_size} does not split evenly across "
            f"num_lanes {num_lanes} x training.local_batch_size {local_batch_size} = {per_step}: "
            f"use a multiple of {per_step} (e.g. {(global_batch_size // per_step + 1) * per_step}), or "
            "change training.local_batch_size or num_lanes"
        )
    raise AssertionError(f"batches_per_lane refused {global_batch_size}, {num_lanes}, {local_batch_size}")


def check_vocab(tokenizer_vocab: int, model_vocab: int, tokenizer_id: str) -> None:
    if tokenizer_vocab > model_vocab:
        raise ValueError(
            f"the recipe's tokenizer {tokenizer_id!r} has {tokenizer_vocab} tokens but the model's "
            f"vocabulary has {model_vocab}: use a tokenizer that fits, or a model with a vocabulary "
            f"of at least {tokenizer_vocab}"
        )


def check_context_length(recipe, seq_len: int) -> None:
    """A recipe that names its context length must name TorchTitan's ``training.seq_len``."""
    if recipe.max_length is not None and recipe.max_length != seq_len:
        raise ValueError(
            f"data recipe {recipe.path}: [packing] max_length = {recipe.max_length} but "
            f"training.seq_len = {seq_len}; make them equal (or drop max_length from the recipe)"
        )


def divisors(n: int, most: int = 12) -> list[int]:
    """The smallest ``most`` divisors of ``n`` (found up to its square root, not by trial to n)."""
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})[:most]


def attention_kinds(model_config) -> list[tuple[str, str]]:
    """Each attention layer of a TorchTitan model config and its inner attention's kind."""
    from torchtitan.models.common.attention import BaseAttention

    return [
        (fqn or "layer", type(attention.inner_attention).__qualname__)
        for fqn, attention, _, _ in model_config.traverse(BaseAttention.Config)
    ]


MASKING_ATTENTION = ("FlexAttention.Config", "VarlenAttention.Config")  # take TorchTitan's document masks


def check_attention(kinds: list[tuple[str, str]], document_mask: bool) -> None:
    """With document masking on, every attention layer must mask documents from positions (flex
    or varlen), else documents would attend across each other with no error. ``kinds``: from
    :func:`attention_kinds`."""
    if not document_mask:
        return
    for fqn, kind in kinds:
        if kind not in MASKING_ATTENTION:
            raise ValueError(
                f"the model's attention {fqn} uses {kind}, which cannot mask "
                "documents (only flex and varlen attention take TorchTitan's per-document masks), "
                "but the data recipe masks documents ([packing] document_mask = true, the default). "
                "Use a model config with flex or varlen attention, or set [packing] document_mask = "
                "false (--dataloader.document_mask false) to train on whole rows"
            )
