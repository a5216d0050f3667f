"""Bytes on the wire per process, from the kernel's TCP counters (Linux `ss`)."""

import dataclasses
import re
import shutil
import subprocess

_PEER = re.compile(r"(\S+):(\d+)\s+(\S+):(\d+)")
_PID = re.compile(r"pid=(\d+)")
_SENT = re.compile(r"\bbytes_sent:(\d+)")
_RECEIVED = re.compile(r"\bbytes_received:(\d+)")


@dataclasses.dataclass(frozen=True)
class Traffic:
    """Bytes a process sent and received over TCP."""

    sent: int = 0
    received: int = 0

    def __add__(self, other):
        return Traffic(self.sent + other.sent, self.received + other.received)

    def __sub__(self, other):
        return Traffic(self.sent - other.sent, self.received - other.received)

    def __truediv__(self, n):
        return Traffic(self.sent / n, self.received / n)


def _connections():
    """`{(pid, local address, peer address): Traffic}` of every established TCP connection."""
    if shutil.which("ss") is None:
        raise RuntimeError(
            "Counting bytes on the wire needs Linux's `ss` (package iproute2); it is not on "
            "this machine's PATH."
        )
    out = subprocess.run(
        ["ss", "-tinpH", "state", "established"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    found = {}
    key = None
    for line in out.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():  # a connection: addresses and the owning process
            peer, pid = _PEER.search(line), _PID.search(line)
            key = None
            if peer and pid:
                key = (int(pid.group(1)), peer.group(1, 2), peer.group(3, 4))
        elif key is not None:  # its tcp_info
            sent, received = _SENT.search(line), _RECEIVED.search(line)
            found[key] = Traffic(
                int(sent.group(1)) if sent else 0, int(received.group(1)) if received else 0
            )
            key = None
    return found


def tcp_traffic(pids):
    """`{pid: Traffic}`: the bytes each process has sent and received so far on its open TCP
    connections (the kernel's `bytes_sent` / `bytes_received` of each, summed).

    Payload as TCP carries it: gRPC framing, headers and RPCs included, not the Ethernet and
    IP headers. A connection that closed is no longer counted: measure with `TrafficMeter`,
    which takes the difference over connections open at the end.

    Args:
        pids: iterable of process ids.

    Raises:
        RuntimeError: when `ss` is not available (not Linux, or iproute2 missing).
    """
    pids = set(pids)
    totals = {pid: Traffic() for pid in pids}
    for (pid, _, _), traffic in _connections().items():
        if pid in pids:
            totals[pid] += traffic
    return totals


class TrafficMeter:
    """Bytes each of some processes sent and received on TCP inside a `with` block.

    ```python
    with TrafficMeter({"client": os.getpid(), **cluster.pids()}) as meter:
        model.fit(x, y, steps_per_epoch=20)
    meter.per("client", 20)   # Traffic(sent=..., received=...) per step
    ```

    Counts the connections open when the block ends; a connection opened inside the block
    counts from zero.

    Args:
        processes: dict `{name: pid}`.
    """

    def __init__(self, processes):
        self._pids = dict(processes)
        self._start = None
        self.traffic = None  # {name: Traffic} once the block has ended

    def start(self):
        """Starts counting (what `with` does on entry); returns self."""
        self._start = _connections()
        return self

    def stop(self):
        """Stops counting and sets `traffic` (what `with` does on exit)."""
        end = _connections()
        by_pid = {pid: Traffic() for pid in self._pids.values()}
        for key, traffic in end.items():
            if key[0] in by_pid:
                by_pid[key[0]] += traffic - self._start.get(key, Traffic())
        self.traffic = {name: by_pid[pid] for name, pid in self._pids.items()}
        return self

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()
        return False

    def per(self, name, steps):
        """`name`'s traffic in the block divided by `steps`."""
        return self.traffic[name] / steps
