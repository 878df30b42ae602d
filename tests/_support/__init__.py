"""Helpers shared by the test folders (importable as ``_support``: pyproject.toml puts ``tests`` on ``pythonpath``)."""
