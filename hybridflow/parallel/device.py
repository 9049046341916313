"""Device placement of a worker process, decided in one place: `DevicePlan`.

A worker's placement follows what the worker *asked for* (``use_gpu``, the GPU slot of its resource
pool), never what the machine happens to have: Ray does not hide GPUs from a worker that asked for none,
so a CPU worker on a GPU machine still sees ``torch.cuda.is_available()``. From that one input the plan
fixes everything that depends on the device:

============================  ================================  =====================================
decision                      GPU worker                        CPU worker
============================  ================================  =====================================
tensor device                 ``cuda:0``                        ``cpu``
process-group backend         ``nccl``                          ``gloo``
default FSDP2 compute dtype   ``bfloat16`` (fp32 reduction)     ``float32``
training attention            ``flash_attention_2`` when        ``hybridflow_varlen_sdpa``
                              installed and the compute dtype
                              is bf16/fp16, else varlen SDPA
============================  ================================  =====================================

Each process sees exactly its own GPU as device 0: Ray exposes the GPU of the actor's bundle, and
`hybridflow.parallel.run_ranks` sets ``CUDA_VISIBLE_DEVICES`` per rank.

`plan_devices` is the pure decision, from explicit inputs; `local_device_plan` feeds it what this
process can see. Roles receive their Batches on the plan's device through `on_worker_device`.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.fsdp import MixedPrecisionPolicy

from hybridflow.parallel.varlen_attention import VARLEN_SDPA
from hybridflow.protocol import Batch

__all__ = [
    "FLASH_ATTENTION",
    "DevicePlan",
    "choose_attn_implementation",
    "local_device_plan",
    "on_worker_device",
    "places_batches_on_device",
    "plan_devices",
    "process_group_device_plan",
]

FLASH_ATTENTION = "flash_attention_2"
# flash-attn kernels take half-precision inputs only; fp32 is refused at the first forward.
_FLASH_DTYPES = (torch.bfloat16, torch.float16)
_DTYPE_NAMES = ("float32", "bfloat16", "float16")
_ON_DEVICE_MARK = "__hybridflow_on_device__"


def choose_attn_implementation(device_type: str, compute_dtype: torch.dtype, flash_attn_installed: bool) -> str:
    """The attention to train packed sequences with.

    flash-attn varlen on CUDA when installed and the compute dtype is bf16 or fp16; otherwise
    ``hybridflow_varlen_sdpa`` (per-sequence SDPA, any device and dtype).
    """
    if device_type == "cuda" and flash_attn_installed and compute_dtype in _FLASH_DTYPES:
        return FLASH_ATTENTION
    return VARLEN_SDPA


@dataclass(frozen=True)
class DevicePlan:
    """Where one worker process computes, and what follows from it.

    Attributes:
        device: the device of the process's weights and batches (``cuda:0`` or ``cpu``).
        backend: the ``torch.distributed`` backend of its process group (``nccl`` or ``gloo``).
        default_compute_dtype: the FSDP2 compute dtype when a config names none.
        flash_attn_installed: whether flash-attn kernels can be used (always ``False`` on CPU).
    """

    device: torch.device
    backend: str
    default_compute_dtype: torch.dtype
    flash_attn_installed: bool

    @property
    def device_type(self) -> str:
        """``"cuda"`` or ``"cpu"``: the device type of the process's device meshes."""
        return self.device.type

    def compute_dtype(self, param_dtype: str | None) -> torch.dtype:
        """The compute dtype a config's ``param_dtype`` (``"float32"``, ``"bfloat16"``, ``"float16"``
        or ``None`` for the plan's default) stands for."""
        if param_dtype is None:
            return self.default_compute_dtype
        if param_dtype not in _DTYPE_NAMES:
            raise ValueError(f"param_dtype must be one of {_DTYPE_NAMES} or None, got {param_dtype!r}")
        return getattr(torch, param_dtype)

    def mixed_precision(self, param_dtype: str | None) -> MixedPrecisionPolicy:
        """FSDP2 policy: compute in `compute_dtype`, reduce gradients in fp32."""
        return MixedPrecisionPolicy(param_dtype=self.compute_dtype(param_dtype), reduce_dtype=torch.float32)

    def attn_implementation(self, param_dtype: str | None) -> str:
        """The training attention for a model computing in ``param_dtype`` (see `choose_attn_implementation`)."""
        return choose_attn_implementation(
            self.device_type, self.compute_dtype(param_dtype), self.flash_attn_installed
        )


def plan_devices(use_gpu: bool, *, cuda_available: bool, flash_attn_installed: bool) -> DevicePlan:
    """The placement of a worker that asked for a GPU (``use_gpu``) or not.

    A pure function: ``cuda_available`` and ``flash_attn_installed`` describe the machine and only
    matter to a GPU worker. Raises ``ValueError`` when a GPU is asked for and none is visible.
    """
    if not use_gpu:
        return DevicePlan(torch.device("cpu"), "gloo", torch.float32, flash_attn_installed=False)
    if not cuda_available:
        raise ValueError(
            "use_gpu is true but torch sees no CUDA device (torch.cuda.is_available() is False): "
            "install a CUDA build of torch, or set resource.use_gpu=false"
        )
    return DevicePlan(torch.device("cuda", 0), "nccl", torch.bfloat16, flash_attn_installed)


@functools.cache
def local_device_plan(use_gpu: bool) -> DevicePlan:
    """`plan_devices` for this process: CUDA and flash-attn are probed only for a GPU worker."""
    if not use_gpu:
        return plan_devices(False, cuda_available=False, flash_attn_installed=False)
    return plan_devices(
        True,
        cuda_available=torch.cuda.is_available(),
        flash_attn_installed=importlib.util.find_spec("flash_attn") is not None,
    )


def process_group_device_plan(group: dist.ProcessGroup | None = None) -> DevicePlan:
    """The plan of this process as its process group (default: the default group) tells it.

    The group's backend was chosen by a plan, so it tells which: ``nccl`` for a GPU worker, ``gloo``
    for a CPU one; a process outside any group is a CPU worker. For helpers that are handed no plan.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return local_device_plan(False)
    return local_device_plan(dist.get_backend(group) == "nccl")


F = TypeVar("F", bound=Callable[..., Any])


def on_worker_device(method: F) -> F:
    """Run a `Worker` method with every `Batch` argument moved to the worker's device (``self.device``).

    Ray delivers Batches on the CPU; a role computing on a GPU needs every column there (labels,
    masks and advantages as much as the model's inputs). Decorate each role method that takes a
    Batch, under ``@register``.
    """

    @functools.wraps(method)
    def placed(self: Any, *args: Any, **kwargs: Any) -> Any:
        device = self.device
        args = tuple(arg.to(device) if isinstance(arg, Batch) else arg for arg in args)
        kwargs = {key: value.to(device) if isinstance(value, Batch) else value for key, value in kwargs.items()}
        return method(self, *args, **kwargs)

    setattr(placed, _ON_DEVICE_MARK, True)
    return placed  # type: ignore[return-value]


def places_batches_on_device(method: Callable[..., Any]) -> bool:
    """Whether ``method`` was decorated with `on_worker_device`."""
    return getattr(method, _ON_DEVICE_MARK, False)
