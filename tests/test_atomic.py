from pathlib import Path

import pytest

from batchlab.atomic import TMP_PREFIX, write_path_atomic, write_stream_atomic


def test_stream_write_replaces_whole_file(tmp_path: Path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    write_stream_atomic(target, lambda handle: handle.write(b"new contents"))
    assert target.read_bytes() == b"new contents"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_failed_write_leaves_old_file_and_no_temporary(tmp_path: Path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")

    def half_then_fail(handle):
        handle.write(b"partial")
        raise RuntimeError("checksum mismatch")

    with pytest.raises(RuntimeError, match="checksum"):
        write_stream_atomic(target, half_then_fail)
    assert target.read_bytes() == b"old"
    assert not any(p.name.startswith(TMP_PREFIX) for p in tmp_path.iterdir())


def test_path_writer_keeps_the_final_suffix(tmp_path: Path):
    seen = []

    def write_to(tmp: Path):
        seen.append(tmp)
        tmp.write_text("x")

    write_path_atomic(tmp_path / "figure.png", write_to, durable=False)
    assert seen[0].suffix == ".png" and seen[0].name.startswith(TMP_PREFIX)
    assert (tmp_path / "figure.png").read_text() == "x"


def test_os_error_text_names_the_errno_and_the_file():
    import errno

    from batchlab.atomic import os_error_text

    assert os_error_text(OSError(errno.ENOSPC, "No space left on device", "/s/log/x")) == \
        "No space left on device (ENOSPC): /s/log/x"
    assert os_error_text(OSError(errno.EROFS, "Read-only file system")) == "Read-only file system (EROFS)"
    assert os_error_text(OSError("Could not open Parquet input source 'x'")) == "Could not open Parquet input source 'x'"


def test_a_full_disk_leaves_the_old_file_and_no_temporary(tmp_path: Path):
    import errno

    target = tmp_path / "out.bin"
    target.write_bytes(b"old")

    def fill_disk(handle):
        handle.write(b"part")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        write_stream_atomic(target, fill_disk)
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["out.bin"]
