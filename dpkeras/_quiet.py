"""TensorFlow's log noise, kept out of what a dpkeras command prints.

A TensorFlow process on a machine without a GPU writes, to its standard error, lines its user
does not act on: the start-up lines (oneDNN, "Could not find cuda drivers", the CPU features,
each printed twice, once per TensorFlow library, before `absl::InitializeLog()` and so whatever
`TF_CPP_MIN_LOG_LEVEL` says), "failed call to cuInit", a ~25-line `SessionOptions` dump on a
server for each client that connects, rendezvous and dataset warnings, and "Exiting the
process" as a warning when a client ends its tasks. `dpkeras serve`, `env`, `launch` and
`bench` print what their user needs: these lines are dropped unless asked for (`--verbose`, or
`$DPKERAS_VERBOSE=1`). TensorFlow's errors other than cuInit's are kept, and so is everything
that is not TensorFlow's C++ logging (Python's warnings and tracebacks, the program's output).

Two layers, because the start-up lines ignore the level:

- `quiet_level`: `TF_CPP_MIN_LOG_LEVEL=2` for this process and its children (unless set), so
  that TensorFlow, once its logging is up, drops INFO and WARNING itself;
- `LineFilter` (and `filter_stderr`, which runs one on this process's file descriptor 2): drops
  the lines matched below from text.

A FATAL record (`F...`, such as "Check failed") is never dropped, and the filter of a process
runs in a small process of its own, which passes on what the process wrote until its end: a
process that crashes (a FATAL record aborts it) shows why. A filter in the process itself
died with it, most times before passing on its last lines.

The patterns are those of TensorFlow 2.21's C++ logging (`I1125 20:14:59.123456  1234
file.cc:12] text`; before the logging is initialised the date is 0000 and the time 00:00
followed by seconds since the epoch); tests/test_quiet.py runs TensorFlow and checks that they
still match what it prints.
"""

import os
import re
import subprocess
import sys

from dpkeras import _config

# One record of TensorFlow's C++ logging: severity, date, time, thread, file:line.
_RECORD = re.compile(r"^([IWEF])\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ [\w./-]+:\d+\] ")
_NOISE_LINES = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "To enable the following instructions:",  # the second line of cpu_feature_guard's record
)
# ERROR records that say nothing a CPU machine can act on.
_NOISE_ERRORS = re.compile(r"cuda_platform\.cc:\d+\] failed call to cuInit")
# A record followed by a multi-line dump that ends at a blank line (eager_service_impl.cc).
_DUMP = re.compile(r"SessionOptions: \S*\s*$")

LEVEL_VARIABLE = "TF_CPP_MIN_LOG_LEVEL"
QUIET_LEVEL = "2"  # TensorFlow drops INFO and WARNING, keeps ERROR and FATAL


def verbose(argument=None):
    """Whether TensorFlow's noise is shown: `argument` (`--verbose`), else `$DPKERAS_VERBOSE`,
    else False."""
    return bool(_config.setting("verbose", argument).value)


# Variables `quiet_level` set in this process's environment: not the user's (`as_given`).
_SET_HERE = set()


def quiet_level(environ=None):
    """Sets `TF_CPP_MIN_LOG_LEVEL` to 2 in `environ` (default: this process's environment,
    which children inherit) unless it is set; returns `environ`. Works for this process only
    before TensorFlow is imported. `as_given` still reports this process's environment as the
    user gave it."""
    own = environ is None
    environ = os.environ if own else environ
    if LEVEL_VARIABLE not in environ:
        environ[LEVEL_VARIABLE] = QUIET_LEVEL
        if own:
            _SET_HERE.add(LEVEL_VARIABLE)
    return environ


def as_given(name):
    """This process's `$name` as the user gave it: None if unset, or set by `quiet_level`
    (what `dpkeras env` reports, for bug reports)."""
    return None if name in _SET_HERE else os.environ.get(name)


def is_noise(line):
    """Whether one line (without its end) is TensorFlow noise, judged alone."""
    if line.startswith(_NOISE_LINES):
        return True
    record = _RECORD.match(line)
    if record is None:
        return False
    return record.group(1) in "IW" or bool(_NOISE_ERRORS.search(line))


class LineFilter:
    """Drops TensorFlow's noise from a stream of lines, a line at a time (`keep`).

    Also drops the lines of a dump that follows a dropped record (the `SessionOptions` one),
    up to and including the blank lines that end it. Counts what it drops (`dropped`).
    """

    def __init__(self):
        self.dropped = 0
        self._in_dump = False
        self._after_dump = False

    def keep(self, line):
        """Whether to keep `line` (with or without its end)."""
        text = line.rstrip("\r\n")
        if _RECORD.match(text):  # a dump holds no record: one ends it, and is judged alone
            self._in_dump = self._after_dump = False
        if self._in_dump:
            if not text:
                self._in_dump, self._after_dump = False, True
            self.dropped += 1
            return False
        if self._after_dump and not text:
            self.dropped += 1
            return False
        self._after_dump = False
        if is_noise(text):
            self._in_dump = bool(_DUMP.search(text))
            self.dropped += 1
            return False
        return True


_active = None  # this process's StderrFilter, or None

# The pump's process: the directory holding this dpkeras first on its path; it ignores the
# signals that end its parent (a terminal's Ctrl-C reaches the whole process group) and ends
# at the end of its input, when every writer has ended.
_PUMP = """
import signal, sys
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
sys.path.insert(0, sys.argv[1])
from dpkeras._quiet import pump
pump(int(sys.argv[2]), int(sys.argv[3]))
"""


def pump(read, write):
    """Copies the lines read from file descriptor `read` to `write`, but those a `LineFilter`
    drops, until the end of `read`; then closes `read`."""
    lines = LineFilter()
    pending = b""
    while True:
        chunk = os.read(read, 65536)
        if not chunk:
            break
        pending += chunk
        *whole, pending = pending.split(b"\n")
        kept = [line + b"\n" for line in whole if lines.keep(line.decode("utf-8", "replace"))]
        if kept:
            os.write(write, b"".join(kept))
    if pending and lines.keep(pending.decode("utf-8", "replace")):
        os.write(write, pending)
    os.close(read)


class StderrFilter:
    """A `LineFilter` on this process's file descriptor 2 (see `filter_stderr`), run by a
    process of its own (`pump`) that outlives this one."""

    def __init__(self):
        sys.stderr.flush()
        self._saved = os.dup(2)
        read, write = os.pipe()
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        self._pump = subprocess.Popen(
            [sys.executable, "-c", _PUMP, root, str(read), str(self._saved)],
            pass_fds=(read, self._saved),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
        )
        os.close(read)
        os.dup2(write, 2)
        os.close(write)

    def close(self, timeout=2.0):
        """Puts the real standard error back and waits (at most `timeout` seconds) for what
        was written before to be passed on. Children that inherited the filtered descriptor
        keep writing through it until they end (the pump ends after them)."""
        sys.stderr.flush()
        os.dup2(self._saved, 2)
        try:
            self._pump.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        os.close(self._saved)


def filter_stderr():
    """Quiets this process's TensorFlow (see the module) unless `$DPKERAS_VERBOSE`: sets the
    level (before TensorFlow is imported, it then drops INFO and WARNING itself) and filters
    file descriptor 2, once per process. `close()` before the process ends: `os._exit` would
    lose what the filter has not passed on.

    Returns:
        The process's `StderrFilter`, or None when verbose.

    Raises:
        ValueError: for a bad `$DPKERAS_VERBOSE`.
    """
    global _active
    if _active is None and not verbose():
        quiet_level()
        _active = StderrFilter()
    return _active


def close():
    """Ends this process's filter, if any (see `StderrFilter.close`)."""
    global _active
    if _active is not None:
        _active.close()
        _active = None
