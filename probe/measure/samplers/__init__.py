"""What the hardware does during a run: one module per source, each yielding the typed frozen
samples of `probe.records`.

`nvml` reads the GPUs (NVML and GPM, through one query function), `host` reads the CPUs, disks
and the run's processes (psutil). Only these modules import pynvml and psutil.
"""
