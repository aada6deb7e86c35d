"""Let a new virtualenv see the packages of the interpreter that made it, when that one is a virtualenv too.

    python3 tools/parent_site.py .venv

``python3 -m venv --system-site-packages`` makes the new environment see the *base* interpreter's
site-packages. When ``python3`` is itself a virtualenv (uv, a GPU machine's prepared environment), its own
packages (torch) are not there, so the Makefile would download torch again (and fail offline). This
writes a ``.pth`` file into the new environment naming the parent's site-packages; Python appends those
directories after the environment's own, so what is installed into .venv still wins. Nothing is written
when the interpreter is not a virtualenv (system Python, conda's base or named environments: their
packages are the "system site" that --system-site-packages already sees).
"""

import sys
import sysconfig
from pathlib import Path

PTH_NAME = "_parent_site_packages.pth"


def main(venv: str) -> int:
    if sys.prefix == sys.base_prefix:
        return 0
    parent = sysconfig.get_paths()
    paths = sorted({parent["purelib"], parent["platlib"]})
    sites = sorted(Path(venv).glob("lib*/python*/site-packages"))
    if not sites:
        print(f"{venv}: no site-packages directory (is it a virtualenv?)", file=sys.stderr)
        return 2
    for site in sites:
        (site / PTH_NAME).write_text("".join(path + "\n" for path in paths))
    print(f"{venv}: also sees {', '.join(paths)} (the packages of {sys.prefix})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
