"""Figures (matplotlib, headless): Figure-2-style calibration heatmaps."""

from __future__ import annotations

from pathlib import Path

import torch


def calibration_heatmaps(model: str, hits: dict[str, torch.Tensor], plan, layers: tuple[int, ...],
                         directory: Path, suffix: str = "") -> list[Path]:
    """hits[kernel]: (lengths, digits, depths, layers) 0/1 -> one PNG per kernel setting with
    recall by layer x key length and by layer x depth. Returns the written paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, h in hits.items():
        by_digits = h.mean(dim=(0, 2))  # (digits, layers)
        by_depth = h.mean(dim=(0, 1))  # (depths, layers)
        fig, axes = plt.subplots(2, 1, figsize=(max(8, len(layers) * 0.35), 7), constrained_layout=True)
        for ax, data, ylabels, ylabel in (
            (axes[0], by_digits, [str(d) for d in plan.digits], "passkey digits"),
            (axes[1], by_depth, [f"{d / plan.depths:.2f}" for d in range(plan.depths)], "depth"),
        ):
            image = ax.imshow(data.numpy(), aspect="auto", vmin=0, vmax=1, cmap="viridis", origin="lower")
            ax.set_xticks(range(len(layers)), [str(l) for l in layers], fontsize=7)
            ax.set_yticks(range(len(ylabels)), ylabels, fontsize=7)
            ax.set_xlabel("layer")
            ax.set_ylabel(ylabel)
            fig.colorbar(image, ax=ax, label="whole-needle recall")
        kernel = "multi-kernel (3 max x 16 avg)" if name == "multi" else "single kernel (SnapKV-like)"
        grid = ", ".join(f"{n // 1024}K" for n in plan.lengths)
        fig.suptitle(f"{model}: recall per layer, {kernel}, budget {plan.budget}, contexts {grid}")
        path = directory / f"{model.lower()}-{name}{suffix}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written
