"""A stacked bar per profile (fuser, Inductor): the step's ms by category, idle on top.

matplotlib draws it where it is installed; without it a plain PNG is written by hand
(zlib), bars and a legend of colour swatches with no text (the JSON beside it has the
numbers).
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

from fuser.profile.classify import CATEGORIES, IDLE
from fuser.profile.report import StepProfile

COLORS = {
    "GEMM": "#4C72B0",
    "attention": "#8172B2",
    "fused memory-bound": "#55A868",
    "unfused memory-bound": "#C44E52",
    "copies/fills": "#DD8452",
    "optimizer": "#937860",
    "other": "#8C8C8C",
    IDLE: "#DDDDDD",
}


def _stack(p: StepProfile) -> list[tuple[str, float]]:
    return [(c, p.categories.get(c) or 0.0) for c in (*CATEGORIES, IDLE)]


def plot(profiles: list[StepProfile], path: Path, title: str = "") -> Path:
    """Write the stacked bars to `path` (PNG); returns it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        _plain_png(profiles, path)
        return path
    fig, ax = plt.subplots(figsize=(3.2 + 1.6 * len(profiles), 5.5))
    names = [p.name for p in profiles]
    bottoms = [0.0] * len(profiles)
    for c in (*CATEGORIES, IDLE):
        vals = [dict(_stack(p))[c] for p in profiles]
        if not any(vals):
            continue
        ax.bar(names, vals, bottom=bottoms, color=COLORS[c], label=c, width=0.6)
        for i, v in enumerate(vals):
            if v >= 1.5:
                ax.text(i, bottoms[i] + v / 2, f"{v:.1f}", ha="center", va="center", fontsize=8)
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    for i in range(len(profiles)):
        ax.text(i, bottoms[i], f"{bottoms[i]:.1f} ms", ha="center", va="bottom", fontsize=9)
    ax.set_ylabel("ms per training step (one profiled step, the median of those profiled)")
    ax.set_title(_title(profiles, title), fontsize=8)
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], fontsize=8, loc="center left", bbox_to_anchor=(1, 0.5))
    ax.set_ylim(0, max(bottoms + [1.0]) * 1.08)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def _title(profiles: list[StepProfile], title: str) -> str:
    if not profiles:
        return title
    steps = ", ".join(
        f"{p.name} {p.timing['unprofiled_ms']:.1f}"
        for p in profiles
        if p.timing.get("unprofiled_ms")
    )
    lines = [title or profiles[0].title, profiles[0].env.get("device", "")]
    if steps:
        lines.append(f"unprofiled step (ms): {steps}")
    return "\n".join(line for line in lines if line)


def _rgb(hex_color: str) -> tuple[int, int, int]:
    h = hex_color.lstrip("#")
    return int(h[0:2], 16), int(h[2:4], 16), int(h[4:6], 16)


def _plain_png(profiles: list[StepProfile], path: Path) -> None:
    """Bars (one per profile, categories stacked, height in proportion to ms) and a
    column of swatches in the categories' order, with no text."""
    w, h, bar, gap = 120 + 90 * len(profiles), 360, 50, 40
    img = [[(255, 255, 255)] * w for _ in range(h)]
    top = max((sum(v for _, v in _stack(p)) for p in profiles), default=1.0) or 1.0
    for i, p in enumerate(profiles):
        x0, y = gap + i * (bar + gap), h - 20
        for c, v in _stack(p):
            dy = round(v / top * (h - 40))
            for yy in range(max(0, y - dy), y):
                img[yy][x0 : x0 + bar] = [_rgb(COLORS[c])] * bar
            y -= dy
    x0 = w - 40
    for k, c in enumerate((*CATEGORIES, IDLE)):
        for yy in range(20 + 22 * k, 36 + 22 * k):
            img[yy][x0 : x0 + 16] = [_rgb(COLORS[c])] * 16
    raw = b"".join(b"\x00" + bytes(v for px in row for v in px) for row in img)

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw))
    path.write_bytes(png + chunk(b"IEND", b""))
