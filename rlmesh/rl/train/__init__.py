"""The trainer mesh: ``trainer.ranks=N`` trains one model on N procs (docs/trainer.md).

- :mod:`~rlmesh.rl.train.distributed`: the ``torch.distributed`` process group rlmesh forms for a
  trainer mesh (rendezvous through the job's KV), the model wrapped with FSDP2 or DDP, the full
  state dict gathered for publishing, and the batch handed from rank 0 to the others;
- :mod:`~rlmesh.rl.train.sharding`: how a batch is split across ranks and how a per-rank loss is
  scaled so the reduced gradient is the one-rank gradient (pure: no processes);
- :mod:`~rlmesh.rl.train.dcp`: sharded checkpoints with ``torch.distributed.checkpoint``, each
  file checksummed, loadable at any rank count.

Submodules are imported explicitly; importing this package loads nothing.
"""
