"""Running TorchTitan 0.3.0 on CPU with gloo (for tests and demos).

Nothing here happens on import. ``python -m zephon.torchtitan.train`` calls :func:`install` on
machines without a GPU, before TorchTitan is imported, and :func:`configure` changes a job's
config only there; on GPUs TorchTitan runs as it is. What it takes on CPU, and why (each is the
smallest change that works):

1. Device: TorchTitan computes ``device_type = _get_available_device_type() or "cuda"`` when
   ``torchtitan.tools.utils`` is imported, which is "cuda" on a CPU-only build. While that module
   is imported, torch is made to answer "cpu" and a device module that has the few CUDA-style
   calls TorchTitan makes (memory stats, device name, ``current_device() == 0`` for barriers).
   ``init_process_group`` then picks gloo.
2. Summed FSDP reductions: TorchTitan sets FSDP's gradient divide factor to 1, so torch reduces
   with ``PREMUL_SUM``, which gloo lacks; forcing plain SUM is the same math.
3. Attention: the model's own attention modules and the per-document masks TorchTitan builds
   from the loader's positions, as on GPUs; only the kernels without a CPU backward (compiled
   FlexAttention, FlashAttention varlen) are computed densely with the same masks
   (zephon.torchtitan.attention).
4. Config switches (:func:`configure`): the ``partial_dtensor`` SPMD backend (the default
   ``spmd_types`` fails in FSDP with DP > 1 on this torch), no CUDA graphs.

Independent of the device (:func:`install_torch_compat`, on GPUs too): torch 2.13 lacks
``torch.distributed.set_timeout``, which TorchTitan 0.3.0 calls after step 1; its private twin
``_set_pg_timeout`` (same signature) stands in, only where the public one is missing.
"""

from __future__ import annotations

import os
import sys
import types

import torch

from zephon.torchtitan import attention

_INSTALLED = False


def on_cpu() -> bool:
    return not torch.cuda.is_available()


class _CpuDeviceModule(types.ModuleType):
    """``torch.cpu`` plus the CUDA-style calls TorchTitan makes on its device module."""

    def __getattr__(self, name):
        return getattr(torch.cpu, name)

    @staticmethod
    def current_device():
        return 0

    @staticmethod
    def get_device_name(device=None):
        return "cpu"

    @staticmethod
    def get_device_properties(device=None):
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")  # memory stats read as 0
        return types.SimpleNamespace(name="cpu", total_memory=memory)

    @staticmethod
    def memory_stats(device=None):
        return {}

    @staticmethod
    def reset_peak_memory_stats(device=None):
        return None

    @staticmethod
    def empty_cache():
        return None


def install_torch_compat() -> None:
    """``torch.distributed.set_timeout`` where this torch lacks it (TorchTitan 0.3.0 calls it)."""
    import torch.distributed as dist

    if not hasattr(dist, "set_timeout"):
        dist.set_timeout = dist.distributed_c10d._set_pg_timeout


def install() -> None:
    """CPU support, on a machine without a GPU; call before TorchTitan is imported."""
    global _INSTALLED
    if _INSTALLED:
        return
    if not on_cpu():
        raise RuntimeError(
            "zephon's CPU support is for machines without a GPU; TorchTitan runs as is on GPUs"
        )
    if "torchtitan.tools.utils" in sys.modules:
        raise RuntimeError(
            "install zephon's CPU support before importing torchtitan (it picks its device then)"
        )
    _INSTALLED = True
    install_torch_compat()
    _select_cpu_device()
    _force_summed_fsdp_reductions()
    attention.install()


def _select_cpu_device() -> None:
    import torch._utils as tu

    module = _CpuDeviceModule("zephon_cpu_device")
    saved = tu._get_available_device_type, tu._get_device_module
    tu._get_available_device_type, tu._get_device_module = (lambda: "cpu"), (lambda device_type=None: module)
    try:
        import torchtitan.tools.utils as tt_utils
    finally:
        tu._get_available_device_type, tu._get_device_module = saved
    assert tt_utils.device_type == "cpu", tt_utils.device_type


def _force_summed_fsdp_reductions() -> None:
    import torchtitan.distributed.fsdp as tt_fsdp
    from torch.distributed.fsdp import FSDPModule

    original = tt_fsdp.disable_fsdp_gradient_division

    def divide_by_one_with_sum(model):
        original(model)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)

    tt_fsdp.disable_fsdp_gradient_division = divide_by_one_with_sum


def configure(config) -> None:
    """The config switches CPU needs (see the module docstring); nothing on GPUs."""
    if not on_cpu():
        return
    config.parallelism.spmd_backend = "partial_dtensor"
    config.training.disable_cuda_graphs = True
