"""GpuSampler's NVML calls and unit conversions, against a stand-in ``pynvml`` module.

This machine has no GPU, so the real check (tests/unit/telemetry/test_health.py::
test_gpu_rows_have_real_readings, marked ``gpu``) is skipped here. This test pins the
mapping: milliwatts -> watts, NULL for readings NVML does not support, XIDs drained per
device. The stand-in has the real module's names and signatures (nvidia-ml-py 12/13).
"""

import sys
import types
from types import SimpleNamespace as NS

import pytest

from rlmesh.telemetry.gpu import GpuSampler


class NVMLError(Exception):
    pass


def fake_nvml(xids):
    m = types.ModuleType("pynvml")
    m.NVMLError = NVMLError
    m.NVML_TEMPERATURE_GPU, m.NVML_CLOCK_SM = 0, 1
    m.NVML_MEMORY_ERROR_TYPE_CORRECTED, m.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, m.NVML_VOLATILE_ECC = 0, 1, 0
    m.nvmlEventTypeXidCriticalError = 8
    m.nvmlInit = lambda: None
    m.nvmlShutdown = lambda: None
    m.nvmlDeviceGetCount = lambda: 2
    m.nvmlDeviceGetHandleByIndex = lambda i: f"h{i}"
    m.nvmlDeviceGetIndex = lambda h: int(h[1:])
    m.nvmlDeviceGetUUID = lambda h: f"GPU-{h}"
    m.nvmlDeviceGetName = lambda h: b"NVIDIA H200"
    m.nvmlDeviceGetUtilizationRates = lambda h: NS(gpu=97, memory=40)
    m.nvmlDeviceGetMemoryInfo = lambda h: NS(used=10 << 30, total=141 << 30, free=131 << 30)
    m.nvmlDeviceGetTemperature = lambda h, sensor: 71
    m.nvmlDeviceGetPowerUsage = lambda h: 512_345  # milliwatts
    m.nvmlDeviceGetClockInfo = lambda h, clock: 1980

    def ecc(h, kind, counter):
        if h == "h1":
            raise NVMLError("Not Supported")
        return 3 if kind == 0 else 0

    m.nvmlDeviceGetTotalEccErrors = ecc
    m.nvmlEventSetCreate = lambda: "set"
    m.nvmlDeviceRegisterEvents = lambda h, types_, es: None
    m.nvmlEventSetFree = lambda es: None

    def wait(es, timeout_ms):
        if not xids:
            raise NVMLError("Timeout")
        dev, xid = xids.pop(0)
        return NS(device=dev, eventType=8, eventData=xid)

    m.nvmlEventSetWait_v2 = wait
    return m


@pytest.fixture
def nvml(monkeypatch):
    xids = [("h1", 79), ("h1", 48)]
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(xids))
    return xids


def test_rows_per_gpu_with_units_and_nulls(nvml):
    s = GpuSampler()
    assert s.available
    r0, r1 = s.sample()
    assert r0["gpu"] == 0 and r0["uuid"] == "GPU-h0" and r0["name"] == "NVIDIA H200"
    assert r0["power_w"] == pytest.approx(512.345) and r0["temp_c"] == 71.0 and r0["util_pct"] == 97.0
    assert r0["mem_used"] == 10 << 30 and r0["sm_clock_mhz"] == 1980
    assert r0["ecc_corrected"] == 3 and r0["xid"] is None and r0["xid_count"] == 0
    assert r1["ecc_corrected"] is None and r1["ecc_uncorrected"] is None  # not supported -> NULL
    assert r1["xid"] == 48 and r1["xid_count"] == 2
    assert s.sample()[1]["xid_count"] == 0  # drained
    s.close()
