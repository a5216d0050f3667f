"""`LocalCluster`: ps and worker tasks as real `dpkeras serve` processes on loopback."""

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from dpkeras.cluster import _local
from dpkeras.cluster._local import free_ports

# The directory dpkeras is imported from (a checkout's root, or site-packages): subprocesses
# put it first on their path, so they run this dpkeras.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
READY_TIMEOUT = 180.0  # seconds for a server to print `ready` (TF import on a loaded machine)

_live = set()  # every LocalCluster not yet stopped, for the atexit safety net


def serve_command(spec, job, task, cpus=None):
    """The argv of `python -m dpkeras serve` for one task."""
    argv = [
        sys.executable,
        "-m",
        "dpkeras",
        "serve",
        "--cluster",
        json.dumps(spec),
        "--job",
        job,
        "--task",
        str(task),
    ]
    if cpus is not None:
        argv += ["--cpus", str(cpus)]
    return argv


def server_env():
    """The environment of a server subprocess: this checkout importable, TF quiet."""
    path = os.environ.get("PYTHONPATH")
    return dict(
        os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONPATH=_ROOT + (os.pathsep + path if path else "")
    )


def wait_for_line(proc, expected, timeout):
    """Reads `proc`'s stdout until a line equal to `expected`; returns the lines read.

    Raises:
        RuntimeError: if the process exits or `timeout` seconds pass first.
    """
    lines = []
    done = threading.Event()

    def read():
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if lines[-1] == expected:
                break
        done.set()

    threading.Thread(target=read, daemon=True).start()
    if not done.wait(timeout) or not lines or lines[-1] != expected:
        raise RuntimeError(
            f"no {expected!r} line within {timeout:g} s (exit status "
            f"{proc.poll()}); stdout so far: {lines}"
        )
    return lines


class LocalCluster:
    """`ps` + `workers` `dpkeras serve` processes on free loopback ports.

    Args:
        ps: int, number of ps tasks.
        workers: int, number of worker tasks.
        cpus: int or None, `--cpus` of every task.
        chief: bool, whether the spec also names a `chief` (the client's address, a free port
            that no task started here listens on: a client given this spec listens there).
    """

    def __init__(self, ps=2, workers=2, cpus=2, chief=False):
        ports = [f"127.0.0.1:{port}" for port in free_ports(int(chief) + ps + workers)]
        self.spec = {"worker": ports[len(ports) - workers :]}
        if ps:
            self.spec = {"ps": ports[int(chief) : int(chief) + ps], **self.spec}
        if chief:
            self.spec = {"chief": ports[:1], **self.spec}
        self.cpus = cpus
        self.procs = {}  # (job, index) -> Popen
        self.startup_lines = {}  # (job, index) -> stdout lines up to `ready`
        self.stderr_files = {}  # (job, index) -> file holding the latest start's stderr
        self._logs = []

    def address(self, job, task):
        """`"127.0.0.1:port"` of a task."""
        return self.spec[job][task]

    def pids(self):
        """`{"ps:0": pid, "worker:0": pid, ...}`: the process id of each running task."""
        return {f"{job}:{task}": proc.pid for (job, task), proc in self.procs.items()}

    def _start(self, job, task):
        # stderr goes to a file: an unread pipe would block a chatty server once full.
        log = tempfile.TemporaryFile(mode="w+")
        proc = subprocess.Popen(
            serve_command(self.spec, job, task, self.cpus),
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            env=server_env(),
            **_local.child_options(),
        )
        self.procs[(job, task)] = proc
        self._logs.append(log)
        self.stderr_files[(job, task)] = log
        return proc

    def stderr(self, job, task):
        """What the task (its latest start) wrote on stderr so far."""
        log = self.stderr_files[(job, task)]
        log.flush()
        log.seek(0)
        return log.read()

    def start(self):
        """Starts every task and waits for each `ready` line; returns self."""
        _live.add(self)
        try:
            for job, addresses in self.spec.items():
                for task in range(len(addresses) if job != "chief" else 0):
                    self._start(job, task)
            for (job, task), proc in self.procs.items():
                try:
                    self.startup_lines[(job, task)] = wait_for_line(proc, "ready", READY_TIMEOUT)
                except RuntimeError as e:
                    raise RuntimeError(f"{job} task {task}: {e}") from None
        except BaseException:
            self.stop()
            raise
        return self

    def kill(self, job, task, sig=signal.SIGKILL):
        """Sends `sig` (default SIGKILL: a crash) to a task; reaps it if the signal ends it.

        `signal.SIGSTOP` freezes the task (as a hung machine); `signal.SIGCONT` resumes it.
        """
        proc = self.procs[(job, task)]
        proc.send_signal(sig)
        if sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGINT):
            proc.wait(timeout=30)

    def restart(self, job, task):
        """Kills the task if it runs and starts it again on the same port (bounded wait)."""
        proc = self.procs[(job, task)]
        if proc.poll() is None:
            self.kill(job, task)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the port can linger briefly after a kill
            try:
                with socket.socket() as s:
                    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    s.bind(("127.0.0.1", int(self.address(job, task).rsplit(":", 1)[1])))
                break
            except OSError:
                time.sleep(0.2)
        self.startup_lines[(job, task)] = wait_for_line(
            self._start(job, task), "ready", READY_TIMEOUT
        )

    def stop(self):
        """Stops every task (SIGCONT, then SIGKILL) and reaps it."""
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    proc.send_signal(signal.SIGCONT)
                    proc.kill()
                except ProcessLookupError:
                    pass
        for proc in self.procs.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            if proc.stdout is not None:
                proc.stdout.close()
        for log in self._logs:
            log.close()
        self._logs.clear()
        _live.discard(self)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False


@atexit.register
def _stop_all():
    for cluster in list(_live):
        cluster.stop()
