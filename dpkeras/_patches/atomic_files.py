"""Files that are at every moment either their old content or their new content.

A writer writes a temporary sibling of the target (same directory, so the same file system),
flushes it to disk, renames it over the target (`os.replace`, atomic on POSIX and Windows) and
flushes the directory entry. A process killed at any point leaves the target as it was, plus
at most one temporary sibling, which `remove_stale_temporaries` deletes once the process that
wrote it is gone (its pid is part of the name).

This module imports only the standard library (tests/test_atomic_files.py checks it).
"""

import contextlib
import json
import os
import shutil

TMP_TAG = ".dpkeras-tmp-"


def fsync_file(path):
    """Flushes the content of the file at `path` to disk."""
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


def fsync_dir(path):
    """Flushes the entries of directory `path` (a rename) to disk, where the OS allows it."""
    try:
        fd = os.open(path or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _split(path, suffix):
    head, tail = os.path.split(os.fspath(path))
    if suffix and not tail.endswith(suffix):
        raise ValueError(
            f"The file name must end with the suffix {suffix!r}. Received: path={os.fspath(path)!r}"
        )
    return head, tail[: len(tail) - len(suffix)]


def temporary_sibling(path, suffix=""):
    """A new temporary name next to `path`, ending with `suffix` (which `path` ends with).

    Args:
        path: str or os.PathLike, the target file.
        suffix: str, kept at the end of the temporary name (Keras checks `.keras` /
            `.weights.h5`). Defaults to "".

    Returns:
        `<dir>/.<name without suffix>.dpkeras-tmp-<pid>-<random><suffix>`.
    """
    head, stem = _split(path, suffix)
    token = f"{os.getpid()}-{os.urandom(4).hex()}"  # the pid first: remove_stale_temporaries
    return os.path.join(head, f".{stem}{TMP_TAG}{token}{suffix}")


def _process_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temporaries(path, suffix=""):
    """Removes temporary siblings of `path` left by processes that no longer run."""
    head, stem = _split(path, suffix)
    prefix = f".{stem}{TMP_TAG}"
    try:
        names = os.listdir(head or ".")
    except OSError:
        return
    for name in names:
        if not (name.startswith(prefix) and name.endswith(suffix)):
            continue
        pid = name[len(prefix) : len(name) - len(suffix)].split("-")[0]
        if pid.isdigit() and int(pid) != os.getpid() and not _process_alive(int(pid)):
            with contextlib.suppress(OSError):
                os.remove(os.path.join(head, name))


def write(write_to, path, suffix=""):
    """Calls `write_to(temporary_path)`, then renames the temporary file over `path`.

    If `write_to` raises, the temporary file is removed and `path` is unchanged.

    Args:
        write_to: callable taking one str, the path to write.
        path: str or os.PathLike, the target.
        suffix: str, the ending the temporary name must keep. Defaults to "".

    Returns:
        What `write_to` returned.
    """
    path = os.fspath(path)
    remove_stale_temporaries(path, suffix)
    tmp = temporary_sibling(path, suffix)
    try:
        result = write_to(tmp)
        fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
    fsync_dir(os.path.dirname(path))
    return result


def write_json(path, content):
    """Writes `json.dumps(content)` to `path` atomically."""
    text = json.dumps(content)

    def write_to(tmp):
        with open(tmp, "w") as f:
            f.write(text)

    write(write_to, path)


def copy(source, target):
    """Copies the file `source` to `target` atomically."""
    write(lambda tmp: shutil.copyfile(source, tmp), target)
