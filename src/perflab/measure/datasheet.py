"""Datasheet peaks of NVIDIA data-centre GPUs: dense matmul TFLOP/s per dtype and DRAM bandwidth.

The numbers are NVIDIA's published dense (no sparsity) peaks at boost clock. perflab shows utilisation
against them beside utilisation against the ceilings it measures on the GPU itself (measure/ceilings.py):
the measured ones say how close a workload is to what this GPU really does; the datasheet ones compare
with figures quoted elsewhere. ``fp32`` is the non-tensor-core rate; ``tf32`` the tensor-core rate.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Datasheet:
    name: str
    bf16: float  # dense TFLOP/s (also fp16)
    tf32: float
    fp32: float
    bandwidth_gbps: float  # HBM, GB/s

    def tflops(self, dtype: str) -> float:
        return {"bf16": self.bf16, "fp16": self.bf16, "tf32": self.tf32, "fp32": self.fp32}[dtype]


# Matched in order against the CUDA device name (most specific first).
DATASHEETS = (
    ("H200", Datasheet("H200 SXM", 989.4, 494.7, 66.9, 4800.0)),
    ("H100 PCIe", Datasheet("H100 PCIe", 756.0, 378.0, 51.2, 2000.0)),
    ("H100", Datasheet("H100 SXM", 989.4, 494.7, 66.9, 3350.0)),
    ("A100-SXM4-80GB", Datasheet("A100 SXM 80GB", 312.0, 156.0, 19.5, 2039.0)),
    ("A100 80GB PCIe", Datasheet("A100 PCIe 80GB", 312.0, 156.0, 19.5, 1935.0)),
    ("A100", Datasheet("A100 40GB", 312.0, 156.0, 19.5, 1555.0)),
    ("L40S", Datasheet("L40S", 362.1, 183.0, 91.6, 864.0)),
)


def datasheet_for(device_name: str) -> Datasheet | None:
    for key, sheet in DATASHEETS:
        if key in device_name:
            return sheet
    return None
