"""Family name → its implementation (imports torch)."""

from __future__ import annotations

from perflab.workloads.base import Implementation


def implementation(case) -> Implementation:
    name = case.family
    if name == "lm":
        from perflab.workloads.lm import LM

        return LM()
    if name == "decode":
        from perflab.workloads.decode import Decode

        return Decode()
    from perflab.workloads.classify import Classify

    return Classify()
