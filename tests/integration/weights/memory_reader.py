"""Helper process for test_reader_memory.py: pulls each version it is told to, and answers with its memory.

A line ``<transport> <dict|module> <version>`` pulls that version with one Subscriber per
(transport, target kind) and prints the process's private and shared resident memory after the
pull (``RssAnon`` and ``RssShmem`` of ``/proc/self/status``, bytes), as JSON; the reader of the
previous (transport, kind) is closed first. ``base <kind>`` allocates that target and prints the
same before its first pull; an empty line ends it.

``busy <kind> <version>`` pulls over TCP (with the TCP reader already made) while another thread of
the process keeps the interpreter busy, as a generator's own work does: the reader's thread then
takes chunks off the socket late, and whatever was asked for piles up in libzmq's queue. It prints
the peak resident memory of the pull above the memory before it (``peak_extra``, bytes: the peak
is reset through ``/proc/self/clear_refs`` first).
"""

import json
import sys
import threading

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


def busy_pull(sub, target, version: int) -> dict:
    """Pull ``version`` while a pure-Python loop holds the interpreter for 50 ms at a time."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident size
    before = status("VmRSS")
    done = threading.Event()

    def hog() -> None:
        while not done.is_set():
            sum(range(10_000))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.05)
    t = threading.Thread(target=hog)
    t.start()
    try:
        assert int(sub.pull_into(target, min_version=version, timeout=60)) == version
    finally:
        done.set()
        t.join()
        sys.setswitchinterval(interval)
    return {"peak_extra": status("VmHWM") - before}


def status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            k, _, value = line.partition(":")
            if k == key:
                return int(value.split()[0]) * 1024
    raise KeyError(key)


def main(total: int) -> None:
    targets: dict = {}
    subs: dict = {}
    for line in sys.stdin:
        words = line.split()
        if not words:
            break
        if words[0] == "base":
            targets[words[1]] = target(total, words[1])
        elif words[0] == "busy":
            print(json.dumps(busy_pull(subs[("tcp", words[1])], targets[words[1]], int(words[2]))), flush=True)
            continue
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
