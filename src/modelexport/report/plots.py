"""Plots as embedded PNG data URIs (matplotlib, headless)."""
from __future__ import annotations

import base64
import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HTP_COLOR, CPU_COLOR = "#2e7d32", "#c62828"


def _to_data_uri(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def placement_by_op(by_op: dict[str, dict[str, int]]) -> str:
    """Stacked horizontal bars: nodes per op type on HTP and on CPU."""
    ops = sorted(by_op, key=lambda o: -(by_op[o].get("HTP", 0) + by_op[o].get("CPU", 0)))[:25]
    htp = [by_op[o].get("HTP", 0) for o in ops]
    cpu = [by_op[o].get("CPU", 0) for o in ops]
    fig, ax = plt.subplots(figsize=(7, 0.32 * len(ops) + 1.2))
    ax.barh(ops, htp, color=HTP_COLOR, label="HTP")
    ax.barh(ops, cpu, left=htp, color=CPU_COLOR, label="CPU fallback")
    ax.invert_yaxis()
    ax.set_xlabel("nodes")
    ax.legend(loc="lower right")
    ax.set_title("Placement by op type")
    return _to_data_uri(fig)


def bars(labels: list[str], values: list[float], title: str, xlabel: str, threshold: float | None = None) -> str:
    fig, ax = plt.subplots(figsize=(7, 0.35 * len(labels) + 1.2))
    colors = [HTP_COLOR if threshold is None or v >= threshold else CPU_COLOR for v in values]
    ax.barh(labels, values, color=colors)
    if threshold is not None:
        ax.axvline(threshold, color="black", linestyle="--", linewidth=1, label=f"threshold {threshold:g}")
        ax.legend(loc="lower right")
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    return _to_data_uri(fig)


def line(labels: list[str], values: list[float], title: str, ylabel: str, threshold: float | None = None) -> str:
    fig, ax = plt.subplots(figsize=(8, 3.2))
    ax.plot(range(len(values)), values, marker="o", markersize=3, color="#1565c0")
    if threshold is not None:
        ax.axhline(threshold, color=CPU_COLOR, linestyle="--", linewidth=1, label=f"threshold {threshold:g} dB")
        ax.legend()
    step = max(1, len(labels) // 15)
    ax.set_xticks(range(0, len(labels), step))
    ax.set_xticklabels(labels[::step], rotation=45, ha="right", fontsize=7)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return _to_data_uri(fig)
