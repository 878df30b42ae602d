"""sync_workspace on a real ProcMesh: the tree lands per simulated host and actors import from it."""

import pytest

import rlmesh as rm
from rlmesh.workspace import sync_workspace
from rlmesh.workspace.store import LAYOUT


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


@pytest.mark.timeout(180)
def test_a_host_killed_during_the_sync_is_cut_out_of_the_chain(tmp_path):
    """source -> host 0 -> host 1 -> host 2, and host 1's proc is SIGKILLed once it has begun to
    receive: host 2 continues from host 0 (host 1's upstream), hosts 0 and 2 land the whole tree,
    and the error names host 1 only. Whether the kill lands mid-pull or just after host 1 finished,
    the others must not wait for it or lose anything."""
    import os
    import signal
    import threading
    import time

    src = tmp_path / "src"
    (src / "wsuserpkg").mkdir(parents=True)
    (src / "wsuserpkg" / "__init__.py").write_text("VALUE = 'synced'\n")
    (src / "blob.bin").write_bytes(os.urandom(64 << 20))
    stores = tmp_path / "stores"
    with rm.this_host().spawn_procs(per_host={"procs": 3}) as procs:
        victim = procs.pids[1]
        outcome = {}

        def run():
            try:
                sync_workspace(procs, str(src), store_dir=str(stores), dest_root=str(tmp_path / "hosts"),
                               simulate_hosts=True, timeout=60)
            except RuntimeError as exc:
                outcome["error"] = str(exc)

        t = threading.Thread(target=run)
        t.start()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not ((stores / "host-2").exists() and any(
                f for _, _, f in os.walk(stores / "host-1"))):
            time.sleep(0.002)
        os.kill(victim, signal.SIGKILL)
        t.join(150)
        assert not t.is_alive()
        assert "host proc-1" in outcome["error"] and "proc-0" not in outcome["error"] \
            and "proc-2" not in outcome["error"], outcome
        for i in (0, 2):
            landed = tmp_path / "hosts" / f"host-{i}"
            run_dir = next(landed.iterdir())
            assert (run_dir / "blob.bin").read_bytes() == (src / "blob.bin").read_bytes()
            assert (run_dir / "wsuserpkg" / "__init__.py").read_text() == "VALUE = 'synced'\n"


@pytest.mark.timeout(300)
def test_a_host_whose_pull_fails_is_cut_out_of_the_chain(tmp_path):
    """Host 1's proc lives but its pull fails at its first chunk (its store cannot hold one: every
    fan-out folder is a file). Host 2, which pulls from host 1, is relinked to host 0 instead of
    waiting out its timeout, and only host 1 is named in the error."""
    import os
    import time

    src = tmp_path / "src"
    (src / "wsuserpkg").mkdir(parents=True)
    for i in range(20):
        (src / "wsuserpkg" / f"m{i}.py").write_text(f"V = {i}\n")
    (src / "blob.bin").write_bytes(os.urandom(9 << 20))  # three chunks: a file object too
    broken = tmp_path / "stores" / "host-1" / LAYOUT
    broken.mkdir(parents=True)
    for name in [f"{i:02x}" for i in range(256)] + ["files"]:
        (broken / name).write_text("not a folder")
    with rm.this_host().spawn_procs(per_host={"procs": 3}) as procs:
        t0 = time.monotonic()
        with pytest.raises(RuntimeError) as err:
            sync_workspace(procs, str(src), store_dir=str(tmp_path / "stores"), dest_root=str(tmp_path / "hosts"),
                           simulate_hosts=True, timeout=120)
        assert time.monotonic() - t0 < 100  # host 2 did not wait out its 120 s timeout (a loaded host has room)
        assert "host proc-1" in str(err.value) and "proc-0" not in str(err.value) \
            and "proc-2" not in str(err.value), err.value
        for i in (0, 2):
            run_dir = next((tmp_path / "hosts" / f"host-{i}").iterdir())
            assert (run_dir / "blob.bin").read_bytes() == (src / "blob.bin").read_bytes()
            assert (run_dir / "wsuserpkg" / "m19.py").read_text() == "V = 19\n"


@pytest.mark.timeout(180)
def test_syncs_again_with_a_new_dest_root_each_land_the_tree_and_a_failure_names_its_exception(tmp_path):
    """Each call is its own sync on every host: one to a new ``dest_root`` lands the whole tree there
    (not the first call's stats, 0 files), a third works as the second did, and a pull that fails in
    the worker is an error naming the exception, never a success."""
    import os

    from rlmesh.workspace import UnsafePathError

    src = tmp_path / "src"
    (src / "wsuserpkg").mkdir(parents=True)
    for i in range(5):
        (src / "wsuserpkg" / f"m{i}.py").write_text(f"V = {i}\n")
    with rm.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        for k in range(3):
            (src / "wsuserpkg" / f"new{k}.py").write_text(f"K = {k}\n")  # each call's tree is one file larger
            rows = sync_workspace(procs, str(src), store_dir=str(tmp_path / "stores"),
                                  dest_root=str(tmp_path / f"hosts{k}"), simulate_hosts=True, editable=False)
            for r in rows:
                assert r.stats.error == "" and r.stats.files == r.stats.files_written == 6 + k, (k, r)
                assert r.dest.startswith(str(tmp_path / f"hosts{k}"))
                assert len(os.listdir(os.path.join(r.dest, "wsuserpkg"))) == 6 + k
        (tmp_path / "blocked").write_text("a file where the destination's folder would go")
        with pytest.raises(RuntimeError, match="host proc-0: NotADirectoryError") as err:
            sync_workspace(procs, str(src), store_dir=str(tmp_path / "stores"), dest_root=str(tmp_path / "blocked"),
                           simulate_hosts=True, editable=False)
        assert "host proc-1: NotADirectoryError" in str(err.value)
        os.symlink("..", src / "wsuserpkg" / "up")  # the root, on paper and on disk
        os.symlink("wsuserpkg/up/..", src / "esc")  # 'wsuserpkg' on paper, the root's parent on disk
        with pytest.raises(UnsafePathError, match="'esc' -> 'wsuserpkg/up/..'"):
            sync_workspace(procs, str(src), store_dir=str(tmp_path / "stores"), dest_root=str(tmp_path / "hosts3"),
                           simulate_hosts=True, editable=False)
        assert not (tmp_path / "hosts3").exists()
