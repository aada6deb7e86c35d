"""YAML files read safely: one document, safe tags only, its nesting bounded, every mistake one line naming the file.

Every YAML the project reads (specs: ``sweep.spec.read_spec``; the figures file: ``report.seeds``) goes through
``read_yaml``; tests/test_hostile_inputs.py holds it to one line for everything PyYAML raises and fails for a module
that loads YAML another way. Torch-free.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from perflab.errors import PerflabError


def read_yaml(path, what: str = "YAML file", on_node=None) -> tuple[Any, str]:
    """A YAML file (one document, safe tags only) as plain data, and its text; ``on_node(source, root node)`` checks the
    document's nodes before they are constructed. Whatever the file holds, a mistake is one PerflabError naming the
    file (and the line and column where YAML says): a character YAML refuses (a NUL byte), a syntax error, a tag that
    would run code (``!!python/object``), an undefined alias, nesting past ``MAX_YAML_DEPTH``."""
    import yaml

    source = str(path)
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise PerflabError(f"{source}: no such {what}") from None
    except OSError as exc:
        raise PerflabError(f"{source}: cannot read the {what} ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise PerflabError(f"{source}: not a text file (a {what} is UTF-8 YAML)") from None
    loader = None
    try:
        loader = _bounded_loader()(text)  # its reader refuses a NUL byte or other control character here, before parsing
        node = loader.get_single_node()
        if node is not None and on_node is not None:
            on_node(source, node)
        return (loader.construct_document(node) if node is not None else None), text
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise PerflabError(f"{source}: YAML syntax error{where}: {exc.problem or exc.context}") from None
    except yaml.reader.ReaderError as exc:  # not a MarkedYAMLError: it carries a position in the text, not a mark
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        raise PerflabError(f"{source}: YAML error at line {line}, column {column}: a control character (U+{exc.character:04X}) that "
                           "YAML does not allow") from None
    except yaml.YAMLError as exc:
        raise PerflabError(f"{source}: YAML error: {' '.join(str(exc).split())}") from None
    finally:
        if loader is not None:
            loader.dispose()


MAX_YAML_DEPTH = 64  # a spec nests 4 deep (grid[0].reduction_loc[0]); PyYAML composes a level in two Python frames


@functools.cache
def _bounded_loader():
    """yaml.SafeLoader that refuses collections nested past ``MAX_YAML_DEPTH`` (a ComposerError at the one too deep):
    PyYAML composes nodes recursively, so ``[[[...]]]`` 100,000 deep would be a RecursionError."""
    import yaml

    class BoundedLoader(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent, index):
            self.depth += 1
            try:
                if self.depth > MAX_YAML_DEPTH:
                    raise yaml.composer.ComposerError(None, None, f"nested more than {MAX_YAML_DEPTH} deep",
                                                      self.peek_event().start_mark)
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

    return BoundedLoader
