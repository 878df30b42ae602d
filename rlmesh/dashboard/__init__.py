"""``rlmesh dashboard``: a live web page over a run's telemetry (runs, curves, meshes, health, SQL).

Above the telemetry layer and beside the recipes (it reads the work-item account the RL
layer defines); nothing below imports it. Every number on every page comes from read-only
SQL through :func:`rlmesh.telemetry.reader.query_run_dir` — the run's live service while it
runs, the file opened ``read_only=True`` afterwards — and every chart is a
:class:`rlmesh.telemetry.charts.ChartSpec`, the same definitions ``rlmesh plot`` draws.

Serving: Starlette on uvicorn (the ``dashboard`` extra); charts: plotly.js, served from the
``plotly`` wheel's own copy, so the page works without internet access. See docs/dashboard.md.
"""
