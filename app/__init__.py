"""The Streamlit dashboard: presentation only, on top of `probe`."""
