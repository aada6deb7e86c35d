"""How fast is ``perflab analyze`` on a large Kineto trace, and how much memory does it take?

    PYTHONPATH=src python benchmarks/analysis_speed.py [--kernels 1000000] [--hta-python /tmp/hta-venv/bin/python]
    PYTHONPATH=src python benchmarks/analysis_speed.py --layouts --repeat 1   # the reader on every layout, and the candidate parsers
    PYTHONPATH=src python benchmarks/analysis_speed.py --layouts --no-parsers --dir /tmp/bench   # every layout, median of 3

``--layouts`` also writes the same trace as compact one-line JSON, with every object's keys reversed, and
gzipped (torch.profiler's own text, gzip level 1), and the same events with their times spelled as a tool
that re-writes traces with Python floats prints them (``"ts": 1000008.0665311092``, ``"dur":
8.066531109150288``, ``"ts": 1000000.0``: ``float_ts``/``float_dur``) in torch's text, compact and
gzipped; runs ``perflab analyze --json`` on each (median of ``--repeat``; the JSON output must be
identical within a spelling, and kernel count, kernel time and GPU busy time exactly what was written),
and measures the candidate parsers side by side on reading the events (load only; ``--no-parsers`` skips
them): msgspec typed decoding of the needed fields (perflab's reader), orjson and the standard library's
json on the same slices (decoding every field into dicts), each where it imports. ``--only`` picks layouts.

Writes a realistic Kineto trace (plain .json, in the exact layout torch.profiler's export_chrome_trace
writes: CPU ops and annotations first, then the CUPTI activities with their ac2g flow events, then the
metadata) with ``--kernels`` kernels into a temporary directory, then runs ``perflab analyze --json`` on
it in a subprocess and reports the wall time and the peak RSS of that subprocess. With ``--hta-python``
it does the same for Holistic Trace Analysis (``TraceAnalysis`` + ``get_temporal_breakdown`` +
``get_gpu_kernel_breakdown``) run by that interpreter. The trace is deleted afterwards unless ``--keep``.

The trace models a ViT-like eager inference loop: every step is a ``ProfilerStep#N`` and a ``step``
annotation around 12 blocks annotated ``blockI.attn`` / ``blockI.mlp``; each kernel has one ``cpu_op``
(with record_shapes arguments), one launch call (``cudaLaunchKernel`` through ``cuda_runtime``, or
``cuLaunchKernelEx`` through ``cuda_driver`` for the nvjet GEMMs, as cuBLAS does on Hopper), an ``s``
and an ``f`` flow event, and the kernel itself; one ``cudaMemcpyAsync`` (DtoH) and a
``cudaDeviceSynchronize`` end each step.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HEADER = """
  {
    "schemaVersion": 1,
    "deviceProperties": [
    {
      "id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150109880320,
      "computeMajor": 9, "computeMinor": 0,
      "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
      "regsPerBlock": 65536, "warpSize": 32,
      "sharedMemPerBlock": 49152, "numSms": 132
    , "regsPerMultiprocessor": 65536, "sharedMemPerBlockOptin": 232448, "sharedMemPerMultiprocessor": 233472
    }
    ],
      "trace_id": "0123456789ABCDEF0123456789ABCDEF",
      "record_shapes": 1,
      "cuda_driver_version": 13000,
      "cuda_runtime_version": 13000,
      "cupti_version": 130001,
  "displayTimeUnit": "ms",
  "baseTimeNanoseconds": 1790857026000000000,
  "traceEvents": [
"""

FOOTER_TEMPLATE = """  {{
    "name": "process_name", "ph": "M", "ts": {ts}, "pid": 401, "tid": 0,
    "args": {{
      "name": "python3"
    }}
  }},
  {{
    "name": "thread_name", "ph": "M", "ts": {ts}, "pid": 0, "tid": 7,
    "args": {{
      "name": "stream 7 "
    }}
  }},
  {{
    "ph": "X", "cat": "Trace", "ts": {ts}, "dur": {dur},
    "pid": "Spans", "tid": "PyTorch Profiler",
    "name": "PyTorch Profiler (0)",
    "args": {{
      "Op count": 0
    }}
  }},
  {{
    "name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g",
    "pid": "Traces", "tid": "Trace PyTorch Profiler", "ts": {ts}
  }},
  {{
    "name": "Record Window End", "ph": "i", "s": "g",
    "pid": "", "tid": "", "ts": {end}
  }}
  ],
  "traceName": "/tmp/synthetic_trace.json"
}}"""

ELEMENTWISE_ADD = (
    "void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul> >"
    "(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)"
)
GELU = (
    "void at::native::vectorized_elementwise_kernel<8, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)"
    "::{lambda()#2}::operator()() const::{lambda()#4}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul> >(int, "
    "at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{lambda()#2}::operator()() const::{lambda()#4}"
    "::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>)"
)
LAYER_NORM = (
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float, false>(int, float, "
    "c10::BFloat16 const*, c10::BFloat16 const*, c10::BFloat16 const*, float*, float*, c10::BFloat16*)"
)
SDPA = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0"
QKV_GEMM = "nvjet_sm90_tst_16x64_64x16_4x2_h_bz_bias_TNN"
PROJ_GEMM = "nvjet_sm90_tst_64x8_64x16_1x4_h_bz_bias_TNT"
FC1_GEMM = "nvjet_sm90_tst_64x40_64x16_2x4_h_bz_bias_TNT"
FC2_GEMM = "nvjet_sm90_tst_56x64_64x14_2x4_h_bz_bias_TNN"

# (annotation, cpu op, kernel name, launch api, kernel µs, grid, block): one ViT block, in launch order
BLOCK = [
    ("attn", "aten::layer_norm", LAYER_NORM, "cudaLaunchKernel", 2.2, (197, 1, 1), (128, 1, 1)),
    ("attn", "aten::linear", QKV_GEMM, "cuLaunchKernelEx", 9.5, (2, 63, 1), (384, 1, 1)),
    ("attn", "aten::scaled_dot_product_attention", SDPA, "cudaLaunchKernel", 7.1, (2, 3, 1), (384, 1, 1)),
    ("attn", "aten::linear", PROJ_GEMM, "cuLaunchKernelEx", 4.4, (4, 27, 1), (384, 1, 1)),
    ("attn", "aten::add", ELEMENTWISE_ADD, "cudaLaunchKernel", 1.4, (144, 1, 1), (128, 1, 1)),
    ("mlp", "aten::layer_norm", LAYER_NORM, "cudaLaunchKernel", 2.2, (197, 1, 1), (128, 1, 1)),
    ("mlp", "aten::linear", FC1_GEMM, "cuLaunchKernelEx", 12.3, (8, 27, 1), (384, 1, 1)),
    ("mlp", "aten::gelu", GELU, "cudaLaunchKernel", 2.9, (576, 1, 1), (128, 1, 1)),
    ("mlp", "aten::linear", FC2_GEMM, "cuLaunchKernelEx", 11.7, (4, 27, 1), (384, 1, 1)),
    ("mlp", "aten::add", ELEMENTWISE_ADD, "cudaLaunchKernel", 1.4, (144, 1, 1), (128, 1, 1)),
]
BLOCKS_PER_STEP = 12
KERNELS_PER_STEP = len(BLOCK) * BLOCKS_PER_STEP
CBID = {"cudaLaunchKernel": 211, "cuLaunchKernelEx": 652, "cudaMemcpyAsync": 41, "cudaDeviceSynchronize": 165}
PID, TID, STREAM = 401, 401, 7
MEMCPY_NS = 1_400
T0_NS = 4382075239886273


def us(ns: int) -> str:
    """Kineto writes µs with exactly three decimals."""
    return f"{ns // 1000}.{ns % 1000:03d}"


FLOAT_ORIGIN_US = 1e6  # the float spelling's time origin (T0_NS is written as 1000000.0)


def _jitter(ns: int) -> float:
    """Up to ±0.399 ns of float noise (so that the µs print with 10-17 digits), none for one value in 7
    and for T0_NS (whole µs come out as "1000000.0")."""
    return 0.0 if ns % 7 == 0 or ns == T0_NS else ((ns * 2654435761) % 1000003 / 1000003 - 0.5) * 0.798


def float_ts(ns: int) -> str:
    """A timestamp as a tool that shifts times to its own origin and prints floats writes it: µs since
    T0_NS plus 1e6, with sub-ns noise ("1000008.0665311092"); read exactly it rounds to ns - T0_NS + 1e9."""
    return repr((ns - T0_NS + _jitter(ns)) / 1000 + FLOAT_ORIGIN_US)


def float_dur(ns: int) -> str:
    """A duration as printed floats ("8.066531109150288"); read exactly it rounds back to ns."""
    return repr((ns + _jitter(ns)) / 1000)


SPELLINGS = {"kineto": (us, us), "floats": (float_ts, float_dur)}


class KinetoWriter:
    """Emits events in Kineto's text layout; CPU events and GPU activities go to separate buffers, as in Kineto."""

    def __init__(self, cpu_file, gpu_file, spelling: str = "kineto"):
        self.cpu, self.gpu = cpu_file, gpu_file
        self.ts, self.dur = SPELLINGS[spelling]
        self.external_id = 0
        self.ev_idx = 0

    def next_external(self) -> int:
        self.external_id += 1
        return self.external_id

    def annotation(self, name: str, start: int, end: int) -> None:
        self.cpu.write(
            f'  {{\n    "ph": "X", "cat": "user_annotation", "name": "{name}", "pid": {PID}, "tid": {TID},\n'
            f'    "ts": {self.ts(start)}, "dur": {self.dur(end - start)},\n    "args": {{\n'
            f'      "External id": {self.next_external()},"Record function id": 0, "Ev Idx": {self.ev_idx}\n    }}\n  }},\n'
        )
        self.ev_idx += 1

    def cpu_op(self, name: str, start: int, end: int, external: int) -> None:
        self.cpu.write(
            f'  {{\n    "ph": "X", "cat": "cpu_op", "name": "{name}", "pid": {PID}, "tid": {TID},\n'
            f'    "ts": {self.ts(start)}, "dur": {self.dur(end - start)},\n    "args": {{\n'
            f'      "External id": {external},"Record function id": 0, "Concrete Inputs": ["", "", ""], '
            f'"Input type": ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16"], "Input Strides": [[75648, 384, 1], [384, 1], [1]], '
            f'"Input Dims": [[1, 197, 384], [1152, 384], [1152]], "Ev Idx": {self.ev_idx}\n    }}\n  }},\n'
        )
        self.ev_idx += 1

    def api_call(self, cat: str, name: str, start: int, end: int, external: int, correlation: int, flow: bool) -> None:
        text = (
            f'  {{\n    "ph": "X", "cat": "{cat}", "name": "{name}", "pid": {PID}, "tid": {TID},\n'
            f'    "ts": {self.ts(start)}, "dur": {self.dur(end - start)},\n    "args": {{\n'
            f'      "External id": {external},      "cbid": {CBID[name]}, "correlation": {correlation}\n    }}\n  }},\n'
        )
        if flow:
            text += (
                f'  {{\n    "ph": "s", "id": {correlation}, "pid": {PID}, "tid": {TID}, "ts": {self.ts(start)},\n'
                f'    "cat": "ac2g", "name": "ac2g"\n  }},\n'
            )
        self.gpu.write(text)

    def kernel(self, name: str, start: int, end: int, external: int, correlation: int, grid, block) -> None:
        self.gpu.write(
            f'  {{\n    "ph": "X", "cat": "kernel", "name": "{name}", "pid": 0, "tid": {STREAM},\n'
            f'    "ts": {self.ts(start)}, "dur": {self.dur(end - start)},\n    "args": {{\n'
            f'      "External id": {external},      "queued": 0, "device": 0, "context": 1,      "stream": {STREAM}, '
            f'"correlation": {correlation},      "registers per thread": 168,      "shared memory": 164308,      '
            f'"blocks per SM": 0.954545,      "warps per SM": 11.454545,      "grid": [{grid[0]}, {grid[1]}, {grid[2]}],      '
            f'"block": [{block[0]}, {block[1]}, {block[2]}],      "est. achieved occupancy %": 0\n    }}\n  }},\n'
            f'  {{\n    "ph": "f", "id": {correlation}, "pid": 0, "tid": {STREAM}, "ts": {self.ts(start)},\n'
            f'    "cat": "ac2g", "name": "ac2g", "bp": "e"\n  }},\n'
        )

    def memcpy(self, start: int, end: int, external: int, correlation: int) -> None:
        self.gpu.write(
            f'  {{\n    "ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "pid": 0, "tid": {STREAM},\n'
            f'    "ts": {self.ts(start)}, "dur": {self.dur(end - start)},\n    "args": {{\n'
            f'      "External id": {external},      "device": 0, "context": 1,      "stream": {STREAM}, '
            f'"correlation": {correlation},      "bytes": 4, "memory bandwidth (GB/s)": 0.005\n    }}\n  }},\n'
            f'  {{\n    "ph": "f", "id": {correlation}, "pid": 0, "tid": {STREAM}, "ts": {self.ts(start)},\n'
            f'    "cat": "ac2g", "name": "ac2g", "bp": "e"\n  }},\n'
        )


def write_synthetic_kineto(path: Path, n_kernels: int, seed: int = 0, blocks_per_step: int = BLOCKS_PER_STEP,
                           spelling: str = "kineto") -> dict:
    """Write a Kineto trace with exactly ``n_kernels`` kernels (plus one memcpy per step); returns what it wrote.

    ``blocks_per_step``: 12 (a ViT) gives 120 kernels per step; more gives fewer, longer steps.
    ``spelling``: "kineto" (µs with three decimals) or "floats" (``float_ts``/``float_dur``: what a tool
    that re-writes the trace with Python floats prints; the same ns once read exactly, times shifted).
    GPU activities never overlap, so the GPU busy time is the sum of their durations (``busy_ns``)."""
    rng = random.Random(seed)
    path = Path(path)
    gpu_part = path.with_suffix(".gpu.part")
    n_steps = -(-n_kernels // (len(BLOCK) * blocks_per_step))
    correlation = 1000
    cpu_ns, gpu_free_ns = T0_NS, T0_NS
    kernels_written = memcpys = 0
    kernel_time_ns = 0
    with open(path, "w") as cpu_file, open(gpu_part, "w") as gpu_file:
        cpu_file.write(HEADER)
        writer = KinetoWriter(cpu_file, gpu_file, spelling)
        for step in range(n_steps):
            step_start = cpu_ns
            # annotations are written before the ops they enclose (Kineto sorts CPU events by start), so
            # buffer this step's CPU events and write the annotations first
            step_events: list[tuple] = []
            cpu_ns += 10_000
            block_annotations = []
            for block in range(blocks_per_step):
                for part in ("attn", "mlp"):
                    part_start = cpu_ns
                    cpu_ns += 1_000
                    for stage, op, kname, api, kernel_us, grid, block_dims in BLOCK:
                        if stage != part or kernels_written >= n_kernels:
                            continue
                        op_start = cpu_ns
                        launch_start = op_start + rng.randint(1_500, 3_000)
                        launch_end = launch_start + rng.randint(2_500, 5_500)
                        op_end = launch_end + rng.randint(500, 1_500)
                        external = writer.next_external()
                        step_events.append((op, op_start, op_end, external))
                        correlation += 1
                        kernel_start = max(gpu_free_ns, launch_end + rng.randint(1_000, 3_000))
                        kernel_dur = max(600, int(kernel_us * 1000 * rng.uniform(0.85, 1.15)))
                        cat = "cuda_driver" if api.startswith("cu") and not api.startswith("cuda") else "cuda_runtime"
                        writer.api_call(cat, api, launch_start, launch_end, external, correlation, True)
                        writer.kernel(kname, kernel_start, kernel_start + kernel_dur, external, correlation, grid, block_dims)
                        gpu_free_ns = kernel_start + kernel_dur
                        kernel_time_ns += kernel_dur
                        kernels_written += 1
                        cpu_ns = op_end + rng.randint(300, 1_200)
                    block_annotations.append((f"block{block}.{part}", part_start, cpu_ns))
                    cpu_ns += 500
            # the loss.item()-like copy and the synchronisation that ends each step
            correlation += 1
            copy_start = cpu_ns + 2_000
            copy_end = copy_start + 4_000
            copy_external = writer.next_external()
            writer.api_call("cuda_runtime", "cudaMemcpyAsync", copy_start, copy_end, copy_external, correlation, True)
            memcpy_start = max(gpu_free_ns, copy_end + 1_500)
            writer.memcpy(memcpy_start, memcpy_start + MEMCPY_NS, copy_external, correlation)
            gpu_free_ns = memcpy_start + MEMCPY_NS
            memcpys += 1
            correlation += 1
            sync_start = copy_end + 500
            sync_end = max(sync_start + 2_000, gpu_free_ns + 1_000)
            writer.api_call("cuda_runtime", "cudaDeviceSynchronize", sync_start, sync_end, writer.next_external(), correlation, False)
            step_end = sync_end + 3_000
            writer.annotation(f"ProfilerStep#{step + 1}", step_start, step_end + 5_000)
            writer.annotation("step", step_start + 5_000, step_end)
            for name, start, end in block_annotations:
                writer.annotation(name, start, end)
            for op, start, end, external in step_events:
                writer.cpu_op(op, start, end, external)
            cpu_ns = step_end + 12_000
        gpu_file.flush()
    with open(path, "a") as out, open(gpu_part) as gpu_file:
        while chunk := gpu_file.read(1 << 24):
            out.write(chunk)
        ts, dur = SPELLINGS[spelling]
        out.write(FOOTER_TEMPLATE.format(ts=ts(T0_NS), dur=dur(cpu_ns - T0_NS), end=ts(cpu_ns)))
    gpu_part.unlink()
    return {"kernels": kernels_written, "memcpys": memcpys, "steps": n_steps, "kernel_time_ns": kernel_time_ns,
            "busy_ns": kernel_time_ns + memcpys * MEMCPY_NS, "bytes": path.stat().st_size}


def run_measured(command: list[str], env: dict | None = None) -> dict:
    """Run ``command`` in a child process; wall time and the child's peak RSS (ru_maxrss of RUSAGE_CHILDREN)."""
    # RUSAGE_CHILDREN's ru_maxrss is the largest of all waited-for children, so run each command from a
    # fresh Python process of its own to keep the figures separate
    probe = (
        "import resource, subprocess, sys, time, json\n"
        "t = time.perf_counter()\n"
        "p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)\n"
        "wall = time.perf_counter() - t\n"
        "rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
        "print(json.dumps({'rc': p.returncode, 'wall_s': wall, 'peak_rss_mb': rss / 1024, 'stdout': p.stdout, 'stderr': p.stderr[-4000:]}))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe, *command], stdout=subprocess.PIPE, text=True, env=env, check=True)
    return json.loads(done.stdout)


LAYOUTS = ("torch", "compact", "reordered", "gzip", "floats", "floats-compact", "floats-gzip")
# each layout: (the trace it is made from, the conversion); "floats" is written by write_synthetic_kineto(spelling="floats")
LAYOUT_SOURCES = {"torch": ("kineto", "torch"), "compact": ("kineto", "compact"), "reordered": ("kineto", "reordered"),
                  "gzip": ("kineto", "gzip"), "floats": ("floats", "torch"), "floats-compact": ("floats", "compact"),
                  "floats-gzip": ("floats", "gzip")}


def convert_layout(source: Path, target: Path, layout: str) -> None:
    """Rewrite a trace written by ``write_synthetic_kineto`` in another layout; the same events and numbers.

    compact: one line, no spaces; reordered: compact, and every object's keys in reverse order; gzip: the
    original text, gzip level 1; indented: two-space indentation, one key per line (newer torch)."""
    import decimal
    import gzip

    import msgspec

    if layout == "torch":
        if source != target:
            target.write_bytes(source.read_bytes())
        return
    if layout == "gzip":
        with open(source, "rb") as f, gzip.open(target, "wb", compresslevel=1) as g:
            while block := f.read(1 << 24):
                g.write(block)
        return
    decoder = msgspec.json.Decoder(float_hook=decimal.Decimal)  # numbers keep their exact text
    encoder = msgspec.json.Encoder(decimal_format="number")

    def encode(value) -> bytes:
        if layout == "reordered":
            value = _reversed_keys(value)
        text = encoder.encode(value)
        return msgspec.json.format(text, indent=2) if layout == "indented" else text

    text = source.read_bytes()
    marker = b'"traceEvents": [\n'
    events_at = text.index(marker) + len(marker)
    events_end = text.rindex(b"\n  ],\n")
    head = decoder.decode(text[:events_at] + b"]}")
    tail = decoder.decode(b'{"traceEvents": [' + text[events_end + 1:])
    head.update({k: v for k, v in tail.items() if k != "traceEvents"})
    head["traceEvents"] = []
    document = encode(head)
    # the events go where the empty list is
    cut = document.index(b"[]", document.index(b'"traceEvents"'))
    with open(target, "wb") as out:
        out.write(document[:cut + 1])
        separator = b","
        first = True
        for piece in _event_slices(text, events_at, events_end):
            for event in decoder.decode(b"[" + piece + b"]"):
                out.write((b"" if first else separator) + encode(event))
                first = False
        out.write(document[cut + 1:])


def relayable(path: Path) -> bool:
    """Whether ``convert_layout`` can rewrite this trace: plain JSON whose event list opens and closes as
    export_chrome_trace (and ``write_synthetic_kineto``) write it."""
    try:
        with open(path, "rb") as f:
            head = f.read(1 << 20)
            f.seek(max(0, path.stat().st_size - (1 << 20)))
            tail = f.read()
    except OSError:
        return False
    return b'"traceEvents": [\n' in head and b"\n  ],\n" in tail


def _event_slices(text: bytes, start: int, end: int, size: int = 1 << 24):
    """Slices of the event list of a trace in write_synthetic_kineto's layout, cut between events."""
    boundary = b"\n  },\n  {"
    while start < end:
        cut = text.find(boundary, start + size, end) if start + size < end else -1
        if cut < 0:
            yield text[start:end]
            return
        yield text[start:cut + 4]
        start = cut + 6


def _reversed_keys(value):
    if isinstance(value, dict):
        return {k: _reversed_keys(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reversed_keys(v) for v in value]
    return value


PARSER_SCRIPT = """
import sys, time
from pathlib import Path
parser, path = sys.argv[1], Path(sys.argv[2])
t = time.perf_counter()
if parser == "msgspec":
    from perflab.trace.kineto import read_events
    raw, meta = read_events(path)
    n = len(raw.gpu["start_ns"])
else:
    # the same slicing as perflab's reader, each slice decoded into dicts by the candidate
    import perflab.trace.kineto as kineto
    if parser == "orjson":
        import orjson
        loads = orjson.loads
    else:
        import json
        loads = json.loads
    n = 0
    def add(self, events):
        global n
        self.saw_event = self.saw_event or bool(events)
        n += sum(1 for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    class Events:
        @staticmethod
        def decode(text):
            return loads(bytes(text))
    class Tail:
        @staticmethod
        def decode(text):
            class T: pass
            t = T(); d = loads(bytes(text)); t.traceEvents = d["traceEvents"]
            for k in ("deviceProperties", "baseTimeNanoseconds", "cuda_runtime_version", "cuda_driver_version", "distributedInfo"):
                setattr(t, k, d.get(k))
            return t
    kineto._Reader.add = add
    kineto._EVENTS, kineto._TAIL = Events, Tail
    kineto.read_events(path)
print(parser, n, round(time.perf_counter() - t, 2))
"""


def check_exact(summary: dict, written: dict | None) -> str:
    """"exact" when the analysis counts what was written, ns for ns (kernels, kernel time, GPU busy time)."""
    if not summary:
        return "FAILED"
    if written is None or written.get("kernels") is None:
        return "not checked"
    got = (summary["kernels"], round(summary["kernel_time_us"] * 1000), round(summary["gpu_busy_us"] * 1000))
    want = (written["kernels"], written["kernel_time_ns"], written["busy_ns"])
    return "exact" if got == want else f"MISMATCH: got {got}, wrote {want}"


def _without_origin(summary: dict) -> dict:
    """The summary less what depends on the time origin (the floats spelling shifts every timestamp)."""
    summary = dict(summary)
    for key in ("accounting_ns", "step_accounting", "meta"):
        summary.pop(key, None)
    return summary


def measure_layouts(traces: dict[str, Path], written: dict | None, workdir: Path, repeat: int, env: dict,
                    layouts=LAYOUTS, parsers: bool = True, keep: bool = False) -> None:
    """perflab analyze on each layout (median of ``repeat``; identical JSON within a spelling, the same
    counts and busy time across spellings, checked against what was written), then the candidate parsers."""
    outputs, rows = {}, []
    for layout in layouts:
        spelling, conversion = LAYOUT_SOURCES[layout]
        source = traces[spelling]
        path = source if conversion == "torch" else workdir / f"{source.stem}.{conversion}.json{'.gz' if conversion == 'gzip' else ''}"
        if not path.exists():
            t = time.perf_counter()
            convert_layout(source, path, conversion)
            print(f"wrote {path} ({path.stat().st_size / 1e9:.2f} GB) in {time.perf_counter() - t:.0f} s", flush=True)
        command = [sys.executable, "-m", "perflab", "analyze", str(path), "--json"]
        runs = [run_measured(command, env=env) for _ in range(repeat)]
        for run in runs:
            if run["rc"] != 0:
                print(run["stderr"], file=sys.stderr)
        summary = json.loads(runs[0]["stdout"]) if runs[0]["rc"] == 0 else {}
        summary.pop("path", None)
        summary.get("meta", {}).pop("path", None)
        outputs[layout] = summary
        walls = sorted(r["wall_s"] for r in runs)
        exact = check_exact(summary, written)
        rows.append((layout, f"{path.stat().st_size / 1e9:.2f} GB", "perflab analyze (msgspec)", walls[len(walls) // 2],
                     max(r["peak_rss_mb"] for r in runs), exact, " / ".join(f"{w:.2f}" for w in walls)))
        print(f"  {layout}: analyze median {walls[len(walls) // 2]:.2f} s ({rows[-1][6]}), peak RSS {rows[-1][4]:.0f} MB, "
              f"{exact}, load {os.getloadavg()[0]:.2f}", flush=True)
        if parsers:
            script = workdir / "parser_run.py"
            script.write_text(PARSER_SCRIPT)
            for parser in ("msgspec", "orjson", "json"):
                run = run_measured([sys.executable, str(script), parser, str(path)], env=env)
                if run["rc"] != 0:
                    print(f"  {parser}: failed: {run['stderr'].strip().splitlines()[-1:]}", flush=True)
                    continue
                rows.append((layout, rows[-1][1], f"read only: {parser}", run["wall_s"], run["peak_rss_mb"], "", ""))
                print(f"  {layout}: {run['stdout'].strip()} s, peak RSS {run['peak_rss_mb']:.0f} MB", flush=True)
        if path != source and not keep:
            path.unlink()
    for spelling in ("kineto", "floats"):
        family = [layout for layout in layouts if LAYOUT_SOURCES[layout][0] == spelling]
        if family:
            same = all(outputs[layout] == outputs[family[0]] for layout in family)
            print(f"identical analyze --json across the {spelling}-spelled layouts ({', '.join(family)}): {same}")
    if len({json.dumps(_without_origin(summary), sort_keys=True) for summary in outputs.values()}) == 1:
        print("identical analyze --json across all layouts, but for the time origin: True")
    else:
        print("identical analyze --json across all layouts, but for the time origin: False")
    print("\n| layout | size | what | wall s (median) | runs | peak RSS GB | counts, busy |\n|---|---:|---|---:|---|---:|---|")
    for layout, size, what, wall, rss, exact, walls in rows:
        print(f"| {layout} | {size} | {what} | {wall:.2f} | {walls} | {rss / 1024:.2f} | {exact} |")


HTA_SCRIPT = """
import sys, time
from hta.trace_analysis import TraceAnalysis
t = time.perf_counter()
analyzer = TraceAnalysis(trace_files={0: sys.argv[1]}, trace_dir=sys.argv[2])
t_load = time.perf_counter() - t
temporal = analyzer.get_temporal_breakdown(visualize=False)
kernel_types, kernel_metrics = analyzer.get_gpu_kernel_breakdown(visualize=False)
print("load_s", round(t_load, 2), "total_s", round(time.perf_counter() - t, 2))
print(temporal.to_string())
print(kernel_types.to_string())
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", type=int, default=1_000_000)
    parser.add_argument("--blocks-per-step", type=int, default=BLOCKS_PER_STEP,
                        help="10 kernels per block; the default 12 makes 120-kernel steps (8,334 steps for 1M kernels)")
    parser.add_argument("--hta-python", help="a Python interpreter with traceinsight (HTA) installed")
    parser.add_argument("--dir", help="where to write the trace (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the generated trace")
    parser.add_argument("--repeat", type=int, default=3, help="runs of perflab analyze (this machine's timings vary run to run)")
    parser.add_argument("--trace", help="analyse this existing trace instead of writing one (its kernel count is not checked)")
    parser.add_argument("--layouts", action="store_true", help="also measure every layout and the candidate parsers")
    parser.add_argument("--only", help=f"with --layouts: these layouts, comma-separated (of {','.join(LAYOUTS)})")
    parser.add_argument("--no-parsers", action="store_true", help="with --layouts: perflab analyze only, not the candidate parsers")
    args = parser.parse_args()
    def refuse(message: str) -> None:  # bad arguments: one line and exit status 2, before anything is measured
        print(f"analysis_speed.py: error: {message}", file=sys.stderr)
        sys.exit(2)

    only = args.only.split(",") if args.only else []
    unknown = [name for name in only if name not in LAYOUTS]
    if unknown:
        refuse(f"--only: unknown layout {unknown[0]!r}; choose from {', '.join(LAYOUTS)}")
    # The float-spelled layouts are written from a synthetic trace: with --trace X they would measure another trace than X.
    floats = [name for name in only if LAYOUT_SOURCES[name][0] == "floats"]
    if args.trace and args.layouts and floats:
        refuse(f"--trace with --layouts: {floats[0]} is written from a synthetic trace, not from {args.trace}; "
               "choose --only among the Kineto-spelled layouts (torch, compact, reordered, gzip)")
    if args.trace and args.layouts and not relayable(Path(args.trace)):
        refuse(f"--trace with --layouts: {args.trace} is not plain JSON in torch.profiler's layout (the one this script writes "
               "and --keep keeps), which the layouts are rewritten from; give such a trace, or drop --layouts")
    keep_layouts = args.keep

    workdir = Path(args.dir or tempfile.mkdtemp(prefix="perflab-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    if args.trace:
        trace = Path(args.trace)
        written = {"kernels": None, "kernel_time_ns": None}
        args.keep = True
    else:
        trace = workdir / f"synthetic_{args.kernels}_{args.blocks_per_step}.json"
        t = time.perf_counter()
        written = write_synthetic_kineto(trace, args.kernels, blocks_per_step=args.blocks_per_step)
        print(f"wrote {trace}: {written['kernels']} kernels, {written['memcpys']} memcpys, {written['steps']} steps, "
              f"{written['bytes'] / 1e9:.2f} GB in {time.perf_counter() - t:.0f} s", flush=True)

    env = dict(os.environ)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    if not args.layouts:  # (--layouts measures this trace as its "torch" layout)
        command = [sys.executable, "-m", "perflab", "analyze", str(trace), "--json"]
        print("perflab:", " ".join(command), flush=True)
        runs = [run_measured(command, env=env) for _ in range(args.repeat)]
        for run in runs:
            if run["rc"] != 0:
                print(run["stderr"], file=sys.stderr)
            print(f"  rc={run['rc']} wall={run['wall_s']:.2f} s peak RSS={run['peak_rss_mb']:.0f} MB", flush=True)
        walls = sorted(run["wall_s"] for run in runs)
        print(f"perflab analyze: wall min {walls[0]:.2f} s, median {walls[len(walls) // 2]:.2f} s, max {walls[-1]:.2f} s; "
              f"peak RSS max {max(run['peak_rss_mb'] for run in runs):.0f} MB")
        summary = json.loads(runs[0]["stdout"]) if runs[0]["rc"] == 0 else {}
        print(f"  kernels={summary.get('kernels')} (wrote {written['kernels']}), kernel_time_us={summary.get('kernel_time_us')} "
              f"(wrote {written['kernel_time_ns']} ns), verdict: {summary.get('launch', {}).get('message')}")
        if summary and written["kernels"] is not None and (
                summary["kernels"] != written["kernels"] or round(summary["kernel_time_us"] * 1000) != written["kernel_time_ns"]):
            print("MISMATCH: the analysis does not match what was written", file=sys.stderr)

    if args.layouts:
        layouts = args.only.split(",") if args.only else LAYOUTS
        if args.trace:  # X's own layouts only: the float-spelled ones are written from a synthetic trace (refused above with --only)
            layouts = [layout for layout in layouts if LAYOUT_SOURCES[layout][0] != "floats"]
            print(f"--trace: the Kineto-spelled layouts of {args.trace} only ({', '.join(layouts)})", flush=True)
        traces = {"kineto": trace}
        if any(LAYOUT_SOURCES[layout][0] == "floats" for layout in layouts):
            traces["floats"] = workdir / f"synthetic_{args.kernels}_{args.blocks_per_step}.floats.json"
            if not traces["floats"].exists():
                t = time.perf_counter()
                floats = write_synthetic_kineto(traces["floats"], args.kernels, blocks_per_step=args.blocks_per_step, spelling="floats")
                print(f"wrote {traces['floats']} (floats): {floats['bytes'] / 1e9:.2f} GB in {time.perf_counter() - t:.0f} s", flush=True)
        measure_layouts(traces, written if not args.trace else None, workdir, args.repeat, env, layouts=layouts,
                        parsers=not args.no_parsers, keep=keep_layouts)
        if "floats" in traces and not keep_layouts:
            traces["floats"].unlink()

    if args.hta_python:
        script = workdir / "hta_run.py"
        script.write_text(HTA_SCRIPT)
        hta_dir = trace.parent
        hta_command = [args.hta_python, str(script), trace.name, str(hta_dir)]
        print("HTA:", " ".join(hta_command), flush=True)
        hta = run_measured(hta_command)
        tail = (hta["stdout"] + hta["stderr"]).strip().splitlines()[-12:]
        print(f"HTA: rc={hta['rc']} wall={hta['wall_s']:.2f} s peak RSS={hta['peak_rss_mb']:.0f} MB")
        print("\n".join(tail))
    if not args.keep:
        trace.unlink()
        print("deleted the trace (use --keep to keep it)")


if __name__ == "__main__":
    main()
