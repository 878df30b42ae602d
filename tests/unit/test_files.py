"""write_atomically: a reader sees the old file or the new one, and a refused write names its file.

The full disk is a real one: a small tmpfs (mounting needs root, as the suite's other disk tests)."""

from __future__ import annotations

import errno
import os
import subprocess

import pytest

from rlmesh.errors import storage_problem
from rlmesh.files import write_atomically


def test_the_file_is_replaced_whole_with_the_mode_asked(tmp_path):
    path = tmp_path / "state.json"
    write_atomically(path, "old")
    write_atomically(path, b"new", private=True)
    assert path.read_text() == "new" and os.stat(path).st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temporary file left


def test_a_full_disk_names_the_file_and_leaves_the_old_one(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)],
                                           capture_output=True).returncode != 0:
        pytest.skip("needs a tmpfs of its own (mount, as root)")
    try:
        path = disk / "run.json"
        write_atomically(path, "old")
        # write() and close() raise without a file name: the error names the file all the same
        with pytest.raises(OSError) as caught:
            write_atomically(path, "x" * (1 << 20))
        assert caught.value.errno == errno.ENOSPC and caught.value.filename == str(path)
        assert str(storage_problem(caught.value)).startswith(f"no space left on device writing {path}: ")
        assert path.read_text() == "old" and [p.name for p in disk.iterdir()] == ["run.json"]
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_an_unwritable_folder_names_the_file(tmp_path):
    missing = tmp_path / "gone" / "x.json"
    with pytest.raises(FileNotFoundError) as caught:
        write_atomically(missing, "x")
    assert caught.value.filename == str(missing)
