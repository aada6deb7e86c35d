"""``perflab run``: a user's own program, run unchanged, timed, traced and explained.

- ``script``: the program from the command line's tail (a file, ``-m module``; a leading ``python`` is dropped) and
  how it runs in this process, as ``python -m cProfile`` and ``pdb`` run it: ``__main__``, ``sys.argv``, its output
  and its exit code are its own.
- ``boundaries``: where its steps begin and end, without editing it: every optimizer step (torch's global optimizer
  step hooks), each call of a function (``--step QUALNAME``), or an NVTX / ``record_function`` range (``--step-range``).
- ``recorder``: skip, time (CUDA events on the step's stream, or the host clock), trace (torch.profiler), then leave
  the program alone; its stamps are read once, into the typed record it hands over (``Recorded``: the step times
  and their summary), written whenever the program ends (also by an exception or Ctrl-C).
- ``compiler``: dynamo's own counters over each phase: frames compiled and recompiled with the guard that failed,
  frames that hit the recompile limit (and ran eagerly from then on), graph breaks and graphs.
- ``ranks``: under torchrun every rank records and writes its report; rank 0 merges the reports as written (its own
  among them), the traces into the communication section.
- ``report``: the report (run.json) as one typed record, ``RunReport`` (declared in ``records.run_report``, with its
  ``load``, ``save`` and format), built in one place, ``build_run_report``, from the recorder's ``Recorded`` and the
  run's ``RunContext`` (the traced steps' analysis included); ``to_dict`` is run.json.

It hands measure/, trace/ and analysis/ what they already take; the traced steps' figures are computed by
``analysis.program`` (no torch) and rendered by ``report.program``.
"""
