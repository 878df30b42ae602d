"""Telemetry's exceptions. Each message says what went wrong and what to do about it."""

from __future__ import annotations

from rlmesh.errors import RlmeshError


class TelemetryError(RlmeshError):
    """Base class for telemetry errors."""


class ReadOnlyQueryError(TelemetryError, PermissionError):
    """A query tried to change the run's data; telemetry queries are read-only."""


class RunNotFoundError(TelemetryError, FileNotFoundError):
    """No run matches the name given to query() or the CLI."""


class ServiceUnavailableError(TelemetryError, ConnectionError):
    """The run's telemetry service did not answer."""
