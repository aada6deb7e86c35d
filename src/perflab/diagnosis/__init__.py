"""Where a case's time goes, and why: the passes after its untraced timing, where measure/, trace/ and analysis/ meet.

- ``profiling``: a case's profile pass (``perflab profile``, a sweep's worker) and its Nsight Compute pass
  (``perflab ncu``); a data-parallel case's profile on every rank and each rank's accounting (``profile --parallel``,
  ``explain --parallel``, ``perflab run`` under torchrun).
- ``explanation``: ``perflab explain``: floors, the modes predicted from the eager trace and then measured, the
  fixes predicted and measured.
- ``explain_parallel``: ``perflab explain --parallel``: a data-parallel step's communication against its floor, and
  the communication fixes predicted, then measured.

The API and the sweep call this package; it calls the stages below it and imports nothing above them. Its name is not
``explain`` or ``profile``: those are the API's functions, which ``perflab`` hands on, and a subpackage of that name
would take their place on the package once imported.
"""
