"""Helper process for test_reader_memory.py: pulls each version it is told to, and answers with its memory.

A line ``<transport> <dict|module> <version>`` pulls that version with one Subscriber per
(transport, target kind) and prints the process's private and shared resident memory after the
pull (``RssAnon`` and ``RssShmem`` of ``/proc/self/status``, bytes), as JSON; the reader of the
previous (transport, kind) is closed first. ``base <kind>`` allocates that target and prints the
same before its first pull; an empty line ends it.
"""

import json
import sys

import torch

from rlmesh.weights import Subscriber

NAME = "memory"
TENSORS = 16


def target(total: int, kind: str):
    """Zeroed tensors (their pages touched, as a model's are) of ``total`` bytes, as a state_dict or a module."""
    sd = {f"l{i}.w": torch.zeros(total // TENSORS // 4) for i in range(TENSORS)}
    if kind == "dict":
        return sd
    m = torch.nn.Module()
    for k, t in sd.items():
        layer, leaf = k.split(".")
        m.add_module(layer, torch.nn.Module())
        getattr(m, layer).register_buffer(leaf, t)
    return m


def memory() -> dict:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "RssShmem"):
                out[key] = int(value.split()[0]) * 1024
    return out


def main(total: int) -> None:
    targets: dict = {}
    subs: dict = {}
    for line in sys.stdin:
        words = line.split()
        if not words:
            break
        if words[0] == "base":
            targets[words[1]] = target(total, words[1])
        else:
            transport, kind, version = words[0], words[1], int(words[2])
            if (transport, kind) not in subs:  # a new reader: the previous one goes, with what it held
                for old in subs.values():
                    old.close()
                subs = {(transport, kind): Subscriber(NAME, transport)}
            sub = subs[(transport, kind)]
            got = sub.pull_into(targets[kind], min_version=version, timeout=60)
            assert int(got) == version and float(next(iter(targets[kind].values() if kind == "dict" else
                                                            targets[kind].buffers()))[0]) == version
        print(json.dumps(memory()), flush=True)
    for sub in subs.values():
        sub.close()


if __name__ == "__main__":
    main(int(sys.argv[1]))
