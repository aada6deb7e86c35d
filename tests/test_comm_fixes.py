"""The communication fixes' predictions (analysis.comm_fixes) against hand arithmetic on a synthetic step."""

import pytest

from perflab.analysis.comm_fixes import CommStep, ParallelFix, collectives_ms, predict_comm_fix

MIB = 2**20
# busbw 50 GB/s at 1 MiB (20 us), 100 at 4 MiB (35 us: latency 15 us at 0 bytes), 200 at 64 MiB
SWEEP = {"sizes": [{"bytes": MIB, "time_us": 20.0, "busbw_gbps": 50.0}, {"bytes": 4 * MIB, "time_us": 35.0, "busbw_gbps": 100.0},
                   {"bytes": 64 * MIB, "time_us": 335.5, "busbw_gbps": 200.0}]}
DDP = dict(mode="ddp", options={"bucket_cap_mb": 25.0, "grad_view": False, "no_sync": 1}, world_size=2, step_ms=100.0, exposed_ms=5.0,
           optimizer_ms=8.0, grad_bytes=100 * MIB, param_bytes=100 * MIB, sweep=SWEEP, latency_us=15.0, ready_sizes=(10 * MIB,) * 10,
           units=5, copy_gbps=1000.0)


def ddp(**options):
    return "ddp", dict(DDP["options"], **options)


def test_bucket_size_changes_the_calls_latency_and_the_last_bucket():
    step = CommStep(**DDP)  # 10 MiB gradients at a 25 MiB cap: buckets of 30, 30, 30 and 10 MiB; T = C 95 + E 5
    assert step.compute_ms == 95.0
    p = predict_comm_fix(step, *ddp(bucket_cap_mb=100.0))  # one 100 MiB bucket
    # (1 - 4) x 15 us + (100 MiB at 200 GB/s - 10 MiB at 100 GB/s, busbw at the nearest swept size) x 2(2-1)/2
    delta = -3 * 0.015 + (100 * MIB / 200e9 - 10 * MIB / 100e9) * 1e3
    assert delta == pytest.approx(0.3744304)
    assert p.exposed_ms == pytest.approx(5 + delta) and p.compute_ms == 95.0 and p.ms == pytest.approx(100 + delta)
    small = predict_comm_fix(step, *ddp(bucket_cap_mb=5.0))  # every 10 MiB gradient its own bucket: 10 calls, the same last bucket
    assert small.ms == pytest.approx(100 + 6 * 0.015)
    assert "(10 − 4) × 15.0 µs" in small.model


def test_a_prediction_anchored_at_the_base_timed_beside_the_fix():
    step = CommStep(**dict(DDP, glue_ms=6.0)).anchored(200.0)  # the base ran twice as slow in the fix's launch: its shares kept
    assert (step.step_ms, step.exposed_ms, step.compute_ms, step.optimizer_ms, step.glue_ms) == (200.0, 10.0, 190.0, 16.0, 12.0)
    assert predict_comm_fix(step, *ddp(no_sync=2)).ms == pytest.approx(10 + 16 + 2 * (200 - 26))


def test_grad_view_removes_two_copies_of_the_gradients():
    p = predict_comm_fix(CommStep(**DDP), *ddp(grad_view=True))
    # into the buckets and back: 2 copies x (read + write) x 100 MiB at 1000 GB/s = 0.4194304 ms of compute
    assert p.ms == pytest.approx(100 - 4 * 100 * MIB / 1e12 * 1e3) == pytest.approx(99.5805696)
    assert p.exposed_ms == 5.0


def test_no_sync_all_reduces_once_per_k_micro_batches():
    p = predict_comm_fix(CommStep(**DDP), *ddp(no_sync=4))
    # 3 micro-batches of compute without the optimizer (100 - 5 - 8 = 87 ms each), then the full step
    assert p.ms == pytest.approx(100 + 3 * 87) == 361.0
    assert p.exposed_ms == 5.0  # once per step: 5/4 per micro-batch
    base4 = CommStep(**dict(DDP, options={"bucket_cap_mb": 25.0, "grad_view": False, "no_sync": 4}, step_ms=361.0))
    assert predict_comm_fix(base4, *ddp(no_sync=2)).ms == pytest.approx(5 + 8 + 2 * (361 - 13) / 4)  # back from 4 to 2


def test_fsdp_against_ddp_scales_the_exposed_time_by_the_collectives_time():
    step = CommStep(**DDP)
    # DDP: 100 MiB bus bytes (2 ranks: 1 x G), 4 calls, mean message 25 MiB -> 200 GB/s: 0.524288 + 4 x 0.015 ms
    m_ddp = 100 * MIB / 200e9 * 1e3 + 4 * 0.015
    # FSDP with resharding, 5 units: (2 x P + G) / 2 = 150 MiB, 3 x 5 calls, message P/5 = 20 MiB -> 200 GB/s
    m_fsdp = 150 * MIB / 200e9 * 1e3 + 15 * 0.015
    assert collectives_ms(step, "ddp", step.options)[0] == pytest.approx(m_ddp) == pytest.approx(0.584288)
    assert collectives_ms(step, "fsdp", {"reshard": True})[0] == pytest.approx(m_fsdp) == pytest.approx(1.011432)
    p = predict_comm_fix(step, "fsdp", {"reshard": True})
    # the same share exposed: E x M'/M; the optimizer on a half shard: -8 x 1/2
    assert p.exposed_ms == pytest.approx(5 * m_fsdp / m_ddp) == pytest.approx(8.655252, rel=1e-6)
    assert p.compute_ms == 91.0 and p.ms == pytest.approx(91 + 5 * m_fsdp / m_ddp)
    # FSDP without resharding from FSDP with it: one all-gather less (P/2 fewer bus bytes, 5 fewer calls), optimizer unchanged
    fsdp = CommStep(**dict(DDP, mode="fsdp", options={"reshard": True}))
    m_keep = 100 * MIB / 200e9 * 1e3 + 10 * 0.015
    assert predict_comm_fix(fsdp, "fsdp", {"reshard": False}).ms == pytest.approx(95 + 5 * m_keep / m_fsdp)
    # and back to DDP: the optimizer updates every parameter again, + 8 x (2 - 1)
    assert predict_comm_fix(fsdp, *ddp()).ms == pytest.approx(95 + 8 + 5 * m_ddp / m_fsdp)


def test_compile_fuses_the_glue_and_what_cannot_be_predicted_says_why():
    assert predict_comm_fix(CommStep(**dict(DDP, glue_ms=6.0)), None, None, compile_mode=True).ms == 97.0
    assert predict_comm_fix(CommStep(**DDP), None, None, compile_mode=True).ms is None  # no GPU kernels on the CPU
    assert "combination" in predict_comm_fix(CommStep(**DDP), *ddp(grad_view=True, no_sync=2)).model
    assert predict_comm_fix(CommStep(**dict(DDP, exposed_ms=None)), *ddp(no_sync=2)).ms is None
    assert predict_comm_fix(CommStep(**dict(DDP, sweep=None)), *ddp(bucket_cap_mb=100.0)).ms is None


def test_a_fix_error_its_missed_term_and_its_throughput():
    p = predict_comm_fix(CommStep(**DDP), *ddp(bucket_cap_mb=5.0))  # 100.09: C 95, E 5.09
    base = {"status": "ok", "median_ms": 100.0, "items_per_s": 640.0}
    fix = ParallelFix("ddp:bucket_cap_mb=5", "ddp:bucket_cap_mb=5", "eager", p, {"status": "ok", "median_ms": 120.0, "items_per_s": 533.0},
                      measured_exposed_ms=20.0, base_row=base)
    assert fix.error == pytest.approx(100.09 / 120 - 1)
    # compute 95 against 120 - 20 = 100 (5 ms off); exposed 5.09 against 20 (14.91 off): the exposed time missed
    assert fix.missed_term == "exposed communication: predicted 5.090, measured 20.000 ms"
    assert fix.throughput_gain == pytest.approx(533 / 640)
    d = fix.to_dict()
    assert d["measured_compute_ms"] == 100.0 and d["predicted_ms"] == pytest.approx(100.09) and d["missed_term"] == fix.missed_term
    close = ParallelFix("x", "ddp", "eager", p, {"status": "ok", "median_ms": 101.0}, measured_exposed_ms=20.0)
    assert close.missed_term is None  # within 15%
    assert list(d)[3:6] == ["predicted_ms", "predicted_compute_ms", "predicted_exposed_ms"] and d["model"] == p.model
    failed = ParallelFix("x", "ddp", "eager", p, {"status": "error"})
    unpredicted = ParallelFix("x", "ddp", "eager", predict_comm_fix(CommStep(**DDP), None, None, compile_mode=True), {"status": "ok", "median_ms": 99.0})
    assert failed.error is None and unpredicted.error is None  # nothing measured, nothing predicted: no error to state
