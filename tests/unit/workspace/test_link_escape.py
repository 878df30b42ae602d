"""Symlinks that look inside the root on paper but lead outside it on disk (issue 37, item 5).

``d/up -> ..`` is the root; ``esc -> d/up/..`` is ``d`` on paper and the root's parent on disk.
Each check here resolves links as the kernel does: through the tree's other links (the manifest,
both sides) and through what is on the receiver's disk (materialise)."""

import os
import stat

import pytest

from rlmesh.workspace import ChunkStore, TreeManifest, UnsafePathError, build_manifest, materialise
from rlmesh.workspace.manifest import Entry, Kind
from rlmesh.workspace.store import STATE_FILE


def test_the_sender_refuses_a_chain_of_links_that_leads_out(tmp_path):
    (tmp_path / "d").mkdir()
    os.symlink("..", tmp_path / "d" / "up")
    os.symlink("d/up/..", tmp_path / "esc")
    with pytest.raises(UnsafePathError, match=r"'esc' -> 'd/up/\.\.' .*outside"):
        build_manifest(str(tmp_path))
    os.unlink(tmp_path / "esc")
    os.symlink("d/up/d/up/d", tmp_path / "fine")  # through the same link, staying inside: synced
    assert {e.path for e in build_manifest(str(tmp_path)).entries} == {"d", "d/up", "fine"}


@pytest.mark.parametrize("entries", [
    [Entry("d", Kind.DIR), Entry("d/up", Kind.SYMLINK, target=".."), Entry("esc", Kind.SYMLINK, target="d/up/..")],
    [Entry("l", Kind.SYMLINK, target="m/.."), Entry("m", Kind.SYMLINK, target=".")],  # the link it needs comes later
    [Entry("s", Kind.SYMLINK, target="."), Entry("s/l", Kind.SYMLINK, target="../x")],  # out through its own folder
], ids=["through-a-link", "link-made-later", "inside-a-linked-folder"])
def test_the_receiver_refuses_a_hostile_manifest_before_writing(tmp_path, entries):
    with pytest.raises(UnsafePathError, match="outside the workspace root"):
        TreeManifest.from_json(TreeManifest(entries).to_json())


def test_a_loop_of_links_is_not_an_escape():
    TreeManifest.from_json(TreeManifest([Entry("a", Kind.SYMLINK, target="b"), Entry("b", Kind.SYMLINK, target="a")]).to_json())


def _dest_with_an_escaping_link(tmp_path):
    """A destination an older tree left with ``esc`` leading to its parent (``outside``)."""
    outside = tmp_path / "outside"
    dest = outside / "dest"
    dest.mkdir(parents=True)
    os.chmod(outside, 0o755)
    old = TreeManifest([Entry("esc", Kind.SYMLINK, 0o777, target="..")])
    os.symlink("..", dest / "esc")
    (dest / STATE_FILE).write_bytes(old.to_json())
    return outside, dest


def test_a_folder_replacing_a_link_never_changes_a_mode_outside(tmp_path):
    outside, dest = _dest_with_an_escaping_link(tmp_path)
    materialise(TreeManifest([Entry("esc", Kind.DIR, 0o777)]), ChunkStore(str(tmp_path / "store")), str(dest))
    assert stat.S_IMODE(os.stat(outside).st_mode) == 0o755
    assert not os.path.islink(dest / "esc") and stat.S_IMODE(os.stat(dest / "esc").st_mode) == 0o777


def test_a_link_is_resolved_against_what_is_on_disk(tmp_path):
    """``l -> x/..`` is the root whatever the tree says of ``x``; on this disk ``x`` is a link to the
    root (not in the tree), so ``l`` leads to the root's parent: removed and refused."""
    dest = tmp_path / "dest"
    dest.mkdir()
    os.symlink(".", dest / "x")
    with pytest.raises(UnsafePathError, match=r"'l' -> 'x/\.\.' resolves to .* outside"):
        materialise(TreeManifest([Entry("l", Kind.SYMLINK, 0o777, target="x/..")]), ChunkStore(str(tmp_path / "s")),
                    str(dest))
    assert not os.path.lexists(dest / "l")
