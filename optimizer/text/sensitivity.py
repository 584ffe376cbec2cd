"""A sensitivity move's outcome in one line: its value, its ratio to the best's mean, the band, the verdict."""

from __future__ import annotations


def describe(row: dict, unit: str) -> str:
    if row["value"] is None:
        return "the run failed (see its server.log)"
    band_text = (f"band [{row['band_low']:.2f}, {row['band_high']:.2f}]" if row["band_low"] is not None
                 else "no band")
    ratio = f"{row['ratio']:.2f}x" if row["ratio"] is not None else "no ratio to"
    return f"{row['value']:.2f} {unit} ({ratio} the best's mean {row['best_mean']:.2f}; {band_text}): " \
           f"{row['verdict']}"
