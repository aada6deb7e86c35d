"""The cross-GPU table: the same case (same id) measured on each GPU type, with throughput ratios.

Rows come from every environment of a store (a Ray sweep stores one per node and GPU); a case shows up
here when it has ``ok`` rows on at least two GPU types. The first GPU type (by name) is the reference:
each other column's ratio is its throughput over the reference's (>1: faster than the reference).
"""

from __future__ import annotations


def gpu_of(row: dict) -> str | None:
    return row.get("gpu_name") or (row.get("env") or {}).get("gpu_name")


def cross_gpu_rows(rows: list[dict]) -> tuple[list[str], list[tuple[dict, dict]]]:
    """(GPU types, [(a row of the case, {GPU type: best-throughput ok row})]) for cases on two or more types."""
    by_case: dict[str, dict[str, dict]] = {}
    for row in rows:
        gpu = gpu_of(row)
        if gpu is None or row.get("status") != "ok":
            continue
        seen = by_case.setdefault(row["case_id"], {})
        if gpu not in seen or (row.get("throughput_per_s") or 0) > (seen[gpu].get("throughput_per_s") or 0):
            seen[gpu] = row  # two hosts with the same GPU: the faster row
    multi = {case_id: per_gpu for case_id, per_gpu in by_case.items() if len(per_gpu) >= 2}
    gpus = sorted({g for per_gpu in multi.values() for g in per_gpu})
    return gpus, [(next(iter(per_gpu.values())), per_gpu) for per_gpu in multi.values()]


def cross_gpu_section(rows: list[dict], md_table, row_label) -> list[str]:
    gpus, cases = cross_gpu_rows(rows)
    if not cases:
        return []
    reference = gpus[0]
    headers = ["Case"] + [f"{g} img/s" for g in gpus] + [f"{g} / {reference}" for g in gpus[1:]]
    body = []
    for any_row, per_gpu in cases:
        tps = [per_gpu[g].get("throughput_per_s") if g in per_gpu else None for g in gpus]
        cells = [row_label(any_row)] + [f"{tp:.2f}" if tp else "–" for tp in tps]
        base = tps[0]
        cells += [f"{tp / base:.3f}×" if tp and base else "–" for tp in tps[1:]]
        body.append(cells)
    intro = (f"The same cases (same case id) on each GPU type; ratios are throughput over {reference}'s (>1: faster). "
             "Where several hosts have one GPU type, the faster row is shown.")
    return ["## Across GPU types", intro, md_table(headers, body)]
