"""The torch backend's threads follow the CPUs other processes leave free (:class:`CpuShare`)."""

from __future__ import annotations

import os
import sys
import time

import pytest
import torch

from rlmesh.rl.backends.base import SamplingParams
from rlmesh.rl.backends.torch_backend import CpuShare, TorchBackend, threads_for
from rlmesh.rl.models import TransformerConfig


@pytest.mark.parametrize(("busy", "own", "max_threads", "want"), [
    (1.0, 1.0, 2, 2),   # the trainer waits: its core is free, sampling takes it
    (2.0, 1.0, 2, 1),   # the trainer trains: one core is ours
    (2.0, 1.33, 2, 1),  # three threads on two cores: back to one
    (1.15, 1.0, 2, 2),  # other procs' housekeeping does not count as a core's work
    (1.0, 1.0, 1, 1),   # pinned to one
    (9.0, 0.5, 2, 1),   # a host loaded by others: never below one
    (0.5, 0.5, 4, 4),
])
def test_threads_are_the_cpus_others_leave(busy, own, max_threads, want):
    assert threads_for(2 if max_threads <= 2 else 4, busy, own, 1.0, max_threads) == want


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/stat")
def test_the_cpus_busy_time_holds_this_process_own():
    share = CpuShare()
    first = share.sample()
    end = time.process_time() + 0.3
    while time.process_time() < end:  # 0.3 CPU seconds of our own on the set's CPUs
        pass
    last = share.sample()
    assert first is not None and last is not None
    wall, busy, own = (b - a for a, b in zip(first, last))
    assert own >= 0.3 and busy >= own - 0.05 and wall > 0


def test_a_call_samples_on_one_to_all_cpus_and_a_pinned_count_holds():
    torch.manual_seed(0)
    cfg = TransformerConfig(vocab_size=12, max_seq_len=24, d_model=16, n_layers=1, n_heads=2)
    params = SamplingParams(n=2, max_tokens=8, seed=0)
    free = TorchBackend(model_config=cfg, eos_id=None, pad_id=0)
    free.generate([[1, 2, 3]], params)
    assert free.cpu_share is not None and 1 <= torch.get_num_threads() <= len(os.sched_getaffinity(0))
    pinned = TorchBackend(model_config=cfg, eos_id=None, pad_id=0, threads=1)
    pinned.generate([[1, 2, 3]], params)
    assert pinned.cpu_share is None and torch.get_num_threads() == 1
