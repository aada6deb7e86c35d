"""Measurement: timing, statistics, FLOPs, memory, energy (NVML), environment, and validity checks."""
