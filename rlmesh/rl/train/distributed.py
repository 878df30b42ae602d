"""The process group of a trainer mesh, and the model spread over it.

``trainer.ranks=N`` spawns the trainer on N procs. Each rank builds its model, then
:meth:`TrainGroup.form` joins them into one ``torch.distributed`` process group:

- **Rendezvous through the job, not through ports agreed in advance.** Rank 0 starts c10d's
  ``TCPStore`` on a free port of its host (the kernel picks it: no race between choosing and
  binding), and puts ``{host, port, key, epoch}`` into the job's KV (:mod:`rlmesh.actor.kv`, on
  the controller, reached over the authenticated control plane). The other ranks read it from
  there, dial the store and ``init_process_group`` (gloo on CPU, NCCL when the model is on CUDA).
  The host is loopback for local procs (``RLMESH_BIND_HOST`` unset), where gloo is also kept on
  the loopback interface; a pod advertises ``RLMESH_ADVERTISE_HOST``, as its sockets do.
- **Wrapping** (:meth:`TrainGroup.wrap`): ``fsdp`` applies FSDP2's ``fully_shard`` to every
  transformer block (each child of an ``nn.ModuleList``) and then to the root, so parameters,
  gradients and optimizer state are sharded and each block's parameters are gathered only while
  it runs; ``ddp`` keeps a full replica per rank and all-reduces gradients.
- **The batch goes from rank 0 to the others as signed pickles over the group**
  (:meth:`TrainGroup.scatter`): only rank 0 samples from the buffer (one lease, settled once).
  A pickle from the network must never be loaded unauthenticated (docs/actors.md, Security),
  and gloo authenticates nothing; so every message carries a keyed BLAKE2b MAC over the group's
  epoch, sender, receiver, a per-pair sequence number and the bytes, with the 32-byte key rank 0
  drew and handed out through the KV. A forged, replayed or reordered message is refused before
  ``pickle.loads``.
- **Publishing**: with ``trainer.publish=sharded`` every rank publishes its own part
  (:mod:`rlmesh.rl.train.publishing`); with ``gathered`` the full state dict is gathered to rank 0
  (:meth:`TrainGroup.full_state_dict`), which publishes it as the single trainer did.

One rank (``trainer.ranks=1``) forms no group at all: the trainer is the one-proc trainer it
always was.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import logging
import os
import pickle
import secrets
import socket
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from rlmesh import settings
from rlmesh.actor import kv
from rlmesh.errors import RlmeshError
from rlmesh.transport.auth import is_loopback_address
from rlmesh.transport.sockets import default_bind_host

logger = logging.getLogger(__name__)

PARALLEL = ("fsdp", "ddp", "none")
"""``trainer.parallel``: how the model is spread over the ranks."""
_WILDCARDS = ("0.0.0.0", "*", "::")


class GroupError(RlmeshError):
    """The trainer mesh's process group failed: a rendezvous that never came, or a message between
    ranks that failed its MAC (refused, never unpickled)."""


def rendezvous_key(name: str, epoch: int = 0) -> str:
    """The KV key rank 0 of trainer mesh ``name`` publishes its store's address under, at group epoch
    ``epoch`` (+1 each time the mesh restarts after a rank died: :mod:`rlmesh.rl.train.recovery`)."""
    return f"rlmesh.rl/train/{name}/rendezvous/{epoch}"


def store_host() -> str:
    """The address rank 0's store is dialled at: the bind host (loopback unless ``RLMESH_BIND_HOST``),
    or, bound to a wildcard, ``RLMESH_ADVERTISE_HOST`` or this host's address (pods)."""
    host = default_bind_host()
    if host in _WILDCARDS:
        return settings.ADVERTISE_HOST.get() or socket.gethostbyname(socket.gethostname())
    return host


def _keep_gloo_on_loopback(host: str) -> None:
    """Gloo listens on the interface its hostname resolves to; a group on one host stays on ``lo``."""
    if is_loopback_address(f"tcp://{host}:0"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


def transformer_blocks(model: nn.Module) -> list[nn.Module]:
    """The modules FSDP2 shards one by one: every child of every ``nn.ModuleList`` (the built-in
    transformer's ``blocks``, a Hugging Face model's ``layers``), outermost lists first."""
    found: list[nn.Module] = []
    seen: set[int] = set()
    for module in model.modules():
        if isinstance(module, nn.ModuleList):
            for child in module:
                if id(child) not in seen and not any(id(m) in seen for m in child.modules()):
                    found.append(child)
                    seen.add(id(child))
    return found


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module under a DDP wrapper (FSDP2 wraps in place: the module itself)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


class TrainGroup:
    """One trainer mesh's ``torch.distributed`` group, as this rank sees it. Build with :meth:`form`."""

    def __init__(self, rank: int, world: int, backend: str, key: bytes, epoch: str) -> None:
        self.rank, self.world, self.backend = rank, world, backend
        self._key, self._epoch = key, epoch
        self._sent = [0] * world
        self._received = [0] * world
        # NCCL moves CUDA tensors only: the byte messages and counters go over a gloo group beside it
        self._cpu = dist.new_group(backend="gloo") if backend != "gloo" else None

    @classmethod
    def form(cls, name: str, rank: int, world: int, timeout_s: float, backend: str = "gloo",
             epoch: int = 0) -> "TrainGroup":
        """Join the group of trainer mesh ``name`` as ``rank`` of ``world`` (every rank calls this), at
        group epoch ``epoch`` (the KV's, :func:`rlmesh.rl.train.recovery.group_epoch`: a restarted mesh
        meets at a new rendezvous, never at one of a group that is gone).

        ``timeout_s`` bounds the rendezvous and every collective afterwards (a rank that died
        mid-step fails its peers' collectives after this long where the controller does not restart
        the mesh first)."""
        timeout = datetime.timedelta(seconds=timeout_s)
        if rank == 0:
            host = store_host()
            _keep_gloo_on_loopback(host)
            store = dist.TCPStore(host, 0, world, is_master=True, timeout=timeout, wait_for_workers=False)
            info = {"host": host, "port": int(store.port), "key": secrets.token_hex(32),
                    "epoch": f"{epoch}.{secrets.token_hex(8)}"}
            kv.put(rendezvous_key(name, epoch), info)
            if epoch:
                kv.delete(rendezvous_key(name, epoch - 1))
        else:
            try:
                info = kv.get(rendezvous_key(name, epoch), timeout=timeout_s)
            except KeyError:
                raise GroupError(f"trainer mesh {name!r}: rank 0 published no rendezvous within {timeout_s:g} s "
                                 "(trainer.group_timeout_s); did rank 0's proc start?") from None
            _keep_gloo_on_loopback(info["host"])
            store = dist.TCPStore(info["host"], info["port"], world, is_master=False, timeout=timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
        logger.info("trainer mesh %s: rank %d of %d joined (%s, store %s:%d, epoch %d)", name, rank, world, backend,
                    info["host"], info["port"], epoch)
        return cls(rank, world, backend, bytes.fromhex(info["key"]), info["epoch"])  # type: ignore[arg-type]  # the rendezvous record's strings

    @property
    def incarnation(self) -> str:
        """This group's identity, the same on every rank and new at each restart of the mesh (its epoch
        and a token rank 0 drew): what names the set of a version published in shards."""
        return self._epoch

    def close(self) -> None:
        """Leave the group (the proc is stopping)."""
        if dist.is_initialized():
            dist.destroy_process_group()

    # -- the model -----------------------------------------------------------------------------------------------

    def broadcast_module(self, model: nn.Module) -> None:
        """Rank 0's parameters and buffers into every rank's copy (before wrapping: one starting point)."""
        for tensor in model.state_dict(keep_vars=True).values():
            dist.broadcast(tensor.data, src=0)

    def wrap(self, model: nn.Module, parallel: str) -> nn.Module:
        """``model`` spread over the group: ``fsdp`` (FSDP2, per block then the root), ``ddp``, or
        ``none`` (no gradient sync: only meaningful for tests)."""
        if parallel == "fsdp":
            for block in transformer_blocks(model):
                fully_shard(block)
            fully_shard(model)
            return model
        if parallel == "ddp":
            return DistributedDataParallel(model)
        if parallel == "none":
            return model
        raise ValueError(f"parallel={parallel!r}: use one of {PARALLEL}")

    def shard_frozen(self, model: nn.Module, parallel: str) -> nn.Module:
        """A frozen module (a KL reference: no gradients, no optimizer) spread like the policy: under
        ``fsdp`` each rank keeps 1/N of its parameters, gathered block by block while it runs forward
        (a collective: every rank runs the same forwards, as for the policy); under ``ddp`` or ``none``
        a whole copy per rank (there are no gradients to reduce). Its weights are rank 0's."""
        self.broadcast_module(model)
        if parallel == "fsdp":
            for block in transformer_blocks(model):
                fully_shard(block)
            fully_shard(model)
        return model

    def load_full_state_dict(self, model: nn.Module, state: dict[str, torch.Tensor]) -> None:
        """A whole state dict (every rank holds the same one) into ``model``, sharded or not. Every rank calls it."""
        if isinstance(model, FSDPModule):
            set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True))
        else:
            unwrap(model).load_state_dict(state)

    def full_state_dict(self, model: nn.Module) -> dict[str, torch.Tensor] | None:
        """The whole model's state dict on rank 0 (CPU tensors); ``None`` elsewhere. Every rank calls it
        (with FSDP it gathers the shards)."""
        if isinstance(model, FSDPModule):
            state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            return state if self.rank == 0 else None
        return unwrap(model).state_dict() if self.rank == 0 else None

    def gather_entries(self, model: nn.Module, keys: set[str]) -> dict[str, torch.Tensor] | None:
        """Only the entries ``keys`` of ``model``'s state dict (the unwrapped module's names), whole, on rank
        0 (CPU copies); ``None`` elsewhere. Every rank calls it: under FSDP2 each sharded entry is one
        all-gather, in state-dict order, so no rank ever holds more of the model than those entries
        (a LoRA export gathers the adapters this way, not the whole model)."""
        out: dict[str, torch.Tensor] = {}
        for k, t in unwrap(model).state_dict().items():
            if k not in keys:
                continue
            full = t.full_tensor() if isinstance(t, DTensor) else t
            if self.rank == 0:
                out[k] = full.detach().to("cpu", copy=True)
        return out if self.rank == 0 else None

    # -- numbers ---------------------------------------------------------------------------------------------------

    def all_sum(self, values: list[float]) -> list[float]:
        """Element-wise sum of ``values`` over the ranks (float64)."""
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, group=self._cpu)
        return t.tolist()

    def broadcast_int(self, value: int) -> int:
        """Rank 0's ``value`` on every rank."""
        (total,) = self.all_sum([float(value) if self.rank == 0 else 0.0])
        return int(total)

    def barrier(self) -> None:
        dist.barrier(group=self._cpu)

    # -- signed messages -------------------------------------------------------------------------------------------

    def _mac(self, src: int, dst: int, seq: int, body: bytes) -> bytes:
        head = f"{self._epoch}:{src}:{dst}:{seq}:".encode()
        return hashlib.blake2b(head + body, key=self._key, digest_size=32).digest()

    def send_object(self, obj: Any, dst: int) -> None:
        """Pickle ``obj`` and send it, with its MAC, to rank ``dst`` (which calls :meth:`recv_object`)."""
        body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        seq = self._sent[dst] = self._sent[dst] + 1
        msg = self._mac(self.rank, dst, seq, body) + body
        dist.send(torch.tensor([len(msg)], dtype=torch.int64), dst, group=self._cpu)
        dist.send(torch.frombuffer(bytearray(msg), dtype=torch.uint8), dst, group=self._cpu)

    def recv_object(self, src: int) -> Any:
        """The next object rank ``src`` sent; :class:`GroupError` (nothing unpickled) if its MAC fails."""
        size = torch.zeros(1, dtype=torch.int64)
        dist.recv(size, src, group=self._cpu)
        buf = torch.empty(int(size.item()), dtype=torch.uint8)
        dist.recv(buf, src, group=self._cpu)
        msg = buf.numpy().tobytes()
        seq = self._received[src] = self._received[src] + 1
        mac, body = msg[:32], msg[32:]
        if not hmac.compare_digest(mac, self._mac(src, self.rank, seq, body)):
            raise GroupError(f"rank {self.rank}: message {seq} from rank {src} fails its MAC (forged, replayed or "
                             "from another group); refused, not unpickled")
        return pickle.loads(body)

    def scatter(self, parts: list[Any] | None) -> Any:
        """Rank 0 passes one part per rank (``parts[r]`` for rank ``r``); every rank gets its own."""
        if self.rank != 0:
            return self.recv_object(0)
        assert parts is not None and len(parts) == self.world, f"scatter needs {self.world} parts"
        for r in range(1, self.world):
            self.send_object(parts[r], r)
        return parts[0]

    def gather(self, obj: Any) -> list[Any] | None:
        """Every rank's ``obj`` on rank 0, in rank order; ``None`` elsewhere."""
        if self.rank != 0:
            self.send_object(obj, 0)
            return None
        return [obj, *(self.recv_object(r) for r in range(1, self.world))]
