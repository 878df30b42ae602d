"""The dashboard's web app (Starlette): HTML pages that fetch JSON, and the JSON itself.

Every page is the same small HTML shell; ``static/dashboard.js`` reads the path, fetches
``/api/...`` and draws with plotly.js (``Plotly.react``, so a refresh redraws in place while
keeping the user's zoom). Live pages refresh every ``refresh_s`` seconds. Only GET routes
exist: nothing here can change a run (the SQL goes through the read-only query path).
"""

from __future__ import annotations

import io
import json
import logging
from importlib import resources
from pathlib import Path
from typing import Any, Callable

import anyio
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from rlmesh.dashboard import data
from rlmesh.dashboard.auth import TokenMiddleware
from rlmesh.telemetry import charts, limits
from rlmesh.telemetry.cli import _flatten_nested, to_json
from rlmesh.telemetry.errors import ReadOnlyQueryError, RunNotFoundError

logger = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "static"
MAX_JSON_ROWS = 5000
"""Rows a SQL result shows in the page; the CSV/Parquet download carries all of them."""


def plotly_js() -> Path:
    """plotly.js as the ``plotly`` wheel ships it (so the page needs no internet access)."""
    try:
        path = Path(str(resources.files("plotly") / "package_data" / "plotly.min.js"))
    except ModuleNotFoundError as exc:
        raise ImportError("rlmesh dashboard needs plotly (its plotly.min.js): pip install 'rlmesh[dashboard]'") from exc
    if not path.exists():
        raise ImportError(f"plotly is installed but {path} is missing; reinstall plotly")
    return path


def _error(exc: Exception) -> JSONResponse:
    if isinstance(exc, RunNotFoundError):
        return JSONResponse({"error": str(exc)}, status_code=404)
    if isinstance(exc, (limits.QueryTimeoutError, limits.QueryCancelledError)):  # said in words, not a crash
        return JSONResponse({"error": f"{type(exc).__name__}: {exc}"}, status_code=503)
    if isinstance(exc, (ReadOnlyQueryError, ValueError)):
        return JSONResponse({"error": f"{type(exc).__name__}: {exc}"}, status_code=400)
    name = type(exc).__name__
    if type(exc).__module__.startswith(("duckdb", "_duckdb")) or name.endswith("Exception"):
        return JSONResponse({"error": f"{name}: {exc}"}, status_code=400)  # DuckDB's own words for bad SQL
    logger.exception("dashboard: request failed")
    return JSONResponse({"error": f"{name}: {exc}"}, status_code=500)


async def _until_disconnected(request: Request, fn: Callable[[], Any]) -> Any:
    """``fn()`` on a worker thread; if the browser goes away first, its query is interrupted (DuckDB's own
    interrupt, or the live service told to), so an abandoned query holds no core and no thread."""
    scope = limits.Scope()
    done = anyio.Event()

    def run() -> Any:
        with scope.active():
            return fn()

    async def watch() -> None:
        while not done.is_set():
            if await request.is_disconnected():
                scope.cancel("the dashboard's client went away")
                return
            with anyio.move_on_after(0.25):
                await done.wait()

    result: list[Any] = []

    async def work() -> None:
        try:
            result.append((await anyio.to_thread.run_sync(run), None))
        except Exception as exc:  # noqa: BLE001 - raised below, outside the task group (no ExceptionGroup)
            result.append((None, exc))
        finally:
            done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        tg.start_soon(work)
    value, exc = result[0]
    if exc is not None:
        raise exc
    return value


def create_app(rd: data.RunDirectory, token: str, *, refresh_s: float = 2.0, cookie_name: str = "rlmesh-dashboard",
               secure_cookie: bool = False, default_run: str | None = None) -> Any:
    """The ASGI app: Starlette routes wrapped in the token check."""
    js = plotly_js()
    shell = (STATIC / "index.html").read_text().replace("{{refresh_ms}}", str(int(refresh_s * 1000))).replace(
        "{{default_run}}", json.dumps(default_run or ""))

    def page(request: Request) -> Response:
        return Response(shell, media_type="text/html", headers={"Cache-Control": "no-store"})

    def api_runs(request: Request) -> Response:
        return JSONResponse([r.to_json() for r in rd.runs()])

    def api_charts(request: Request) -> Response:
        try:
            pg = charts.Page(request.query_params.get("page", "run"))
            return JSONResponse(data.chart_page(rd, request.path_params["run"], pg))
        except Exception as exc:  # noqa: BLE001 - every failure is shown to the page, in words
            return _error(exc)

    def api_meshes(request: Request) -> Response:
        try:
            return JSONResponse(data.meshes(rd, request.path_params["run"]))
        except Exception as exc:  # noqa: BLE001
            return _error(exc)

    def api_samples(request: Request) -> Response:
        try:
            return JSONResponse(data.samples(rd, request.path_params["run"]))
        except Exception as exc:  # noqa: BLE001 - becomes a JSON error the page shows
            return _error(exc)

    def api_schema(request: Request) -> Response:
        try:
            return JSONResponse(data.schema(rd, request.path_params["run"]))
        except Exception as exc:  # noqa: BLE001
            return _error(exc)

    async def api_sql(request: Request) -> Response:
        run = request.path_params["run"]
        sql = request.query_params.get("q", "").strip()
        fmt = request.query_params.get("format", "json")
        if not sql:
            return JSONResponse({"error": "empty query; try: SELECT * FROM runs"}, status_code=400)
        try:
            timeout = float(request.query_params["timeout_s"]) if request.query_params.get("timeout_s") else None
            tbl = await _until_disconnected(request, lambda: rd.query(run, sql, timeout))
        except Exception as exc:  # noqa: BLE001
            return _error(exc)
        if fmt == "csv":
            buf = io.BytesIO()
            pcsv.write_csv(_flatten_nested(tbl), buf)
            return Response(buf.getvalue(), media_type="text/csv",
                            headers={"Content-Disposition": f'attachment; filename="{run}-query.csv"'})
        if fmt == "parquet":
            buf = io.BytesIO()
            pq.write_table(tbl, buf)
            return Response(buf.getvalue(), media_type="application/vnd.apache.parquet",
                            headers={"Content-Disposition": f'attachment; filename="{run}-query.parquet"'})
        body = json.loads(to_json(tbl.slice(0, MAX_JSON_ROWS), run))
        body["row_count"] = tbl.num_rows
        body["truncated"] = tbl.num_rows > MAX_JSON_ROWS
        return JSONResponse(body)

    def api_compare(request: Request) -> Response:
        ids = [r for r in request.query_params.getlist("runs") for r in r.split(",") if r]
        try:
            return JSONResponse([data.compare(rd, ids, c) for c in request.query_params.getlist("chart")
                                 or list(charts.COMPARABLE)])
        except Exception as exc:  # noqa: BLE001
            return _error(exc)

    def plotly(request: Request) -> Response:
        return FileResponse(js, media_type="text/javascript", headers={"Cache-Control": "max-age=86400"})

    def not_found(request: Request) -> Response:
        return PlainTextResponse("not found", status_code=404)

    routes = [
        Route("/", page), Route("/compare", page),
        Route("/run/{run}", page), Route("/run/{run}/{tab:str}", page),
        Route("/api/runs", api_runs), Route("/api/compare", api_compare),
        Route("/api/run/{run}/charts", api_charts), Route("/api/run/{run}/meshes", api_meshes),
        Route("/api/run/{run}/schema", api_schema), Route("/api/run/{run}/samples", api_samples), Route("/api/run/{run}/sql", api_sql),
        Route("/assets/plotly.min.js", plotly),
        Mount("/assets", app=StaticFiles(directory=str(STATIC)), name="assets"),
    ]
    app = Starlette(routes=routes)
    return TokenMiddleware(app, token, cookie_name, secure_cookie)
