"""Hostile files thrown at every reader of a file the user names: one line naming the file (and where), exit 2, never a
traceback or a hang.

A new reader joins the lists here when it is added: ``test_every_yaml_reader_goes_through_read_yaml`` fails for a module
that loads YAML by another route.
"""

import re
import time
from pathlib import Path

import pytest

from cli_util import run_cli_here
from perflab import api
from perflab.errors import PerflabError
from perflab.report import seeds
from perflab.sweep.spec import read_experiment, read_spec
from perflab.yaml_files import read_yaml

SRC = Path(__file__).resolve().parents[1] / "src" / "perflab"


def _alias_bomb(levels: int = 9) -> str:
    """A list whose last item is 9**levels strings once every alias is expanded (600 bytes of text)."""
    items = ['&l0 [' + ",".join(['"x"'] * 9) + ']']
    items += [f'&l{i} [' + ",".join([f"*l{i - 1}"] * 9) + ']' for i in range(1, levels)]
    return "[" + ", ".join(items) + "]"


# What PyYAML itself raises, one file each, and the exact line each reader gives for it (FILE stands for the path).
HOSTILE_YAML = [
    pytest.param("name: x\x00\ngrid: {model: [deit_tiny_patch16_224]}\n",
                 "FILE: YAML error at line 1, column 8: a control character (U+0000) that YAML does not allow", id="ReaderError-nul"),
    pytest.param("grid:\n  model: [deit_tiny_patch16_224]\n\x1b[31m: 1\n",
                 "FILE: YAML error at line 3, column 1: a control character (U+001B) that YAML does not allow", id="ReaderError-escape"),
    pytest.param("grid:\n  model: [deit_tiny_patch16_224]\n batch_size: [1]\n",
                 "FILE: YAML syntax error at line 3, column 2: expected <block end>, but found '<block mapping start>'",
                 id="ParserError-indentation"),
    pytest.param('grid:\n  model: "deit_tiny_patch16_224\n',
                 "FILE: YAML syntax error at line 3, column 1: found unexpected end of stream", id="ScannerError-unclosed-quote"),
    pytest.param("grid:\n  model: [deit_tiny_patch16_224\n",
                 "FILE: YAML syntax error at line 3, column 1: expected ',' or ']', but got '<stream end>'", id="ParserError-unclosed-list"),
    pytest.param("grid: {model: *nowhere}\n", "FILE: YAML syntax error at line 1, column 15: found undefined alias 'nowhere'",
                 id="ComposerError-undefined-alias"),
    pytest.param("--- {grid: {model: [a]}}\n--- {grid: {model: [b]}}\n",
                 "FILE: YAML syntax error at line 2, column 1: but found another document", id="ComposerError-two-documents"),
    pytest.param("grid: " + "[" * 100_000 + "]" * 100_000 + "\n",
                 "FILE: YAML syntax error at line 1, column 70: nested more than 64 deep", id="ComposerError-nested-100000-deep"),
    pytest.param("grid:\n" + "".join("  " * i + "k:\n" for i in range(1, 3000)),
                 "FILE: YAML syntax error at line 64, column 127: nested more than 64 deep", id="ComposerError-block-nested-3000-deep"),
    pytest.param("grid: !!python/object/apply:os.system [echo hi]\n",
                 "FILE: YAML syntax error at line 1, column 7: could not determine a constructor for the tag "
                 "'tag:yaml.org,2002:python/object/apply:os.system'", id="ConstructorError-python-tag"),
]


def _spec_readers():
    return {
        "read_spec": read_spec,
        "read_experiment": read_experiment,
        "ab/track --spec": lambda path: api.version_experiment(spec=path),
        "read_yaml": read_yaml,
    }


@pytest.mark.parametrize("reader", list(_spec_readers()))
@pytest.mark.parametrize("text,message", HOSTILE_YAML)
def test_every_spec_reader_gives_one_line_for_what_yaml_raises(tmp_path, reader, text, message):
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    with pytest.raises(PerflabError) as exc:
        _spec_readers()[reader](path)
    assert str(exc.value) == message.replace("FILE", str(path))


@pytest.mark.parametrize("text,message", HOSTILE_YAML)
def test_the_figures_file_reader_gives_one_line_for_what_yaml_raises(tmp_path, monkeypatch, text, message):
    path = tmp_path / "figures.yaml"
    path.write_text(text)
    monkeypatch.setattr(seeds, "PATH", path)
    seeds.figures.cache_clear()
    try:
        with pytest.raises(PerflabError) as exc:
            seeds.figures()
    finally:
        seeds.figures.cache_clear()
    assert str(exc.value) == message.replace("FILE", str(path))


@pytest.mark.parametrize("text,message", HOSTILE_YAML)
def test_sweep_list_of_a_hostile_spec_is_one_line_and_exit_2(tmp_path, text, message):
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    result = run_cli_here("sweep", path, "--list")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == "perflab: error: " + message.replace("FILE", str(path)) and result.stdout == ""


@pytest.mark.parametrize("place,message", [
    ("grid: {model: BOMB}", "FILE: grid.model: expected a list of model names, got "),
    ("description: BOMB\ngrid: {model: [deit_tiny_patch16_224]}", "FILE: description: expected a string, got "),
    ("cases:\n  - {model: deit_tiny_patch16_224, keep_rate: BOMB}", "FILE: cases[0].keep_rate: expected a number or a list of numbers, got "),
])
def test_an_alias_bomb_is_refused_in_one_line_without_being_expanded(tmp_path, place, message):
    path = tmp_path / "bomb.yaml"
    path.write_text(place.replace("BOMB", _alias_bomb()) + "\n")  # 9**9 = 387 million strings expanded
    started = time.perf_counter()
    with pytest.raises(PerflabError) as exc:
        read_experiment(path)
    assert time.perf_counter() - started < 5
    assert str(exc.value).startswith(message.replace("FILE", str(path)))
    assert "\n" not in str(exc.value) and len(str(exc.value)) < 400


def test_a_binary_spec_is_one_line(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_bytes(b"\xff\xfe\x00grid")
    with pytest.raises(PerflabError) as exc:
        read_spec(path)
    assert str(exc.value) == f"{path}: not a text file (a spec file is UTF-8 YAML)"


# Calls that read YAML text; each module that makes one must do it inside perflab.yaml_files.read_yaml (and the loader
# it builds), which the tests above hold to one line for everything PyYAML raises.
_YAML_LOAD = re.compile(r"\byaml\.(safe_load|load|full_load|unsafe_load|load_all|safe_load_all|compose|compose_all|parse|scan|"
                        r"SafeLoader|Loader|FullLoader|UnsafeLoader|BaseLoader|CLoader|CSafeLoader)\b")


def test_every_yaml_reader_goes_through_read_yaml():
    uses = {}
    for path in SRC.rglob("*.py"):
        function = None
        for line in path.read_text().splitlines():
            if line.startswith(("def ", "class ")):
                function = re.match(r"(?:def|class) (\w+)", line).group(1)
            code = line.split("#")[0]
            if (_YAML_LOAD.search(code) and "``yaml." not in code) or "_bounded_loader()" in code or re.match(r"\s*from yaml\b", code):
                uses.setdefault(str(path.relative_to(SRC)), set()).add(function)
    assert uses == {"yaml_files.py": {"read_yaml", "_bounded_loader"}}  # the loader is built there, and used by read_yaml alone


# ---------------------------------------------------------------------------------------------------
# compare's readers: bench --out files (JSON lines, CSV) and stores


def _row(case_id="c1", median=2.0, **extra) -> dict:
    return dict({"case_id": case_id, "status": "ok", "model": "m", "input_size": 32, "batch_size": 1, "dtype": "fp32",
                 "mode": "eager", "median_ms": median, "ci95_ms": [median * 0.99, median * 1.01]}, **extra)


def _lines(*rows) -> str:
    import json

    return "".join(json.dumps(row) + "\n" for row in rows)


TIMES = "a number from 1e-09 to 1e+10"
VERSION_WORDS = "a mapping whose key and session are text on one line, without control characters"


def _raw_jsonl(extra: str, message: str, id: str):
    """A JSON line of an ok row of c1 with ``extra`` after its median: raw text, for what ``json.dumps`` will not write."""
    return pytest.param("b.jsonl", '{"case_id": "c1", "status": "ok", "median_ms": 2.0, ' + extra + "}\n", message, id=id)


def _csv(columns: str, row: str, message: str, id: str):
    """A CSV file of one row under the header ``case_id,status,median_ms`` and ``columns``."""
    return pytest.param("b.csv", f"case_id,status,median_ms{columns}\n{row}\n", message, id=id)


# (file name, its text, the line compare gives for it as B, with FILE for its path)
HOSTILE_RESULTS = [
    pytest.param("b.jsonl", _lines(_row(median=-1.0, ci95_ms=[-1.01, -0.99])),
                 f"FILE, line 1: median_ms: -1.0: expected a time in ms, {TIMES}", id="negative-median"),
    pytest.param("b.jsonl", '{"case_id": "c1", "status": "ok", "median_ms": NaN, "ci95_ms": [1.0, 2.0]}\n',
                 f"FILE, line 1: median_ms: nan: expected a time in ms, {TIMES}", id="nan-median"),
    _raw_jsonl('"ci95_ms": [1.0, Infinity]',
               f"FILE, line 1: ci95_ms[1]: inf: expected [low, high] in ms, each {TIMES}", id="infinite-ci"),
    pytest.param("b.jsonl", '{"case_id": "c1", "status": "ok", "median_ms": 1e999}\n',
                 f"FILE, line 1: median_ms: inf: expected a time in ms, {TIMES}", id="overflowing-median"),
    pytest.param("b.jsonl", _lines(_row(median=1e308, ci95_ms=[0.99e308, 1e308])),
                 f"FILE, line 1: median_ms: 1e+308: expected a time in ms, {TIMES}", id="huge-median"),
    _raw_jsonl('"gpu_busy_frac": -Infinity',
               "FILE, line 1: holds -Infinity, which JSON does not allow (a result row's numbers are finite)", id="infinity-elsewhere"),
    pytest.param("b.jsonl", _lines(_row(ci95_ms=[3.0, 1.0])),
                 "FILE, line 1: ci95_ms: [3.0, 1.0]: expected [low, high], low at most high", id="ci-low-above-high"),
    pytest.param("b.jsonl", _lines(_row(process_flags=5, process_medians_ms=[2.0, 2.1], version={"session": "s"})),
                 "FILE, line 1: process_flags: 5: expected a list of each process's flags (a list of flag names, or null)",
                 id="process-flags-5"),
    pytest.param("b.jsonl", _lines(_row(samples_ms=["1.9", "2.1"], sample_rounds=[0, 1], session="s")),
                 f"FILE, line 1: samples_ms[0]: '1.9': expected a list of times in ms, each {TIMES}", id="samples-as-strings"),
    pytest.param("b.jsonl", _lines(_row(samples_ms=[2.0, 0.0], sample_rounds=[0, 1], session="s")),
                 f"FILE, line 1: samples_ms[1]: 0.0: expected a list of times in ms, each {TIMES}", id="zero-sample"),
    pytest.param("b.jsonl", _lines(_row(version=5)), f"FILE, line 1: version: 5: expected {VERSION_WORDS}",
                 id="version-5"),
    pytest.param("b.jsonl", _lines(_row(batch_size=0)), "FILE, line 1: batch_size: 0: expected a whole number, 1 or more",
                 id="batch-size-0"),
    pytest.param("b.jsonl", '{"case_id": "c1", "x": ' + "[" * 100_000 + "]" * 100_000 + "}\n",
                 "FILE, line 1: JSON nested 100001 deep; a result row nests at most 32 deep", id="json-nested-100000-deep"),
    _csv(",message", "c1,ok,2.0," + "x" * (128 * 1024 + 1),
         "FILE, line 2: a cell longer than 128 KiB; expected the rows bench --out writes", id="csv-cell-over-128-KiB"),
    _raw_jsonl('"model": "m\\u001b[31m\\ud800"',
               "FILE, line 1: model: 'm\\x1b[31m\\ud800': expected text on one line, without control characters",
               id="terminal-escape-and-lone-surrogate"),
    _raw_jsonl('"version": {"\\ud800": 1}',
               f'FILE, line 1: version: {{"\\ud800": 1}}: expected {VERSION_WORDS}', id="lone-surrogate-key"),
    _raw_jsonl('"\\udc00": 1',
               "FILE, line 1: not a perflab result row ('utf-8' codec can't encode character '\\udc00' in position 0: surrogates "
               "not allowed)", id="lone-surrogate-top-level-key"),
    pytest.param("b.jsonl", _lines(_row(case={"model": ["m"]})), 'FILE, line 1: case.model: ["m"]: expected a mapping whose model is '
                 "text on one line, without control characters", id="case-model-a-list"),
    _csv('', '"c1\nc2",ok,2.0',
         "FILE, line 2: case_id: 'c1\\nc2': expected non-empty text on one line, without control characters",
         id="csv-case-id-over-two-lines"),
    _csv(",ci95_low_ms,ci95_high_ms", "c1,ok,nan,1.0,2.0",
         f"FILE, line 2: median_ms: nan: expected a time in ms, {TIMES}", id="csv-nan-median"),
    _csv(",ci95_low_ms,ci95_high_ms", "c1,ok,2.0,1e-308,inf",
         f"FILE, line 2: ci95_ms[0]: 1e-308: expected [low, high] in ms, each {TIMES}", id="csv-tiny-ci"),
    _csv(",process_medians_ms", "c1,ok,2.0,2.0 -2.0",
         f"FILE, line 2: process_medians_ms[1]: -2.0: expected a list of process medians in ms, each {TIMES} or null",
         id="csv-negative-process-median"),
]


@pytest.mark.parametrize("name,text,message", HOSTILE_RESULTS)
def test_compare_refuses_a_result_file_it_cannot_trust_in_one_line(tmp_path, name, text, message):
    a, b = tmp_path / "a.jsonl", tmp_path / name
    a.write_text(_lines(_row()))
    b.write_text(text)
    for args in ((a, b), (a, b, "--json")):
        result = run_cli_here("compare", *args)
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip() == "perflab: error: " + message.replace("FILE", str(b)) and result.stdout == ""


def test_a_tiny_median_against_a_huge_one_gives_no_verdict(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(_lines(_row(median=1e-308, ci95_ms=[0.99e-308, 1.01e-308])))
    b.write_text(_lines(_row(median=1e308, ci95_ms=[0.99e308, 1e308])))
    result = run_cli_here("compare", a, b, "--json")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip() == f"perflab: error: {a}, line 1: median_ms: 1e-308: expected a time in ms, {TIMES}"


def test_compare_json_is_strict_json(tmp_path):
    import json

    def refuse(name):
        raise AssertionError(f"bare {name} in compare --json")

    a, b = tmp_path / "a.jsonl", tmp_path / "b.csv"
    a.write_text(_lines(_row(median=2.0), _row("c2", median=1e-9, ci95_ms=None)))
    b.write_text("case_id,status,median_ms,ci95_low_ms,ci95_high_ms\nc1,ok,3.0,2.9,3.1\nc2,ok,1e10,,\n")
    result = run_cli_here("compare", a, b, "--json")
    assert result.returncode == 0, result.stderr
    cases = json.loads(result.stdout, parse_constant=refuse)["cases"]
    assert [c["verdict"] for c in cases] == ["slower", "not compared"]
    assert cases[1]["unpaired_ratio"] == pytest.approx(1e19)


def _store_of(out, *rows):
    from perflab.sweep.store import Store

    with Store.create(out) as store:
        store.put_environment("env", {"host": "lab"})
        for row in rows:
            store.put(row, "env")
    return out


def _set_row_json(out, case_id, text):
    import sqlite3

    with sqlite3.connect(str(out / "results.sqlite")) as conn:
        conn.execute("UPDATE results SET row_json = ? WHERE case_id = ?", (text, case_id))


@pytest.mark.parametrize("stored,message", [
    pytest.param('{"case_id": "c1", "status": "ok", "median_ms": NaN}', f"median_ms: nan: expected a time in ms, {TIMES}", id="nan"),
    pytest.param('{"case_id": "c1", "status": "ok", "median_ms": -2.0}', f"median_ms: -2.0: expected a time in ms, {TIMES}",
                 id="negative"),
    pytest.param('{"case_id": "c1", "status": "ok", "median_ms": 2.0, "version": 5}',
                 f"version: 5: expected {VERSION_WORDS}", id="version-5"),
    pytest.param('{"case_id": "c1", "status": "ok", "median_ms": 2.0, "process_flags": 5}',
                 "process_flags: 5: expected a list of each process's flags (a list of flag names, or null)", id="process-flags-5"),
])
def test_compare_refuses_a_stored_row_it_cannot_trust_in_one_line(tmp_path, stored, message):
    a = _store_of(tmp_path / "a", _row())
    b = _store_of(tmp_path / "b", _row())
    _set_row_json(b, "c1", stored)
    result = run_cli_here("compare", a, b)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == f"perflab: error: {b}, case c1: {message}"


def test_a_stored_row_nested_100000_deep_is_named_and_skipped(tmp_path):
    a = _store_of(tmp_path / "a", _row(), _row("c2"))
    b = _store_of(tmp_path / "b", _row(), _row("c2"))
    _set_row_json(b, "c2", '{"case_id": "c2", "x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    result = run_cli_here("compare", a, b)
    assert result.returncode == 0, result.stderr
    (warning,) = [line for line in result.stderr.splitlines() if line.strip()]
    assert warning == (f"warning: {b}: row c2 (env): malformed JSON of 200024 characters, cut short or damaged (maximum "
                       "recursion depth exceeded while decoding a JSON array from a unicode string); skipped")
    assert "Only A holds 1 case(s), not compared: m 32px bs1 fp32 eager." in result.stdout


# A row with every path of the ratios in it (processes paired, blocks, host-dependent), for the field-by-field sweep below
_FULL_ROW = _row(process_medians_ms=[2.0, 2.1], process_flags=[[], []], process_sessions=["s1", "s2"], version={"key": "k", "session": "v"},
                 samples_ms=[2.0, 2.1], sample_rounds=[0, 0], sample_processes=[0, 1], session="q", host_held_ms=1.0, device_ms=1.5,
                 keep_rate=[0.5], reduction_loc=[3], flags=["high_cv"], label="m 32px", case={"model": "m"})
_HOSTILE_VALUES = [None, -1, 0, 1e-308, 1e308, "x", "", [], [None], [[1]], {}, {"a": 1}, True, 2**70, [-1.0], ["a\x1b"], "a\ud800",
                   ["\ud800"], [["\udc00"]], [1e308], {"key": "\ud800"}, {"\ud800": 1}, {"model": ["m"]}]


def test_every_field_of_a_row_with_each_hostile_value_is_one_line_or_a_finite_comparison():
    """Each field compare's readers check (``records.row.FIELDS``: a field added there is swept too), each value of
    another type or out of range, as a JSON line gives it: ``check_row`` (which read_rows and a store's reader apply to
    each row) refuses it in one line naming the row and the field, or the comparison it gives is strict JSON."""
    import json

    from perflab.analysis.regressions import compare_rows
    from perflab.records.row import FIELDS, check_row

    refused = set()
    for field in FIELDS:
        for value in _HOSTILE_VALUES:
            row = json.loads(json.dumps(dict(_FULL_ROW, **{field: value})))
            try:
                check_row(row, "b.jsonl, line 1")
            except PerflabError as exc:
                assert str(exc).startswith(f"b.jsonl, line 1: {field}") and "\n" not in str(exc), (field, value, str(exc))
                refused.add(field)
                continue
            for sides in ([_FULL_ROW], [row]), ([row], [row]):
                if sides[0][0]["case_id"] == row["case_id"]:
                    json.dumps(compare_rows(*sides).to_dict(), allow_nan=False)
    assert refused == set(FIELDS)  # each field refuses some of them
