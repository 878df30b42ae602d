"""Interfaces for AI agents over rlmesh runs: the MCP server (``rlmesh mcp``).

Above telemetry: it reads runs through the telemetry's read-only query path and never
writes. See ``docs/agents.md``.
"""
