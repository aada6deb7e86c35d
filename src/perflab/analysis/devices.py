"""Tables per device: a trace of several GPUs (merged ranks, or one process driving several devices) is
analysed one device at a time, and every table says which device each row is for."""

from __future__ import annotations

from typing import Callable

import pandas as pd


def devices_of(kernels: pd.DataFrame) -> list[int]:
    if "device" not in kernels or not len(kernels):
        return [0]
    return sorted(pd.unique(kernels["device"].to_numpy()).tolist())  # (hashing, not a set of 1 M Python ints)


def by_device(kernels: pd.DataFrame, table: Callable[[pd.DataFrame], pd.DataFrame]) -> pd.DataFrame:
    """``table`` of each device's rows of the KernelTable, concatenated, with a leading ``device`` column."""
    devices = devices_of(kernels)
    frames = []
    for device in devices:
        mine = kernels if len(devices) == 1 else kernels[kernels["device"] == device]
        frame = table(mine).copy()
        frame.insert(0, "device", device)
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def launching_threads(kernels: pd.DataFrame) -> set[int]:
    """The CPU threads that launched ``kernels`` (thread ids are unique across the processes of one host)."""
    return set(kernels["launch_tid"][kernels["launch_tid"] >= 0].tolist())
