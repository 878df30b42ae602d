"""Entry point of a worker proc: ``python -m rlmesh.worker --controller ADDR --proc-id ID``."""

from rlmesh.actor.worker import main

if __name__ == "__main__":
    raise SystemExit(main())
