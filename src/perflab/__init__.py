"""perflab: a performance lab for transformer workloads on NVIDIA GPUs.

The public API lives in :mod:`perflab.api` and is re-exported here lazily, so that ``import perflab``
(and trace analysis) does not import torch. ``perflab.sweep`` is the sweep package; the sweep function
is ``perflab.api.sweep``.
"""

from perflab.version import __version__

_API = ("bench", "profile", "analyze", "compare", "explain")


def __getattr__(name):
    if name in _API:
        from perflab import api

        return getattr(api, name)
    raise AttributeError(f"module 'perflab' has no attribute {name!r}")


__all__ = [*_API, "__version__"]
