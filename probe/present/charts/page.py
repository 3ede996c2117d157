"""Figures on an HTML page: each held as its JSON (`html_div`: numbers rounded to what a chart
shows) and drawn by plotly.js's cartesian bundle, inlined once, gzipped (`page_script`).
"""

from __future__ import annotations

import base64
import json
import math
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio

# plotly.js's cartesian bundle (scatter, bar, heatmap, histogram, box and more: the npm package
# plotly.js-cartesian-dist-min, the plotly.js version plotly.py bundles), gzipped: 0.5 MB where
# the whole plotly.js is 4.8 MB
PLOTLY_BUNDLE = Path(__file__).parents[1] / "assets" / "plotly-cartesian.min.js.gz"
SIGNIFICANT = 4  # digits of the numbers a page's figures carry: no chart shows more
CHART_CLASS = "plotly-graph-div"  # a page's chart (`html_div`), named as plotly.py names it


def html_div(figure: go.Figure) -> str:
    """A figure as an HTML fragment: its (empty) div and its JSON, numbers to `SIGNIFICANT`
    digits and without the template all the page's figures share; `page_script` draws it."""
    spec = figure.to_plotly_json()
    spec["layout"].pop("template", None)
    height = figure.layout.height or 450
    return (
        f'<div class="{CHART_CLASS}" style="height:{height}px;width:100%"></div>'
        f'<script type="application/json">{_json(spec)}</script>'
    )


def page_script() -> str:
    """What draws a page's figures (`html_div`), to put at the end of its body: plotly.js's
    cartesian bundle inlined (gzipped, base64), unpacked by the browser's DecompressionStream,
    and the template the figures share, once. Nothing is fetched: the page works offline."""
    template = pio.templates[pio.templates.default].to_plotly_json()
    draw = _DRAW.replace("CHART_CLASS", CHART_CLASS).replace("BUNDLE", _bundle_base64())
    return (
        f'<script type="application/json" id="plotly-template">{_json(template)}</script>'
        f"<script>{draw}</script>"
    )


_DRAW = """(async () => {
  const charts = document.querySelectorAll("div.CHART_CLASS");
  if (!charts.length) return;
  try {
    const packed = Uint8Array.from(atob("BUNDLE"), (c) => c.charCodeAt(0));
    const unpacked = new Blob([packed]).stream().pipeThrough(new DecompressionStream("gzip"));
    const plotly = document.createElement("script");
    plotly.textContent = await new Response(unpacked).text();
    document.head.append(plotly);
    const template = JSON.parse(document.getElementById("plotly-template").textContent);
    for (const chart of charts) {
      const figure = JSON.parse(chart.nextElementSibling.textContent);
      figure.layout.template = template;
      await Plotly.newPlot(chart, figure.data, figure.layout,
                           {displaylogo: false, responsive: true});
    }
  } catch (error) {
    for (const chart of charts) {
      chart.textContent = "The chart could not be drawn: " + error + " (it needs a browser"
        + " with DecompressionStream: Chrome 80, Firefox 113, Safari 16.4 or newer)";
    }
  }
})();"""


@cache
def _bundle_base64() -> str:
    return base64.b64encode(PLOTLY_BUNDLE.read_bytes()).decode("ascii")


def _json(value: Any) -> str:
    """Compact JSON of a figure's parts, to put inside a <script> element: numbers rounded
    (`_rounded`), and `<` escaped, so that no text in it can close the element."""
    text = json.dumps(_rounded(value), separators=(",", ":"), ensure_ascii=False)
    return text.replace("<", "\\u003c")


def _rounded(value: Any) -> Any:
    """Plain JSON values: arrays (numpy's, and plotly's base64 typed arrays) as lists, floats
    to `SIGNIFICANT` digits (whole ones as ints), NaN and infinities as null (a gap)."""
    if isinstance(value, dict) and {"dtype", "bdata"} <= value.keys():
        array = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        shape = value.get("shape")
        value = array if shape is None else array.reshape([int(n) for n in shape.split(",")])
    if isinstance(value, np.ndarray):
        value = value.tolist()
    elif isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        short = float(f"{value:.{SIGNIFICANT}g}")
        return int(short) if short.is_integer() else short
    if isinstance(value, dict):
        return {key: _rounded(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(item) for item in value]
    return value
