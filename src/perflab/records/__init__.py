"""Typed records that cross rooms, on a low floor (no torch): what a result row, a run's report and a case's fields are,
declared once so that every stage above reads them the same way. Below models/workloads/spec, above stats/clock/errors
(``tests/test_layers.py`` holds the floors)."""
