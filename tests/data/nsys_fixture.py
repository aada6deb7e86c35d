"""Build the small nsys SQLite export used by the tests (schema 3.28.1, as documented for nsys 2026.4).

    python tests/data/nsys_fixture.py            # writes tests/data/nsys_fixture.sqlite

Column names and event codes follow the Nsight Systems SQLite schema reference: tables are created only
where there is data (as nsys does), names are StringIds ids, NVTX push/pop = eventType 59 and start/end
= 60, driver calls sit in CUPTI_ACTIVITY_KIND_RUNTIME with eventClass 1, globalTid = PID << 24 | TID.

What is in it (all times ns; every GPU activity is linked):

process 1001 (thread 1001)
  NVTX push/pop  step [1_000, 20_000] > forward [1_500, 12_000] > attn [2_000, 6_000], mlp [6_500, 11_000]
  NVTX start/end prefetch [12_500, 15_000] (text registered through textId)
  corr 1 cudaLaunchKernel_v7000 [2_100, 2_600] → cutlass GEMM, stream 7        [3_000, 5_000]   attn
  corr 2 cuLaunchKernel (driver) [2_700, 3_100] → triton kernel, stream 7      [5_000, 5_800]   attn
  corr 3 cudaMemcpyAsync_v3020  [6_600, 7_000] → memcpy DtoH, stream 7         [7_200, 7_600]   mlp
  corr 4 cudaMemsetAsync_v3020  [7_100, 7_300] → memset, stream 8              [7_400, 7_500]   mlp
  corr 5 cudaLaunchKernel_v7000 [7_400, 7_900] → elementwise add, stream 8     [8_000, 9_000]   mlp
  corr 6 cudaGraphLaunch_v10000 [12_600, 13_000] → 3 graph kernels, stream 7   [13_500, 15_500] prefetch
  corr 7 cudaStreamSynchronize_v3020 [15_600, 16_000] (launches nothing)
process 2002 (thread 2002): correlation ids 1 and 2 again
  NVTX push/pop  p2_step [100, 30_000]
  corr 1 cudaLaunchKernel_v7000 [500, 900]   → softmax, stream 13   [20_000, 21_000]   p2_step
  corr 2 cudaLaunchKernel_v7000 [1_000, 1_400] → layer norm, stream 13 [21_000, 22_000] p2_step
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

DEFAULT_PATH = Path(__file__).with_name("nsys_fixture.sqlite")

SCHEMA = {
    "StringIds": "id INTEGER PRIMARY KEY, value TEXT NOT NULL",
    "META_DATA_EXPORT": "name TEXT, value TEXT",
    "CUPTI_ACTIVITY_KIND_KERNEL": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, greenContextId INTEGER, "
        "streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, "
        "mangledName INTEGER, launchType INTEGER, cacheConfig INTEGER, registersPerThread INTEGER NOT NULL, gridX INTEGER NOT NULL, "
        "gridY INTEGER NOT NULL, gridZ INTEGER NOT NULL, blockX INTEGER NOT NULL, blockY INTEGER NOT NULL, blockZ INTEGER NOT NULL, "
        "staticSharedMemory INTEGER NOT NULL, dynamicSharedMemory INTEGER NOT NULL, localMemoryPerThread INTEGER NOT NULL, "
        "localMemoryTotal INTEGER NOT NULL, gridId INTEGER NOT NULL, sharedMemoryExecuted INTEGER, graphNodeId INTEGER, "
        "sharedMemoryLimitConfig INTEGER, qmdBulkReleaseDone INTEGER, qmdPreexitDone INTEGER, qmdLastCtaDone INTEGER, graphId INTEGER, "
        "clusterX INTEGER, clusterY INTEGER, clusterZ INTEGER, clusterSchedulingPolicy INTEGER, maxPotentialClusterSize INTEGER, "
        "maxActiveClusters INTEGER, sharedMemoryRequestedPercentage INTEGER, tensorSizeMinusOneElements INTEGER"
    ),
    "CUPTI_ACTIVITY_KIND_RUNTIME": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL, globalTid INTEGER, correlationId INTEGER, "
        "nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL, callchainId INTEGER"
    ),
    "CUPTI_ACTIVITY_KIND_MEMCPY": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, greenContextId INTEGER, "
        "streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, bytes INTEGER NOT NULL, copyKind INTEGER NOT NULL, "
        "deprecatedSrcId INTEGER, srcKind INTEGER, dstKind INTEGER, srcDeviceId INTEGER, srcContextId INTEGER, dstDeviceId INTEGER, "
        "dstContextId INTEGER, migrationCause INTEGER, graphNodeId INTEGER, virtualAddress INTEGER, copyCount INTEGER"
    ),
    "CUPTI_ACTIVITY_KIND_MEMSET": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, greenContextId INTEGER, "
        "streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, value INTEGER NOT NULL, bytes INTEGER NOT NULL, "
        "graphNodeId INTEGER, memKind INTEGER"
    ),
    "NVTX_EVENTS": (
        "start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER, category INTEGER, color INTEGER, text TEXT, "
        "globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER, domainId INTEGER, uint64Value INTEGER, int64Value INTEGER, "
        "doubleValue REAL, uint32Value INTEGER, int32Value INTEGER, floatValue REAL, jsonTextId INTEGER, jsonText TEXT, "
        "binaryData TEXT, eventId INTEGER PRIMARY KEY"
    ),
    "TARGET_INFO_GPU": (
        "vmId INTEGER, id INTEGER, name TEXT, busLocation TEXT, isDiscrete INTEGER, l2CacheSize INTEGER, totalMemory INTEGER, "
        "memoryBandwidth INTEGER, clockRate INTEGER, smCount INTEGER, pwGpuId INTEGER, uuid TEXT, luid INTEGER, chipName TEXT, "
        "cuDevice INTEGER, ctxswDevPath TEXT, ctrlDevPath TEXT, revision INTEGER, nodeMask INTEGER, constantMemory INTEGER, "
        "maxIPC INTEGER, maxRegistersPerBlock INTEGER, maxShmemPerBlock INTEGER, maxShmemPerBlockOptin INTEGER, maxShmemPerSm INTEGER, "
        "maxRegistersPerSm INTEGER, threadsPerWarp INTEGER, asyncEngines INTEGER, maxWarpsPerSm INTEGER, maxBlocksPerSm INTEGER, "
        "maxThreadsPerBlock INTEGER, maxBlockDimX INTEGER, maxBlockDimY INTEGER, maxBlockDimZ INTEGER, maxGridDimX INTEGER, "
        "maxGridDimY INTEGER, maxGridDimZ INTEGER, computeMajor INTEGER, computeMinor INTEGER, smMajor INTEGER, smMinor INTEGER, "
        "numaNodeId INTEGER"
    ),
    "PROCESSES": "globalPid INTEGER, pid INTEGER, name TEXT",
    "ThreadNames": "nameId INTEGER NOT NULL, priority INTEGER, globalTid INTEGER",
}

RUNTIME_CLASS, DRIVER_CLASS = 0, 1
PUSH_POP, START_END = 59, 60
P1, P2 = 1001, 2002


def global_pid(pid: int) -> int:
    return pid << 24


def global_tid(pid: int, tid: int) -> int:
    return (pid << 24) | tid


GEMM = "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8>(cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x2_tn_align8::Params)"
TRITON = "triton_poi_fused_add_gelu_0"
ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)"
NVJET = "nvjet_sm90_tst_64x8_64x16_1x4_h_bz_bias_TNT"
SOFTMAX = "void (anonymous namespace)::softmax_warp_forward<float, float, float, 7, false, false>(float*, float const*, int, int, int, bool const*, int, bool)"
FLASH = "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::bfloat16_t> >(Flash_fwd_params)"
LAYER_NORM = "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float, false>(int, float, float const*, float const*, float const*, float*, float*, float*)"

# (process, correlation, api name, event class, api start, api end)
API_CALLS = [
    (P1, 1, "cudaLaunchKernel_v7000", RUNTIME_CLASS, 2_100, 2_600),
    (P1, 2, "cuLaunchKernel", DRIVER_CLASS, 2_700, 3_100),
    (P1, 3, "cudaMemcpyAsync_v3020", RUNTIME_CLASS, 6_600, 7_000),
    (P1, 4, "cudaMemsetAsync_v3020", RUNTIME_CLASS, 7_100, 7_300),
    (P1, 5, "cudaLaunchKernel_v7000", RUNTIME_CLASS, 7_400, 7_900),
    (P1, 6, "cudaGraphLaunch_v10000", RUNTIME_CLASS, 12_600, 13_000),
    (P1, 7, "cudaStreamSynchronize_v3020", RUNTIME_CLASS, 15_600, 16_000),
    (P2, 1, "cudaLaunchKernel_v7000", RUNTIME_CLASS, 500, 900),
    (P2, 2, "cudaLaunchKernel_v7000", RUNTIME_CLASS, 1_000, 1_400),
]
# (process, correlation, demangled name, short name, stream, start, end, graph node id, grid, block)
KERNELS = [
    (P1, 1, GEMM, "Kernel2", 7, 3_000, 5_000, None, (64, 4, 1), (128, 1, 1)),
    (P1, 2, TRITON, TRITON, 7, 5_000, 5_800, None, (1024, 1, 1), (256, 1, 1)),
    (P1, 5, ADD, "vectorized_elementwise_kernel", 8, 8_000, 9_000, None, (512, 1, 1), (128, 1, 1)),
    (P1, 6, NVJET, NVJET, 7, 13_500, 14_000, 11, (2, 63, 1), (384, 1, 1)),
    (P1, 6, FLASH, "flash_fwd_kernel", 7, 14_000, 14_500, 12, (4, 6, 1), (128, 1, 1)),
    (P1, 6, SOFTMAX, "softmax_warp_forward", 7, 14_600, 15_500, 13, (32, 1, 1), (128, 1, 1)),
    (P2, 1, SOFTMAX, "softmax_warp_forward", 13, 20_000, 21_000, None, (32, 1, 1), (128, 1, 1)),
    (P2, 2, LAYER_NORM, "vectorized_layer_norm_kernel", 13, 21_000, 22_000, None, (197, 1, 1), (128, 1, 1)),
]
# (process, correlation, stream, start, end, copy kind, src kind, dst kind, bytes)
MEMCPYS = [(P1, 3, 7, 7_200, 7_600, 2, 2, 1, 4096)]  # DtoH, Device -> Pinned
# (process, correlation, stream, start, end, mem kind, bytes)
MEMSETS = [(P1, 4, 8, 7_400, 7_500, 2, 1024)]
# (process, event type, text, registered text, start, end)
NVTX_RANGES = [
    (P1, PUSH_POP, "step", None, 1_000, 20_000),
    (P1, PUSH_POP, "forward", None, 1_500, 12_000),
    (P1, PUSH_POP, "attn", None, 2_000, 6_000),
    (P1, PUSH_POP, "mlp", None, 6_500, 11_000),
    (P1, START_END, None, "prefetch", 12_500, 15_000),
    (P2, PUSH_POP, "p2_step", None, 100, 30_000),
]


def build(path: Path = DEFAULT_PATH, *, driver_table: bool = False, minimal: bool = False) -> Path:
    """Write the fixture. ``driver_table``: move the driver call into a CUPTI_ACTIVITY_KIND_DRIVER table
    (as older exports have it). ``minimal``: only StringIds, KERNEL and RUNTIME (no MEMCPY, MEMSET, NVTX,
    TARGET_INFO_GPU: tables nsys did not need to create)."""
    path = Path(path)
    if path.exists():
        path.unlink()
    strings: dict[str, int] = {}

    def sid(text: str) -> int:
        return strings.setdefault(text, len(strings) + 1)

    db = sqlite3.connect(path)
    tables = ["StringIds", "META_DATA_EXPORT", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME"]
    if not minimal:
        tables += ["CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET", "NVTX_EVENTS", "TARGET_INFO_GPU", "PROCESSES", "ThreadNames"]
    for table in tables:
        db.execute(f"CREATE TABLE {table} ({SCHEMA[table]})")
    if driver_table:
        db.execute(f"CREATE TABLE CUPTI_ACTIVITY_KIND_DRIVER ({SCHEMA['CUPTI_ACTIVITY_KIND_RUNTIME']})")
    db.executemany("INSERT INTO META_DATA_EXPORT VALUES (?, ?)", [("EXPORT_SCHEMA_VERSION", "3.28.1"), ("EXPORT_PROGRAM_NAME", "perflab fixture")])

    for pid, corr, name, event_class, start, end in API_CALLS:
        table = "CUPTI_ACTIVITY_KIND_DRIVER" if driver_table and event_class == DRIVER_CLASS else "CUPTI_ACTIVITY_KIND_RUNTIME"
        db.execute(f"INSERT INTO {table} VALUES (?, ?, ?, ?, ?, ?, ?, ?)", (start, end, event_class, global_tid(pid, pid), corr, sid(name), 0, None))
    for pid, corr, demangled, short, stream, start, end, node, grid, block in KERNELS:
        graph_id = 1 if node is not None else None
        row = (start, end, 0, 1, None, stream, corr, global_pid(pid), sid(demangled), sid(short), None, 0, 0, 32, *grid, *block,
               0, 0, 0, 0, 1, 0, node, 0, 0, 0, 0, graph_id, 0, 0, 0, 0, 0, 0, 0, 0)
        db.execute(f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES ({', '.join('?' * len(row))})", row)
    if not minimal:
        for pid, corr, stream, start, end, copy_kind, src, dst, size in MEMCPYS:
            row = (start, end, 0, 1, None, stream, corr, global_pid(pid), size, copy_kind, None, src, dst, 0, 1, 0, 1, 0, None, 0, 1)
            db.execute(f"INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES ({', '.join('?' * len(row))})", row)
        for pid, corr, stream, start, end, mem_kind, size in MEMSETS:
            db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (start, end, 0, 1, None, stream, corr, global_pid(pid), 0, size, None, mem_kind))
        for event_id, (pid, event_type, text, registered, start, end) in enumerate(NVTX_RANGES, start=1):
            text_id = sid(registered) if registered else None
            row = (start, end, event_type, None, None, None, text, global_tid(pid, pid), global_tid(pid, pid) if event_type == START_END else None,
                   text_id, 0, None, None, None, None, None, None, None, None, None, event_id)
            db.execute(f"INSERT INTO NVTX_EVENTS VALUES ({', '.join('?' * len(row))})", row)
        gpu = dict(vmId=0, id=0, name="NVIDIA H200", busLocation="0000:18:00.0", isDiscrete=1, l2CacheSize=62914560,
                   totalMemory=150109880320, memoryBandwidth=4800000000000, clockRate=1980000000, smCount=132, computeMajor=9, computeMinor=0)
        columns = [c.split()[0] for c in SCHEMA["TARGET_INFO_GPU"].split(", ")]
        db.execute(f"INSERT INTO TARGET_INFO_GPU VALUES ({', '.join('?' * len(columns))})", [gpu.get(c) for c in columns])
        for pid in (P1, P2):
            db.execute("INSERT INTO PROCESSES VALUES (?, ?, ?)", (global_pid(pid), pid, "python3"))
            db.execute("INSERT INTO ThreadNames VALUES (?, ?, ?)", (sid("python3"), 0, global_tid(pid, pid)))
    db.executemany("INSERT INTO StringIds VALUES (?, ?)", [(i, s) for s, i in strings.items()])
    db.commit()
    db.close()
    return path


if __name__ == "__main__":
    print(build(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_PATH))
