"""Streamlit pages (one file per page) and the chart and view helpers they share."""
