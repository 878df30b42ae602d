"""A proc forked from a template starts with fresh global random states, as a fresh process does.

Real fork, real numpy and torch: the child reseeds as a forked worker does, then draws; the parent,
still holding the state both had at the fork, draws what the child would have drawn without it.
"""

import json
import os

import numpy as np
import torch

from rlmesh.launch import fork_template


def test_a_forked_child_draws_other_numbers_than_its_template():
    np.random.seed(0)
    torch.manual_seed(0)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: what fork_template._child does before it becomes a worker
        try:
            fork_template.reseed_global_rngs()
            os.write(w, json.dumps([float(np.random.rand()), float(torch.rand(()))]).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        child = json.loads(f.read())
    os.waitpid(pid, 0)
    inherited = [float(np.random.rand()), float(torch.rand(()))]  # the template's next draws
    assert child[0] != inherited[0], "numpy: the forked child repeated its template's draws"
    assert child[1] != inherited[1], "torch: the forked child repeated its template's draws (identical action noise)"
