"""Presenting: the `probe` command (`cli`), the terminal's tables, reports (HTML, Markdown,
JSON), plotly charts, the CI gate and the dashboard's launcher. Reads the layers below; the
dashboard in `app/` reads this.
"""
