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
from perflab.sweep.spec import load_experiment, read_spec, read_yaml

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
    pytest.param("grid: !!python/object/apply:os.system [echo hi]\n",
                 "FILE: YAML syntax error at line 1, column 7: could not determine a constructor for the tag "
                 "'tag:yaml.org,2002:python/object/apply:os.system'", id="ConstructorError-python-tag"),
]


def _spec_readers():
    return {
        "read_spec": read_spec,
        "load_experiment": load_experiment,
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


def test_sweep_list_of_a_spec_with_a_nul_byte_is_one_line_and_exit_2(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_bytes(b"name: x\x00\ngrid: {model: [deit_tiny_patch16_224]}\n")
    result = run_cli_here("sweep", path, "--list")
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (f"perflab: error: {path}: YAML error at line 1, column 8: a control character (U+0000) "
                                     "that YAML does not allow")


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
        load_experiment(path)
    assert time.perf_counter() - started < 5
    assert str(exc.value).startswith(message.replace("FILE", str(path)))
    assert "\n" not in str(exc.value) and len(str(exc.value)) < 400


def test_a_binary_spec_is_one_line(tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_bytes(b"\xff\xfe\x00grid")
    with pytest.raises(PerflabError) as exc:
        read_spec(path)
    assert str(exc.value) == f"{path}: not a text file (a spec file is UTF-8 YAML)"


# Calls that read YAML text; each module that makes one must do it inside perflab.sweep.spec.read_yaml, which the
# tests above hold to one line for everything PyYAML raises.
_YAML_LOAD = re.compile(r"\byaml\.(safe_load|load|full_load|unsafe_load|load_all|safe_load_all|compose|compose_all|parse|scan|"
                        r"SafeLoader|Loader|FullLoader|UnsafeLoader|BaseLoader|CLoader|CSafeLoader)\b")


def test_every_yaml_reader_goes_through_read_yaml():
    uses = {}
    for path in SRC.rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if _YAML_LOAD.search(line.split("#")[0]) and "``yaml." not in line:
                uses.setdefault(str(path.relative_to(SRC)), []).append(number)
    assert list(uses) == ["sweep/spec.py"], uses
    source = (SRC / "sweep" / "spec.py").read_text().splitlines()
    start = next(i for i, line in enumerate(source, 1) if line.startswith("def read_yaml("))
    end = next(i for i, line in enumerate(source, 1) if i > start and line.startswith("def "))
    assert all(start < n < end for n in uses["sweep/spec.py"]), (start, end, uses)
