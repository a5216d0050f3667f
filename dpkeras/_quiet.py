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

A training script's own TensorFlow logging is left alone, but for two records dpkeras causes:
a client connected to a cluster whose task dies gets, during the failing step, a WARNING
"Unable to destroy remote tensor handles" holding the step's error with its gRPC details
(~15 lines, more than once), before `TaskFailedError` names the task; and, when `fit` goes on
without a lost worker, an ERROR "Unable to close remote context ... for worker" (3 lines). Its
level cannot be changed once TensorFlow is up (the client imported it before connecting), so
`filter_client_stderr` drops those records (`is_client_noise`) from the client's descriptor 2
through a child process, which outlives a client that crashes and passes on its last lines.

A program run through absl's `app.run` (TF1 programs are) is as quiet as without it. `app.run`
raises Python's root logger to INFO by default (`--verbosity` not given), so INFO records of
loggers without a level of their own appear with it: dpkeras's own, and TensorFlow's ~25-line
"default session config" dump (through absl's own logger) when dpkeras connects to a
cluster. `AbslDefaultFilter` drops those (`shown_by_absl_default`): on the `dpkeras` logger
always (`import dpkeras` adds it); TensorFlow's only while dpkeras connects
(`tensorflow_info_dropped`). A `--verbosity` given, or a level set on the logger, shows them.

The patterns are those of TensorFlow 2.21's C++ logging (`I1125 20:14:59.123456  1234
file.cc:12] text`; before the logging is initialised the date is 0000 and the time 00:00
followed by seconds since the epoch); tests/test_quiet.py runs TensorFlow and checks that they
still match what it prints.
"""

import contextlib
import logging
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
# A record whose message opens a protocol buffer in text format ("default session config:
# device_count {", a record of Python's logging in absl's format): its message goes on in that
# format (fields, nested messages, closing braces) up to the blank line that ends it.
_PROTO_OPEN = re.compile(r" \{\s*$")
_PROTO_LINE = re.compile(r"\s*([A-Za-z_][\w.]*(: .*| \{)|\})\s*$")
# The lines of a TensorFlow error status after its first (root errors, gRPC details, nodes): a
# record whose message is a status goes on over lines like these, which go with it. A node line
# may end the status and carry its payloads after it (`absl::Status::ToString`: "\t [[{{node
# n}}]] [type.googleapis.com/tensorflow.DerivedStatus='']", a step failing for a lost ps). A
# remote task's status held in it is cut at 3,072 characters, wherever that falls, and goes on
# after "... [truncated]" ("%.3072s ... [truncated]" in libtensorflow_cc).
_STATUS_LINE = re.compile(
    r"\s+\(\d+\) [A-Z_]+: |Additional GRPC error information from |:[A-Z_]+:"
    r"|\d+ (successful operations|derived errors ignored|root error\(s\) found)\.$"
    r"|\s*\[\[.*\]\]( \[[\w./-]+='.*'\])*$|.* \.\.\. \[truncated\]$"
)
# In a client, by severity: the WARNING that TensorFlow logs during a step failing for a lost
# task, and the ERROR it logs when dpkeras leaves a lost worker out of the client's connection
# (`dpkeras.cluster._connect.leave_out`: the context there cannot be closed, the task is gone).
_CLIENT_NOISE = {
    "W": re.compile(r"remote_tensor_handle_data\.cc:\d+\] Unable to destroy remote tensor handles"),
    "E": re.compile(r"context\.cc:\d+\] Unable to close remote context with ID \d+ for worker: "),
}


def shown_by_absl_default(logger):
    """Whether `logger`'s records below WARNING show only because absl's `app.run` raised
    Python's root logger to INFO (see the module): absl's handler is on the root logger, its
    `--verbosity` was not given and is INFO (absl's default under `app.run`), and neither
    `logger` nor a parent of it below the root has a level of its own."""
    absl_logging, absl_flags = sys.modules.get("absl.logging"), sys.modules.get("absl.flags")
    if absl_logging is None or absl_flags is None:
        return False  # absl not imported: nothing of absl's raised the root
    if absl_logging.get_absl_handler() not in logging.root.handlers:
        return False
    try:
        verbosity = absl_flags.FLAGS["verbosity"]
    except KeyError:
        return False
    if verbosity.present or verbosity.value != 0 or logging.root.level != logging.INFO:
        return False
    while logger is not None and logger is not logging.root:
        if logger.level != logging.NOTSET:
            return False
        logger = logger.parent
    return True


class AbslDefaultFilter(logging.Filter):
    """On a logger: drops its records below WARNING that show only because absl's `app.run`
    raised the root logger to INFO (`shown_by_absl_default`); keeps every other record.

    Args:
        files: str or None; with it, only records logged from a file whose path holds it are
            judged (the others are kept).
    """

    def __init__(self, files=None):
        super().__init__()
        self._files = files

    def filter(self, record):
        if record.levelno >= logging.WARNING:
            return True
        if self._files is not None and self._files not in record.pathname:
            return True
        return not shown_by_absl_default(logging.getLogger(record.name))


ABSL_DEFAULT = AbslDefaultFilter()
_TENSORFLOW_S = AbslDefaultFilter(files=f"{os.sep}tensorflow{os.sep}")


def quiet_own_logger():
    """Adds `ABSL_DEFAULT` to the `dpkeras` logger, once (`import dpkeras` calls it)."""
    logging.getLogger("dpkeras").addFilter(ABSL_DEFAULT)  # a filter is added once


@contextlib.contextmanager
def tensorflow_info_dropped():
    """Within the block (a call of dpkeras's into TensorFlow), TensorFlow's records that
    `AbslDefaultFilter` drops are dropped: those logged from TensorFlow's files through the
    `tensorflow` logger or absl's (`absl.logging`, which TensorFlow uses too)."""
    loggers = [logging.getLogger(name) for name in ("tensorflow", "absl")]
    for logger in loggers:
        logger.addFilter(_TENSORFLOW_S)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(_TENSORFLOW_S)


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


def is_client_noise(line):
    """Whether one line starts a record a client need not see when a task dies (see the
    module): TensorFlow's WARNING "Unable to destroy remote tensor handles", and its ERROR
    "Unable to close remote context" for a worker left out."""
    record = _RECORD.match(line)
    pattern = None if record is None else _CLIENT_NOISE.get(record.group(1))
    return pattern is not None and bool(pattern.search(line))


class LineFilter:
    """Drops TensorFlow's noise from a stream of lines, a line at a time (`keep`).

    Also drops the lines that go on a dropped record, so that a multi-line record goes whole: a
    dump that follows it (the `SessionOptions` one), up to and including the blank lines that
    end it; the rest of a protocol buffer in text format that it opens (`_PROTO_OPEN`, such
    as TensorFlow's "default session config" under absl), line by line while they are in
    that format, up to the blank line that ends it; and the rest of an error status it holds
    (`_STATUS_LINE`). Counts what it drops (`dropped`).

    Args:
        noise: callable, whether a line starts noise (`is_noise`, the default, or
            `is_client_noise`).
    """

    def __init__(self, noise=is_noise):
        self.dropped = 0
        self._noise = noise
        self._in_dump = False
        self._after_dump = False
        self._in_status = False
        self._in_proto = False

    @property
    def in_record(self):
        """Whether the lines of a dropped record go on (its dump or its status): the next line
        is judged with them."""
        return self._in_dump or self._after_dump or self._in_status or self._in_proto

    def keep(self, line):
        """Whether to keep `line` (with or without its end)."""
        text = line.rstrip("\r\n")
        if _RECORD.match(text):  # a dump or a status holds no record: one ends it, judged alone
            self._in_dump = self._after_dump = self._in_status = self._in_proto = False
        if self._in_proto:
            self._in_proto = bool(text) and bool(_PROTO_LINE.match(text))
            if self._in_proto or not text:  # its lines, and the blank line that ends it
                self.dropped += 1
                return False
        if self._in_status:
            if _STATUS_LINE.match(text):
                self.dropped += 1
                return False
            self._in_status = False
        if self._in_dump:
            if not text:
                self._in_dump, self._after_dump = False, True
            self.dropped += 1
            return False
        if self._after_dump and not text:
            self.dropped += 1
            return False
        self._after_dump = False
        if self._noise(text):
            self._in_dump = bool(_DUMP.search(text))
            self._in_proto = not self._in_dump and bool(_PROTO_OPEN.search(text))
            self._in_status = not (self._in_dump or self._in_proto)
            self.dropped += 1
            return False
        return True


def pump(read, write, lines=None):
    """Passes the lines read from file descriptor `read` that `lines` (a `LineFilter`, by
    default a new one) keeps on to descriptor `write`, until the end of `read`. Once `write`
    fails (closed), it reads on without writing, so that the writers never block or fail.

    A line is judged whole, except one whose start cannot be TensorFlow's (`_may_be_noise`):
    that start is passed on at once and the rest of the line follows it unjudged, so that a
    progress bar redrawn with "\\r" (tqdm writes to standard error) shows as it is drawn.
    """
    lines = LineFilter() if lines is None else lines
    pending = b""  # the start of a line, not judged yet
    passing = False  # the start of the current line was passed on: pass the rest of it
    writable = True
    while True:
        chunk = os.read(read, 65536)
        if not chunk:
            break
        out = []
        if passing:
            rest, end, chunk = chunk.partition(b"\n")
            out.append(rest + end)
            passing = not end
        pending += chunk
        *complete, pending = pending.split(b"\n")
        out += [line + b"\n" for line in complete if lines.keep(line.decode("utf-8", "replace"))]
        if pending and not _may_be_noise(pending, lines):
            lines.keep(pending.decode("utf-8", "replace"))  # a line that is not noise
            out.append(pending)
            pending, passing = b"", True
        writable = writable and _write_all(write, b"".join(out))
    if pending and lines.keep(pending.decode("utf-8", "replace")) and writable:
        _write_all(write, pending)


def _may_be_noise(start, lines):
    """Whether the start of a line (bytes) may begin what `lines` drops: a record of
    TensorFlow's logging (a severity letter and a digit), a start-up line, or any line while a
    dropped record's dump or status goes on."""
    if lines.in_record:
        return True
    if start[:1] in (b"I", b"W", b"E", b"F") and (len(start) < 2 or start[1:2].isdigit()):
        return True
    text = start.decode("utf-8", "replace")
    return any(n.startswith(text) or text.startswith(n) for n in _NOISE_LINES)


def _write_all(fd, data):
    try:
        while data:
            data = data[os.write(fd, data) :]
    except OSError:
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


_client_pump = None  # the child process of `filter_client_stderr`, or None

# The child's program: it reads the client's standard error from its own (a pipe) until every
# writer closed it, and passes on what `LineFilter(is_client_noise)` keeps. Ctrl-C in a
# terminal, or a scheduler's SIGTERM, reaches every process of the group: the child outlives
# them, to pass on the client's last lines (its traceback), and ends when the client does.
_PUMP_PROGRAM = """
import signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
sys.path.insert(0, sys.argv[1])
from dpkeras import _quiet
_quiet.pump(0, 1, _quiet.LineFilter(_quiet.is_client_noise))
"""


def filter_client_stderr():
    """In a process that connects to a cluster, unless `$DPKERAS_VERBOSE`: drops, from its file
    descriptor 2, the records of `is_client_noise` (see the module), once per process.

    A child process reads what the process writes there and passes the rest on, in order: it
    is not lost when the process ends by `os._exit`, a signal or a crash (a thread of this
    process would die with it, and lose TensorFlow's last FATAL line). Nothing is done when
    `filter_stderr` already filters this process (it drops these records too).

    Returns:
        The child's `subprocess.Popen`, or None when verbose or already filtered.

    Raises:
        ValueError: for a bad `$DPKERAS_VERBOSE`.
    """
    global _client_pump
    if _client_pump is not None or _active is not None or verbose():
        return _client_pump
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this dpkeras's
    sys.stderr.flush()
    read, write = os.pipe()
    try:
        _client_pump = subprocess.Popen(
            [sys.executable, "-c", _PUMP_PROGRAM, root], stdin=read, stdout=2, stderr=2
        )
        os.dup2(write, 2)
    finally:
        os.close(read)
        os.close(write)
    return _client_pump
