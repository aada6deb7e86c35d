"""perflab run's startup hook in the program's child interpreters (``perflab.program.children``).

``perflab run`` puts this folder at the front of ``PYTHONPATH`` while the program runs, so every Python it starts
imports this module first. Where the run's configuration is in the environment (``PERFLAB_RUN_CHILD``), it wraps
multiprocessing's bootstrap, so that a child that steps is recorded; then it runs the interpreter's own
``sitecustomize`` (a distribution's, a virtualenv's), which this one shadows. It never raises: a child runs as it
would alone whatever happens here.
"""

import os
import sys


def _follow():
    if not os.environ.get("PERFLAB_RUN_CHILD"):
        return
    try:
        from perflab.program.children import install_in_child

        install_in_child()
    except Exception:
        pass


def _chain():
    """Run the sitecustomize this one shadows (the next on sys.path), as Python would have."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # as site.execsitecustomize says it
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}", file=sys.stderr)


_follow()
_chain()
