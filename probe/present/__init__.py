"""Presenting: the `probe` command (`cli`: click alone; `options`: the measuring flags, once;
`measuring` and `stored`: the commands' bodies; `console` and `terminal`: rich), the grids and
lines every output shares (`tables`), reports (HTML, Markdown, JSON), plotly charts, the CI gate,
and what the dashboard reads to list and launch runs (`listing`, `launch`). Reads the layers
below; the dashboard in `app/` reads this.
"""
