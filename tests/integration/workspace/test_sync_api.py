"""sync_workspace on a real ProcMesh: the tree lands per simulated host and actors import from it."""

import pytest

import rlmesh as rm
from rlmesh.workspace import sync_workspace


class Probe(rm.Actor):
    @rm.endpoint
    def value(self) -> str:
        import wsuserpkg  # only in the synced tree, not on the workers' original sys.path

        return f"{wsuserpkg.VALUE}@{wsuserpkg.__file__}"


@pytest.mark.timeout(120)
def test_sync_then_import_in_actor(tmp_path):
    src = tmp_path / "src"
    (src / "wsuserpkg").mkdir(parents=True)
    (src / "wsuserpkg" / "__init__.py").write_text("VALUE = 'synced'\n")
    with rm.this_host().spawn_procs(per_host={"procs": 3}) as procs:
        rows = sync_workspace(procs, str(src), store_dir=str(tmp_path / "stores"), dest_root=str(tmp_path / "hosts"),
                              simulate_hosts=True)
        assert [r.host for r in rows] == ["proc-0", "proc-1", "proc-2"]
        assert all(r.stats.error == "" and r.stats.files == 1 for r in rows)
        got = procs.spawn("probe", Probe).value.call().get().values()
        for i, v in enumerate(got):
            assert v.startswith("synced@" + str(tmp_path / "hosts" / f"host-{i}")), v
        same = sync_workspace(procs, str(src))  # real hosts: all on the controller's host -> nothing copied
        assert [r.stats.transport for r in same] == ["same-host"] and same[0].dest == str(src)
