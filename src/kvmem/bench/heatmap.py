"""Depth x length accuracy heatmaps of the needle benchmark, one PNG per method."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import Protocol

import numpy as np

logger = logging.getLogger(__name__)


class NeedleResult(Protocol):
    """What a heatmap reads of one case's result (bench.needle.NeedleResult)."""

    @property
    def method(self) -> Enum: ...
    @property
    def kind(self) -> Enum: ...
    @property
    def layout(self) -> Enum: ...
    @property
    def length(self) -> int: ...
    @property
    def depth(self) -> float: ...
    @property
    def correct(self) -> bool: ...


def accuracy_grid(
    results: Sequence[NeedleResult], depths: Sequence[float], lengths: Sequence[int]
) -> np.ndarray:
    """float64 [n_depths, n_lengths]: accuracy per cell, NaN where there is no case."""
    correct = np.zeros((len(depths), len(lengths)), dtype=np.float64)  # [n_depths, n_lengths]
    total = np.zeros((len(depths), len(lengths)), dtype=np.float64)  # [n_depths, n_lengths]
    row = {d: i for i, d in enumerate(depths)}
    col = {n: j for j, n in enumerate(lengths)}
    for r in results:
        correct[row[r.depth], col[r.length]] += float(r.correct)
        total[row[r.depth], col[r.length]] += 1.0
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(
            total > 0, correct / np.maximum(total, 1.0), np.nan
        )  # [n_depths, n_lengths]


def plot_needle_heatmaps(results: Sequence[NeedleResult], out_dir: str | Path) -> list[Path]:
    """One PNG per method; a panel per (kind, layout) with depth rows and length columns."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory = Path(out_dir)
    directory.mkdir(parents=True, exist_ok=True)
    depths = sorted({r.depth for r in results})
    lengths = sorted({r.length for r in results})
    panels = list(dict.fromkeys((r.kind, r.layout) for r in results))
    paths = []
    for method in dict.fromkeys(r.method for r in results):
        fig, axes = plt.subplots(
            1, len(panels), figsize=(1.6 + 1.3 * len(lengths) * len(panels), 4.6), squeeze=False
        )
        for ax, (kind, layout) in zip(axes[0], panels, strict=True):
            mine = [
                r for r in results if r.method is method and r.kind is kind and r.layout is layout
            ]
            grid = accuracy_grid(mine, depths, lengths)  # [n_depths, n_lengths]
            image = ax.imshow(grid, vmin=0.0, vmax=1.0, cmap="RdYlGn", aspect="auto")
            ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
            ax.set_yticks(range(len(depths)), [f"{d:.2f}" for d in depths])
            ax.set_xlabel("prompt tokens")
            ax.set_ylabel("needle depth")
            ax.set_title(f"{kind.value} / {layout.value}")
            for i in range(len(depths)):
                for j in range(len(lengths)):
                    if not np.isnan(grid[i, j]):
                        ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=8)
        fig.colorbar(image, ax=axes[0].tolist(), label="accuracy")
        fig.suptitle(f"needle recall: {method.value}")
        path = directory / f"needle_{method.value}.png"
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
        paths.append(path)
        logger.info("wrote %s", path)
    return paths
