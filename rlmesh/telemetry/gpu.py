"""GPU readings through NVML (``pynvml`` from nvidia-ml-py): one ``gpu_health`` row per GPU per sample.

Why NVML and not ``nvidia-smi``: it is the library nvidia-smi itself uses, costs
microseconds per reading and exposes XID events. A reading NVML does not support on
a device (ECC on consumer boards, power on some VMs) is NULL, never a made-up value;
a host without the NVML library or without GPUs gives no rows at all.
"""

from __future__ import annotations

import logging
from typing import Any, Callable

logger = logging.getLogger(__name__)


def _read(fn: Callable[[], Any]) -> Any:
    """One NVML reading, or ``None`` where this device or driver does not support it."""
    import pynvml  # deferred: optional NVML: no GPU, no library, no rows

    try:
        return fn()
    except pynvml.NVMLError:
        return None


class GpuSampler:
    """Opens NVML once; :meth:`sample` returns the rows for every visible GPU (``[]`` without GPUs)."""

    def __init__(self) -> None:
        self.handles: list[Any] = []
        self._events: Any = None
        self.why_unavailable = ""
        try:
            import pynvml  # deferred: optional NVML: no GPU, no library, no rows
        except ImportError as exc:
            self.why_unavailable = f"nvidia-ml-py is not installed ({exc}); pip install nvidia-ml-py"
            return
        self._nv = pynvml
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except pynvml.NVMLError as exc:
            self.why_unavailable = f"NVML unavailable: {exc}"
            return
        if not self.handles:
            self.why_unavailable = "NVML sees no GPUs"
            return
        self._static = [
            (i, _read(lambda h=h: pynvml.nvmlDeviceGetUUID(h)), _read(lambda h=h: pynvml.nvmlDeviceGetName(h)))  # type: ignore[misc]  # a lambda with a default argument (binds the loop's value): mypy cannot infer it
            for i, h in enumerate(self.handles)
        ]
        self._open_xid_events()

    @property
    def available(self) -> bool:
        return bool(self.handles)

    def _open_xid_events(self) -> None:
        nv = self._nv
        try:
            self._events = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            logger.info("NVML event sets unavailable (%s): gpu_health.xid stays NULL", exc)
            return
        for h in self.handles:
            try:
                nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, self._events)
            except nv.NVMLError as exc:  # NOT_SUPPORTED on some boards and in containers
                logger.info("XID events not available on a GPU (%s)", exc)

    def _drain_xids(self) -> dict[int, list[int]]:
        """XID errors since the last call, per device index (non-blocking)."""
        out: dict[int, list[int]] = {}
        if self._events is None:
            return out
        nv = self._nv
        for _ in range(64):  # bounded: a storm of XIDs must not stall sampling
            try:
                data = nv.nvmlEventSetWait_v2(self._events, 0)
            except nv.NVMLError:  # NVML_ERROR_TIMEOUT: nothing pending
                break
            if data.eventType & nv.nvmlEventTypeXidCriticalError:
                idx = _read(lambda d=data: nv.nvmlDeviceGetIndex(d.device))  # type: ignore[misc]  # a lambda with a default argument (binds the loop's value): mypy cannot infer it
                out.setdefault(-1 if idx is None else idx, []).append(int(data.eventData))
        return out

    def sample(self) -> list[dict[str, Any]]:
        if not self.handles:
            return []
        nv = self._nv
        xids = self._drain_xids()
        rows = []
        for (i, uuid, name), h in zip(self._static, self.handles):
            util = _read(lambda: nv.nvmlDeviceGetUtilizationRates(h))
            mem = _read(lambda: nv.nvmlDeviceGetMemoryInfo(h))
            power_mw = _read(lambda: nv.nvmlDeviceGetPowerUsage(h))
            temp = _read(lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
            dev_xids = xids.get(i, [])
            rows.append({
                "gpu": i,
                "uuid": uuid,
                "name": name.decode() if isinstance(name, bytes) else name,
                "util_pct": None if util is None else float(util.gpu),
                "mem_util_pct": None if util is None else float(util.memory),
                "mem_used": None if mem is None else int(mem.used),
                "mem_total": None if mem is None else int(mem.total),
                "temp_c": None if temp is None else float(temp),
                "power_w": None if power_mw is None else power_mw / 1000.0,
                "sm_clock_mhz": _read(lambda: int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))),
                "ecc_corrected": _read(lambda: int(nv.nvmlDeviceGetTotalEccErrors(
                    h, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_VOLATILE_ECC))),
                "ecc_uncorrected": _read(lambda: int(nv.nvmlDeviceGetTotalEccErrors(
                    h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC))),
                "xid": dev_xids[-1] if dev_xids else None,
                "xid_count": len(dev_xids),
            })
        return rows

    def close(self) -> None:
        if not self.handles:
            return
        nv = self._nv
        if self._events is not None:
            _read(lambda: nv.nvmlEventSetFree(self._events))
        _read(nv.nvmlShutdown)
        self.handles = []
