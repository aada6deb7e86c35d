"""Issue 39: which kernels max-autotune chose, recorded per process, and the statement where they (or the times) vary."""

import pytest

from perflab.measure.checks import autotune_check
from perflab.report.markdown import autotune_section
from perflab.runtime.modes import record_autotune


class Choice:
    """What inductor's select_algorithm hands its feedback savers as a candidate (a ChoiceCaller's name, description)."""

    def __init__(self, name, description=""):
        self.name, self.description = name, description


class Node:
    def __init__(self, *size):
        self.size = size

    def get_size(self):
        return list(self.size)


def _inductor_feedback(timings, name, nodes):
    """What inductor does after benchmarking one op's candidates: call every registered feedback saver."""
    from torch._inductor import select_algorithm

    for fn in select_algorithm.get_algorithm_selector_cache().feedback_saver_fns if hasattr(select_algorithm, "get_algorithm_selector_cache") \
            else select_algorithm._ALGORITHM_SELECTOR_CACHE.feedback_saver_fns:
        fn(timings, name, nodes, list(timings), lambda: {}, {})


def test_the_kernels_autotuning_kept_are_recorded_per_op_and_shape():
    cublas, template, slow = Choice("mm"), Choice("triton_mm_17", "BLOCK_M=16, BLOCK_N=64, num_warps=4"), Choice("triton_mm_3", "BLOCK_M=64")
    with record_autotune("compile:reduce-overhead") as record:
        assert record is None  # no autotuning in this mode
    with record_autotune("compile:max-autotune") as record:
        _inductor_feedback({cublas: 0.0102, template: 0.0100, slow: float("inf")}, "mm", [Node(1, 4096), Node(4096, 14336)])
        _inductor_feedback({cublas: 0.0102, template: 0.0100, slow: float("inf")}, "mm", [Node(1, 4096), Node(4096, 14336)])
        _inductor_feedback({cublas: 0.020, template: 0.031}, "mm", [Node(1, 14336), Node(14336, 4096)])
    _inductor_feedback({cublas: 1.0}, "mm", [Node(2, 2)])  # after the case: not its record's
    result = record.result()
    assert [(o["op"], o["shapes"], o["calls"], o["candidates"], o["chosen"]) for o in result["ops"]] == [
        ("mm", [[1, 4096], [4096, 14336]], 2, 3, "triton_mm (BLOCK_M=16, BLOCK_N=64, num_warps=4)"),
        ("mm", [[1, 14336], [14336, 4096]], 1, 2, "mm")]
    assert result["ops"][0]["runner_up"] == "mm" and result["ops"][0]["margin"] == pytest.approx(0.02)
    assert result["closest_margin"] == pytest.approx(0.02) and len(result["signature"]) == 12
    with record_autotune("compile:max-autotune") as again:  # another process, the same kernels under other counters
        _inductor_feedback({Choice("mm"): 0.0101, Choice("triton_mm_2", "BLOCK_M=16, BLOCK_N=64, num_warps=4"): 0.0099}, "mm",
                           [Node(1, 4096), Node(4096, 14336)])
        _inductor_feedback({Choice("mm"): 0.020, Choice("triton_mm_9", "BLOCK_M=16, BLOCK_N=64, num_warps=4"): 0.03}, "mm",
                           [Node(1, 14336), Node(14336, 4096)])
    assert again.result()["signature"] == result["signature"]
    with record_autotune("compile:max-autotune") as flipped:  # the close call went the other way
        _inductor_feedback({cublas: 0.0100, template: 0.0101}, "mm", [Node(1, 4096), Node(4096, 14336)])
        _inductor_feedback({cublas: 0.020, template: 0.031}, "mm", [Node(1, 14336), Node(14336, 4096)])
    assert flipped.result()["signature"] != result["signature"]


def test_varying_choices_or_times_across_processes_are_stated():
    a, b = {"signature": "aaaaaaaaaaaa"}, {"signature": "bbbbbbbbbbbb"}
    varies = autotune_check("compile:max-autotune", [a, b, a], [5.733, 7.724, 6.076])
    assert varies.flag == "max_autotune_varies"
    assert varies.message == ("compile:max-autotune's kernel choice varies: 2 different choices of kernels in 3 processes (medians "
                              "5.733–7.724 ms, 34.7% apart); one process's time is not what the next would see")
    same = autotune_check("compile:max-autotune", [a, a, a], [6.0, 6.1, 6.3])
    assert same.message.endswith("(medians 6.000–6.300 ms, 5.0% apart, over 3%); with the same kernels chosen in each, so not autotuning's choice")
    assert autotune_check("compile:max-autotune", [a, a, a], [6.0, 6.1, 6.15]) is None  # 2.5%: within
    assert autotune_check("compile:reduce-overhead", [a, b], [6.0, 8.0]) is None  # no autotuning to blame
    cached = autotune_check("compile:max-autotune-gemm", [a, {"note": "cached"}], [6.0, 6.5])
    assert cached.message.endswith("1 process(es) took a compiled graph from inductor's FX graph cache (the kernels of the compile "
                                   "that filled it), not recorded here")


def test_the_report_says_when_the_choice_varies():
    case = {"model": "llama3_8b", "mode": "compile:max-autotune", "batch_size": 1, "workload": "decode", "context_len": 512}
    row = {"case_id": "c1", "case": case, "status": "ok", "model": "llama3_8b", "mode": "compile:max-autotune", "median_ms": 6.0,
           "process_medians_ms": [5.733, 7.724, 6.076], "label": "llama3_8b decode bs1 ctx512 bf16 compile:max-autotune",
           "autotune_processes": [{"signature": "aaaaaaaaaaaa", "closest_margin": 0.004}, {"signature": "bbbbbbbbbbbb"},
                                  {"signature": "aaaaaaaaaaaa"}]}
    text = "\n\n".join(autotune_section([row, dict(row, case_id="c2", mode="eager", case=dict(case, mode="eager"), autotune_processes=None)]))
    assert "| 3 | 5.733 / 7.724 / 6.076 | aaaaaaaaaaaa, bbbbbbbbbbbb, aaaaaaaaaaaa | 0.4% | varies |" in text
    assert "compile:max-autotune's kernel choice varies: 2 different choices of kernels in 3 processes" in text
    assert text.count("| varies |") == 1  # the eager row carries no record


def test_inductor_cache_points_this_process_and_its_children_at_one_directory(tmp_path, monkeypatch):
    from cli_util import assert_one_line_error, run_cli_here
    from perflab.paths import use_inductor_cache

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)  # restored after the test
    assert use_inductor_cache(tmp_path / "cache") == (tmp_path / "cache").resolve()
    import os

    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str((tmp_path / "cache").resolve()) and (tmp_path / "cache").is_dir()
    (tmp_path / "file").write_text("")
    r = run_cli_here("bench", "--model", "test:tiny", "--device", "cpu", "--inductor-cache", tmp_path / "file")
    assert_one_line_error(r, f"{tmp_path / 'file'}: exists and is not a directory; give --inductor-cache a directory")
