"""feedscope's dashboard: `streamlit run app`.

Pages: Runs (the start), Live, Run, Session, Compare, Launch. Presentation only: everything it
shows comes from the store through `probe`.
"""

from __future__ import annotations

import streamlit as st

st.set_page_config(page_title="feedscope", layout="wide")

pages = [
    st.Page("views/runs.py", title="Runs", default=True),  # at the root address
    st.Page("views/live.py", title="Live", url_path="live"),
    st.Page("views/run.py", title="Run", url_path="run"),
    st.Page("views/session.py", title="Session", url_path="session"),
    st.Page("views/compare.py", title="Compare", url_path="compare"),
    st.Page("views/launch.py", title="Launch", url_path="launch"),
]
st.navigation(pages).run()
