"""Helper process for test_stress.py: ``pub N`` publishes versions 1..N; ``read T`` pulls and checks each one.

Every tensor of version v is filled with ``v * 1000 + i`` (i = its index), so a reader
can tell from the values alone whether a pulled state_dict mixes versions.
"""

import json
import sys
import time

import torch

from rlmesh.weights import Publisher, Subscriber

NAME = "stress"
SIZES = [1 << 18, 1 << 16, 3, 1 << 20, 17, 1 << 19] * 4  # ~9 MiB of float32 over 24 tensors


def state(v: int) -> dict:
    return {f"t{i}": torch.full((n,), float(v * 1000 + i)) for i, n in enumerate(SIZES)}


def torn(sd: dict, v: int) -> list[str]:
    return [k for i, (k, t) in enumerate(sd.items()) if not bool((t == float(v * 1000 + i)).all())]


def pub(n: int) -> None:
    p = Publisher(NAME)
    print("ready", flush=True)
    sys.stdin.readline()  # wait until readers are up
    for v in range(1, n + 1):
        p.publish(state(v), version=v)
        time.sleep(0.002)
    sys.stdin.readline()  # keep serving until told to stop
    p.close()


def read(transport: str, last: int) -> None:
    sub = Subscriber(NAME, transport)
    target = state(0)
    assert sub.latest_version(timeout=30) is None  # connected, and nothing published yet
    print("ready", flush=True)
    seen, bad, v = [], [], 0
    while v < last:
        v = int(sub.pull_into(target, min_version=v + 1 if v < 1 else v, timeout=30))
        seen.append(v)
        bad += [f"v{v}:{k}" for k in torn(target, v)]
    print(json.dumps({"seen": seen, "torn": bad}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "pub":
        pub(int(sys.argv[2]))
    else:
        read(sys.argv[2], int(sys.argv[3]))
