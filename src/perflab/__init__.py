"""perflab: a performance lab for transformer workloads on NVIDIA GPUs.

The public API lives in :mod:`perflab.api` and is re-exported here lazily, so that ``import perflab``
(and trace analysis) does not import torch. ``perflab.sweep`` is the sweep package; the sweep function
is ``perflab.api.sweep``.
"""

from perflab.version import __version__

# perflab.api's functions, handed on here. perflab.sweep, perflab.report and perflab.models are packages: their
# functions are perflab.api.sweep and perflab.api.report, and the list of models is perflab.model_catalog.
_API = ("bench", "profile", "analyze", "compare", "explain", "make_cases", "model_catalog", "results", "breakeven", "ceilings",
        "demo_cases", "load_experiment")


def __getattr__(name):
    if name in _API:
        from perflab import api

        return getattr(api, name)
    raise AttributeError(f"module 'perflab' has no attribute {name!r}")


def __dir__():
    """The public API: what ``help(perflab)`` and tab completion should offer."""
    return sorted([*_API, "api", "__version__"])


__all__ = [*_API, "__version__"]
