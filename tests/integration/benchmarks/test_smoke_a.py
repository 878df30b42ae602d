"""Every benchmark script's ``--smoke`` mode, run as a subprocess (part 1 of 2; see smoke_scripts.py)."""

from __future__ import annotations

import pytest
from smoke_scripts import AWAITING_SMOKE, run_smoke, scripts


@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(reason=AWAITING_SMOKE[n], strict=False))
                                  if n in AWAITING_SMOKE else n for n in scripts(0)])
def test_smoke_runs_and_prints_its_ratios(name, tmp_path):
    run_smoke(name, tmp_path, timeout=280)
