"""The tasks of a cluster as processes of this machine: free ports, and children that end
with the process that started them."""

import ctypes
import signal
import socket
import sys


def free_ports(count):
    """`count` distinct TCP ports on 127.0.0.1 that nothing listens on now. Each is held until
    all are chosen: ports asked for one at a time can come back twice (the kernel may hand a
    port just released out again), and two tasks of one cluster on one port cannot start."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            sockets.append(s)
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on now (for several, `free_ports`)."""
    return free_ports(1)[0]


def port_in_use(port):
    """Whether another socket holds `port` of this machine (binding it on every interface, as
    TensorFlow's server does, fails)."""
    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return True
    return False


def _die_with_parent():
    """In the child before exec (Linux): SIGKILL it when the process that started it dies, so
    that even a parent killed without cleanup leaves no task behind. (Linux ties this to the
    thread that started the child: start tasks from a thread that outlives them.)"""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def child_options():
    """`subprocess.Popen` keyword arguments that tie a child's life to this process's."""
    return {"preexec_fn": _die_with_parent} if sys.platform == "linux" else {}
