"""Entry point of a worker proc: ``python -m rlmesh.worker --controller ADDR --proc-id ID``.

``python -m rlmesh.worker --fork-server ...`` starts the local launcher's warm
template instead (:mod:`rlmesh.launch.forkserver`): same entry point, so the
template's ``__main__``, ``sys.path`` and interpreter match a real worker's.
"""

import sys

from rlmesh.actor.worker import main

if __name__ == "__main__":
    if sys.argv[1:2] == ["--fork-server"]:
        from rlmesh.launch.fork_template import main as fork_server_main

        raise SystemExit(fork_server_main(sys.argv[2:]))
    raise SystemExit(main())
