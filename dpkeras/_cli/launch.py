"""`dpkeras launch`: one program in every task of a cluster on this machine.

```
dpkeras launch --ps 1 --workers 2 [--cpus 2] [--client chief|master|worker] -- python train.py
dpkeras launch --flags --ps 1 --workers 2 -- python train.py   # TF1's flags, no TF_CONFIG
```

Starts every task of a cluster on free ports of 127.0.0.1, each running the same command with
its own `TF_CONFIG` (as Kubeflow's TFJob sets it) and `DPKERAS_CPUS`: the client (the `chief`,
or `master`, or with `--client worker` worker 0) trains; the ps and other worker tasks serve
from `dpkeras.cluster.join()` (or the first `dpkeras.scope()`) in their script, and end when
the client finishes. With `--flags`, each task's command gets TF1's flags instead of
`TF_CONFIG` (`--job_name=ps --task_index=0 --ps_hosts=... --worker_hosts=...`, `task_flags`),
for a script that passes them to `dpkeras.cluster.join`; worker 0 is then the client. Streams
every task's output, each line prefixed by its task (`[ps:0]
...`), and exits with the client's status. Every task it started is stopped when it exits, on
Ctrl-C and on SIGTERM.
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

from dpkeras import _cli, _config, _quiet
from dpkeras.cluster import _local

_PREFIX = "dpkeras launch"
_GRACE = 30.0  # seconds the other tasks get to end by themselves after the client


def _cluster(args):
    ports = iter(_local.free_ports(1 + args.ps + args.workers))
    spec = {}
    if args.client in ("chief", "master"):
        spec[args.client] = [f"127.0.0.1:{next(ports)}"]
    if args.ps:
        spec["ps"] = [f"127.0.0.1:{next(ports)}" for _ in range(args.ps)]
    spec["worker"] = [f"127.0.0.1:{next(ports)}" for _ in range(args.workers)]
    return spec


def task_flags(spec, job, index):
    """TF1's flags for task `job`:`index` of `spec` (TensorFlow's `mnist_replica.py`), as a
    list of arguments: `--job_name`, `--task_index`, `--ps_hosts` (only with ps tasks) and
    `--worker_hosts`."""
    flags = [f"--job_name={job}", f"--task_index={index}"]
    flags += [f"--ps_hosts={','.join(spec['ps'])}"] if spec.get("ps") else []
    return flags + [f"--worker_hosts={','.join(spec['worker'])}"]


def _pump(stream, prefix, out, lines):
    """Copies `stream` to `out`, each line prefixed, but those `lines` (a
    `dpkeras._quiet.LineFilter`, or None to keep all) drops."""
    for line in iter(stream.readline, ""):
        if lines is not None and not lines.keep(line):
            continue
        out.write(f"{prefix} {line}" if line.endswith("\n") else f"{prefix} {line}\n")
        out.flush()
    stream.close()


def _start(command, spec, job, index, cpus, filters, flags=False):
    """Starts one task, with its `TF_CONFIG` or, with `flags`, TF1's flags (`task_flags`); its
    output's filters (`dpkeras._quiet.LineFilter`) are added to `filters`, unless verbose."""
    tf_config = _config.VARIABLES["tf_config"]
    env = dict(
        os.environ,
        **{
            tf_config: json.dumps({"cluster": spec, "task": {"type": job, "index": index}}),
            _config.VARIABLES["cpus"]: str(cpus),
        },
        PYTHONUNBUFFERED="1",
    )
    if flags:
        del env[tf_config]
        command = [*command, *task_flags(spec, job, index)]
    verbose = _quiet.verbose()
    if not verbose:
        _quiet.quiet_level(env)
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        **_local.child_options(),
    )
    prefix = f"[{job}:{index}]"
    pumps = []
    for stream, out in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr)):
        lines = None if verbose else _quiet.LineFilter()
        filters += [lines] if lines is not None else []
        pumps.append(threading.Thread(target=_pump, args=(stream, prefix, out, lines), daemon=True))
    for pump in pumps:
        pump.start()
    return proc, pumps


def _stop(procs, grace, stopped):
    """Waits up to `grace` seconds for every process, then SIGTERMs and SIGKILLs the rest,
    adding their keys to `stopped`."""
    deadline = time.monotonic() + grace
    for proc in procs.values():
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for signum, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        alive = [p for p in procs.values() if p.poll() is None]
        stopped.update(key for key, p in procs.items() if p in alive)
        for proc in alive:
            proc.send_signal(signum)
        for proc in alive:
            try:
                proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                pass


def launch(argv=None):
    """`dpkeras launch`: returns the client's exit status."""
    parser = argparse.ArgumentParser(
        prog="dpkeras launch",
        description="Run one program in every task of a cluster on this machine (loopback), "
        "each with its TF_CONFIG, as Kubeflow's TFJob does; exit with the client's status.",
    )
    parser.add_argument("--ps", type=int, default=1, help="ps tasks (default: 1)")
    parser.add_argument("--workers", type=int, default=2, help="worker tasks (default: 2)")
    parser.add_argument(
        "--cpus", type=int, default=1, help="logical CPU devices per task (default: 1)"
    )
    parser.add_argument(
        "--client",
        choices=("chief", "master", "worker"),
        default=None,
        help="the client's task: a chief (default), a master (its older name), or worker 0 "
        "(no chief: worker 0 leads and computes)",
    )
    parser.add_argument(
        "--flags",
        action="store_true",
        help="give each task TF1's flags (--job_name, --task_index, --ps_hosts, "
        "--worker_hosts) after the command instead of TF_CONFIG; worker 0 is the client",
    )
    _cli.add_verbose_argument(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the program to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    problems = [
        f"--{name} must be >= {low}. Received: {value}"
        for name, value, low in (
            ("ps", args.ps, 0),
            ("workers", args.workers, 1),
            ("cpus", args.cpus, 1),
        )
        if value < low
    ]
    if not command:
        problems.append("no program: give it after --, such as `-- python train.py`")
    if args.flags and args.client not in (None, "worker"):
        problems.append(
            f"--flags makes worker 0 the client (TF1's flags name ps and worker tasks only). "
            f"Received: --client {args.client}"
        )
    args.client = args.client or ("worker" if args.flags else "chief")
    if problems:
        print(f"{_PREFIX}: error: {'; '.join(problems)}", file=sys.stderr, flush=True)
        return 2
    spec = _cluster(args)
    client = (args.client, 0)  # chief, master, or worker 0
    tasks = [(job, i) for job, addresses in spec.items() for i in range(len(addresses))]
    print(
        f"{_PREFIX}: {', '.join(f'{j}:{i}' for j, i in tasks)} on 127.0.0.1; the client is "
        f"{client[0]}:{client[1]}",
        flush=True,
    )
    procs, pumps, stopped, filters = {}, [], set(), []
    interrupted = []

    def interrupt(signum, _frame):
        interrupted.append(signum)
        for key, proc in procs.items():
            if proc.poll() is None:
                stopped.add(key)
                proc.send_signal(signal.SIGTERM)

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        for job, index in tasks:
            procs[(job, index)], task_pumps = _start(
                command, spec, job, index, args.cpus, filters, args.flags
            )
            pumps += task_pumps
        status = procs[client].wait()
        _stop(procs, 0.0 if interrupted else _GRACE, stopped)
    finally:
        _stop(procs, 0.0, stopped)
        for s, handler in previous.items():
            signal.signal(s, handler)
        for pump in pumps:
            pump.join(timeout=5)
    for (job, index), proc in procs.items():
        how = " (stopped by dpkeras launch)" if (job, index) in stopped else ""
        print(f"{_PREFIX}: {job}:{index} exited with status {proc.returncode}{how}", flush=True)
    hidden = sum(lines.dropped for lines in filters)
    if hidden:
        print(
            f"{_PREFIX}: {hidden} lines of TensorFlow's logs hidden (--verbose shows them)",
            flush=True,
        )
    if interrupted:
        return 128 + interrupted[0]
    return status
