"""Small SVG bar charts, drawn on the server: no script, no asset from anywhere.

Every label goes through markupsafe's escape; numbers are formatted here.

Not here: where the numbers come from (views.usd_by_day, the ledger).
"""

from __future__ import annotations

import functools

from markupsafe import Markup, escape


def bars(
    points: list[tuple[str, float]], *, width: int = 240, height: int = 40, unit: str = "$", css: str = "chart"
) -> Markup:
    """One bar per point (label, value), scaled to the largest; a <title> per bar."""
    return _bars(tuple(tuple(p) for p in points), width, height, unit, css)


@functools.lru_cache(maxsize=2048)  # a fleet page draws 100 charts, most of them unchanged since the last view
def _bars(points: tuple, width: int, height: int, unit: str, css: str) -> Markup:
    if not points:
        return Markup("")
    top = max(v for _, v in points) or 1.0
    step = width / len(points)
    gap = 1 if step > 3 else 0
    rects = []
    for i, (label, value) in enumerate(points):
        h = 1.0 if value <= 0 else max(2.0, value / top * (height - 2))  # a day of $0 is a tick, not nothing
        kind = "bar zero" if value <= 0 else "bar"
        rects.append(
            f'<rect class="{kind}" x="{i * step:.1f}" y="{height - h:.1f}" width="{max(step - gap, 1):.1f}" '
            f'height="{h:.1f}"><title>{escape(label)}: {escape(_amount(value, unit))}</title></rect>'
        )
    total = sum(v for _, v in points)
    return Markup(
        f'<svg class="{escape(css)}" role="img" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" aria-label="{escape(_amount(total, unit))} over {len(points)} days">'
        f'<line class="axis" x1="0" y1="{height - 0.5}" x2="{width}" y2="{height - 0.5}"/>' + "".join(rects) + "</svg>"
    )


def _amount(value: float, unit: str) -> str:
    return f"${value:.4f}" if unit == "$" else f"{value:g} {unit}"
