"""What feeds the GPU: one `PipelineSpec` -> a PyTorch DataLoader or an NVIDIA DALI pipeline.

Both backends read the same files for a shard and yield the same batches (`Batch`): float32
NCHW images, normalized, and int64 labels, on the spec's device (a CUDA index, or the CPU).
"""

from pipelines.dataset import Dataset, discover, read_order, shard, shard_bounds
from pipelines.errors import BackendUnavailable, CorruptImageError, InputError
from pipelines.host import (
    CpuLimits,
    Throttling,
    available_cpus,
    cpu_limits,
    cpu_set_text,
    cpu_throttling,
    keep_to_cores,
    own_cores,
    parse_cpu_set,
    shm_free_mib,
)
from pipelines.loader import (
    Batch,
    InputPipeline,
    build_pipeline,
    check_backend,
    check_device,
)
from pipelines.spec import (
    Augmentation,
    Backend,
    DaliOptions,
    DataLoaderOptions,
    Decoder,
    OutputDtype,
    PipelineSpec,
)

__all__ = [
    "Augmentation",
    "Backend",
    "BackendUnavailable",
    "Batch",
    "CorruptImageError",
    "CpuLimits",
    "DaliOptions",
    "DataLoaderOptions",
    "Dataset",
    "Decoder",
    "InputError",
    "InputPipeline",
    "OutputDtype",
    "PipelineSpec",
    "Throttling",
    "available_cpus",
    "build_pipeline",
    "check_backend",
    "check_device",
    "cpu_limits",
    "cpu_set_text",
    "cpu_throttling",
    "discover",
    "keep_to_cores",
    "own_cores",
    "parse_cpu_set",
    "read_order",
    "shard",
    "shard_bounds",
    "shm_free_mib",
]
