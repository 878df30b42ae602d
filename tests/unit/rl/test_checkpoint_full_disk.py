"""A checkpoint save on a full disk: an OSError naming the checkpoint's path, and no torn file kept."""

import errno

import pytest
import torch

from rlmesh.errors import storage_problem
from rlmesh.rl import checkpoint


def test_a_save_that_finds_the_disk_full_names_the_file_and_leaves_nothing(tmp_path, monkeypatch):
    def full(state, f):  # what torch.save does when the disk fills: its writer's error, the OSError as context
        f.write(b"partial")
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0") from None

    monkeypatch.setattr(torch, "save", full)
    path = tmp_path / "ck" / checkpoint.name_for(3)
    with pytest.raises(OSError) as err:
        checkpoint.write(path, {"w": torch.zeros(2)}, 3, 3)
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(path)
    assert str(storage_problem(err.value)).startswith(f"no space left on device writing {path}: free space")
    assert list((tmp_path / "ck").iterdir()) == []
