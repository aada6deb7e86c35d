"""The names of the host flags a result row can carry: torch-free, for the code that raises them (``measure.canary``)
and the code that reads them (``analysis.regressions`` leaves a flagged round out of a paired CI)."""

HOST_DRIFT_FLAG = "host_drift"  # the host canary ran off its environment's median (measure.canary)
HOST_CONTENTION_FLAG = "host_contention"  # the row's run-queue wait or VM steal over the loop (measure.sched)
HOST_FLAGS = (HOST_DRIFT_FLAG, HOST_CONTENTION_FLAG)
