"""Sweeps: experiment specs (spec), one subprocess per case (runner, worker), the SQLite results store (store).

The API function is ``perflab.api.sweep``; ``perflab.sweep`` is this package.
"""
