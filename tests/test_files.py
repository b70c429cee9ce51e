"""The one atomic-output path: whole files or none, and one-line errors naming path and reason."""

import errno
import os

import pytest

from budgetplan.errors import InvalidParameterError, OutputError
from budgetplan.util import fileio as _files
from budgetplan.util.fileio import atomic_output, check_writable, remove_stale_temporaries, write_atomic


def _disk_full(*args):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


@pytest.mark.parametrize("where", ["_create", "_commit"])
def test_a_full_disk_keeps_the_old_file_and_leaves_nothing(tmp_path, monkeypatch, where):
    target = tmp_path / "plan.json"
    target.write_text("old")
    monkeypatch.setattr(_files, where, _disk_full)
    with pytest.raises(OutputError, match=r"cannot write .*plan\.json: No space left on device"):
        write_atomic(target, "new")
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["plan.json"]


def test_an_interrupted_writer_leaves_no_temporary_file(tmp_path):
    with pytest.raises(KeyboardInterrupt), atomic_output(tmp_path / "model.pt") as tmp:
        tmp.write_bytes(b"half")
        raise KeyboardInterrupt
    assert os.listdir(tmp_path) == []


def test_the_temporary_file_is_created_up_front_with_usual_permissions(tmp_path):
    with atomic_output(tmp_path / "x.bin") as tmp:
        assert tmp.exists() and tmp.stat().st_size == 0 and tmp.name.endswith(".tmp")
        tmp.write_bytes(b"data")
    mask = os.umask(0)
    os.umask(mask)
    assert (tmp_path / "x.bin").stat().st_mode & 0o777 == 0o666 & ~mask


def test_names_at_and_over_the_file_system_limit(tmp_path):
    longest = tmp_path / ("n" * 250 + ".json")  # its temporary name must fit too
    write_atomic(longest, "{}")
    assert longest.read_text() == "{}" and len(os.listdir(tmp_path)) == 1
    with pytest.raises(InvalidParameterError, match="longer than the file system allows"):
        write_atomic(tmp_path / ("n" * 256), "{}")


@pytest.mark.parametrize("bad, fragment", [("", "output path is empty"), (".", "is a directory"),
                                           ("nope/x.json", "does not exist")])
def test_bad_destinations_are_refused_before_anything_is_written(tmp_path, monkeypatch, bad, fragment):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InvalidParameterError, match=fragment):
        write_atomic(bad, "x")
    assert os.listdir(tmp_path) == []


def test_non_ascii_text_is_written_as_utf8(tmp_path):
    write_atomic(tmp_path / "s.txt", "Prüfung ✓\n")
    assert (tmp_path / "s.txt").read_bytes() == "Prüfung ✓\n".encode()


def test_check_writable_probes_the_nearest_existing_directory(tmp_path, monkeypatch):
    check_writable(tmp_path / "a" / "b")  # creates nothing
    assert os.listdir(tmp_path) == []
    monkeypatch.setattr(_files, "_create", lambda p: (_ for _ in ()).throw(
        PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(p))))
    with pytest.raises(OutputError, match=r"cannot write .*a/b: Permission denied"):
        check_writable(tmp_path / "a" / "b")
    with pytest.raises(InvalidParameterError, match="longer than the file system allows"):
        check_writable(tmp_path / ("b" * 300) / "c")
    (tmp_path / "f").write_text("")
    with pytest.raises(InvalidParameterError, match="not a directory"):
        check_writable(tmp_path / "f")


def test_only_our_stale_temporaries_are_removed(tmp_path):
    ours = tmp_path / ".model.pt.0123456789abcdef.tmp"
    theirs = [tmp_path / ".notes.tmp", tmp_path / "model.pt.tmp", tmp_path / ".x.0123.tmp"]
    for p in [ours, *theirs]:
        p.write_text("")
    assert remove_stale_temporaries(tmp_path) == [ours.name]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in theirs)


def test_a_fifo_is_written_through_never_replaced(tmp_path):
    import stat
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    write_atomic(fifo, "through the pipe\n")
    reader.join(timeout=10)
    assert got == [b"through the pipe\n"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and os.listdir(tmp_path) == ["pipe"]


def test_dev_null_is_written_through_and_stays_a_device():
    import stat

    before = os.stat("/dev/null")
    write_atomic("/dev/null", "discarded\n")
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_ino == before.st_ino


def test_a_device_that_refuses_the_bytes_is_a_clean_error(monkeypatch, tmp_path):
    # /dev/full, emulated: a character device whose writes fail with ENOSPC (never the real one)
    monkeypatch.setattr(_files, "_written_through", lambda path: True)
    monkeypatch.setattr(_files.os, "write", _disk_full)
    target = tmp_path / "full"
    target.write_text("")
    with pytest.raises(OutputError, match=r"cannot write .*full: No space left on device"):
        write_atomic(target, "x")


def test_a_symlink_is_followed_its_target_replaced_atomically(tmp_path):
    (tmp_path / "target.json").write_text("old")
    (tmp_path / "link.json").symlink_to("target.json")
    write_atomic(tmp_path / "link.json", "new")
    assert (tmp_path / "link.json").is_symlink() and os.readlink(tmp_path / "link.json") == "target.json"
    assert (tmp_path / "target.json").read_text() == "new"
    assert sorted(os.listdir(tmp_path)) == ["link.json", "target.json"]
    (tmp_path / "dangling").symlink_to("created.json")
    write_atomic(tmp_path / "dangling", "made")
    assert (tmp_path / "dangling").is_symlink() and (tmp_path / "created.json").read_text() == "made"


def test_a_trailing_slash_names_a_directory_not_a_file(tmp_path):
    with pytest.raises(InvalidParameterError, match="ends in '/'"):
        write_atomic(str(tmp_path / "dir") + "/", "x")
    assert os.listdir(tmp_path) == []


def test_dev_stdout_is_this_process_s_descriptor(tmp_path):
    assert _files._descriptor(_files.Path("/dev/stdout")) == 1
    assert _files._descriptor(_files.Path("/proc/self/fd/2")) == 2
    assert _files._descriptor(tmp_path / "plain") is None


def test_a_saved_state_has_the_same_bytes_whatever_the_temporary_name(tmp_path):
    torch = pytest.importorskip("torch")
    from budgetplan.util.fileio import file_sha256, torch_save

    state = {"w": torch.arange(6.0).reshape(2, 3), "step": 3}
    digests = set()
    for name in ("a", "model.pt.tmp-1234-abcdef"):
        (tmp_path / name).mkdir()
        with atomic_output(tmp_path / name / "model.pt") as tmp:
            torch_save(state, tmp)
        digests.add(file_sha256(tmp_path / name / "model.pt"))
    assert len(digests) == 1  # the archive's folder is not named after the temporary file
    assert torch.load(tmp_path / "a" / "model.pt")["w"].equal(state["w"])
