"""What every figure shares: its colours, its look (`layout`) and its numbers as arrays
(`values`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go

WAIT_COLOR = "#d62728"
BUSY_COLOR = "#1f77b4"
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22")


def layout(figure: go.Figure, title: str, height: int) -> go.Figure:
    # White with light grid lines, set directly: applying a named template re-validates all of
    # it, a fifth of a second for every figure.
    figure.update_layout(
        title={"text": title, "x": 0},
        height=height,
        margin={"l": 60, "r": 60, "t": 70, "b": 110},
        # the legend 70 px under the plot, whatever its height (below the time axis's title)
        legend={"orientation": "h", "yanchor": "top", "y": -70 / max(1, height - 180)},
        hovermode="x unified",
        plot_bgcolor="white",
        paper_bgcolor="white",
        font={"color": "#2a3f5f"},
    )
    figure.update_xaxes(gridcolor="#ebf0f8", linecolor="#ebf0f8", zeroline=False)
    figure.update_yaxes(gridcolor="#ebf0f8", linecolor="#ebf0f8", zeroline=False)
    return figure


def values(numbers: Sequence[float | None]) -> np.ndarray:
    """A float array, None as NaN: plotly draws NaN as a gap, and checks an array at once
    where it checks a list item by item (six times slower for a 600-point line)."""
    return np.array([np.nan if v is None else v for v in numbers], dtype=float)
