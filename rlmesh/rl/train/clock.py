"""Where a train step's time goes on one rank, and what the rank holds: the ``train_ranks`` rows.

Measured from Python, without a profiler, so the split is what hooks and timers can see:

- **forward**: time inside the model's forward (a pre- and a post-hook on the module ``train_step``
  calls; FSDP2's parameter all-gathers run inside it; a recomputation under gradient
  checkpointing runs inside the backward and is counted here too);
- **optimizer**: time inside ``optimizer.step`` (step hooks; local to each rank under FSDP2 and DDP);
- **backward**: the rest of ``train_step``: the backward with FSDP2's reduce-scatters or DDP's
  all-reduces, gradient clipping (an all-reduce of norms under FSDP2) and the loss arithmetic;
- **communication outside the model**: the batch hand-off from rank 0 (``handoff_s``, on the
  other ranks also their wait for rank 0's sample), the metrics' gather (``sync_s``) and the
  gather of the full weights for publishing (inside ``publish_s``).

Memory: the parameters' and optimizer state's bytes this rank holds (its shards under FSDP2), the
frozen modules' it holds beside them (a KL reference copy: ``ref_bytes``), the proc's peak RSS and,
on CUDA, the device's peak allocation.
"""

from __future__ import annotations

import resource
import sys
import time
from contextlib import contextmanager
from typing import Any, Iterable, Iterator

import torch
from torch import nn

FIELDS = ("sample_s", "handoff_s", "forward_s", "backward_s", "optimizer_s", "sync_s", "publish_s", "checkpoint_s")


def local_bytes(tensors: Any) -> int:
    """Bytes of the tensors this rank holds: a sharded (DTensor) parameter counts its local shard."""
    total = 0
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        local = t.to_local() if hasattr(t, "to_local") else t
        total += local.numel() * local.element_size()
    return total


def optimizer_bytes(optimizer: torch.optim.Optimizer) -> int:
    return local_bytes(v for state in optimizer.state.values() for v in state.values())


def peak_rss_bytes() -> int:
    """This process's peak resident set (``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak) if sys.platform == "darwin" else int(peak) * 1024


class StepClock:
    """Seconds per part of one train step on this rank (:data:`FIELDS`), reset after each row."""

    def __init__(self) -> None:
        self.times = dict.fromkeys(FIELDS, 0.0)
        self.publish_bytes = 0
        self.forwards = 0
        self._fwd_t0: float | None = None
        self._opt_t0: float | None = None
        self._handles: list[Any] = []
        self._attached: tuple[nn.Module, torch.optim.Optimizer] | None = None

    def reset(self) -> None:
        self.times = dict.fromkeys(FIELDS, 0.0)
        self.publish_bytes = 0
        self.forwards = 0

    @contextmanager
    def section(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.times[name] += time.perf_counter() - t0

    def attach(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Time ``model``'s forward and ``optimizer.step`` from now on (replacing an earlier attach; the
        same pair again is a no-op: the trainer calls this before each step, as ``setup`` may have built
        a new optimizer, GRPO's after its warm start)."""
        if self._attached is not None and self._attached[0] is model and self._attached[1] is optimizer:
            return
        self._attached = (model, optimizer)  # the objects, not their ids: a freed optimizer's id is reused
        for h in self._handles:
            h.remove()
        self._handles = [model.register_forward_pre_hook(self._fwd_in), model.register_forward_hook(self._fwd_out),
                         optimizer.register_step_pre_hook(self._opt_in),
                         optimizer.register_step_post_hook(self._opt_out)]

    def _fwd_in(self, *_: Any) -> None:
        if self._fwd_t0 is None:
            self._fwd_t0 = time.perf_counter()

    def _fwd_out(self, *_: Any) -> None:
        if self._fwd_t0 is not None:
            self.times["forward_s"] += time.perf_counter() - self._fwd_t0
            self.forwards += 1
            self._fwd_t0 = None

    def _opt_in(self, *_: Any) -> None:
        self._opt_t0 = time.perf_counter()

    def _opt_out(self, *_: Any) -> None:
        if self._opt_t0 is not None:
            self.times["optimizer_s"] += time.perf_counter() - self._opt_t0
            self._opt_t0 = None

    def row(self, train_step_s: float, model: nn.Module, optimizer: torch.optim.Optimizer,
            frozen: Iterable[nn.Module] = ()) -> dict[str, Any]:
        """The ``train_ranks`` columns this clock fills (``backward_s`` from ``train_step_s``, the time
        of ``train_step``), then reset for the next step. ``forward_s`` is NULL when no forward of the
        hooked module ran (a trainer calling submodules or methods only). ``frozen``: the modules the
        rank holds beside the policy (``Trainer.frozen_modules``), counted in ``ref_bytes``."""
        t: dict[str, float | None] = dict(self.times)
        if self.forwards:
            t["backward_s"] = max(0.0, train_step_s - self.times["forward_s"] - self.times["optimizer_s"])
        else:
            t["forward_s"] = t["backward_s"] = None
        device = None
        if torch.cuda.is_available() and any(p.is_cuda for p in model.parameters()):
            device = int(torch.cuda.max_memory_allocated())
        row = {**t, "train_step_s": train_step_s, "publish_bytes": self.publish_bytes,
               "param_bytes": local_bytes(model.parameters()), "optim_bytes": optimizer_bytes(optimizer),
               "ref_bytes": sum(local_bytes(m.parameters()) for m in frozen),
               "rss_peak_bytes": peak_rss_bytes(), "device_peak_bytes": device}
        self.reset()
        return row
