"""What the benchmark ran on: hardware, versions and the device layout, as printable lines."""

import importlib.metadata
import os
import platform
import subprocess

__all__ = ["describe", "find_gpus", "repo_root"]


def resident_mib():
    """This process's resident memory (VmRSS, Linux's /proc) in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def repo_root():
    """The checkout that holds `benchmarks/` (and, normally, `dpkeras/`)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def find_gpus():
    """Names of the physical GPUs TensorFlow sees (imports TensorFlow, creates no context)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    return [d.name for d in tf.config.list_physical_devices("GPU")]


def _cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _memory_gib():
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) / 2**20
    except (OSError, ValueError, IndexError):
        pass
    return None


def _version(package):
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _dpkeras_version():
    """The version of the dpkeras this run imports (an editable install's metadata can be older)."""
    import dpkeras

    return dpkeras.__version__


def _git_state(root):
    try:
        head = subprocess.run(
            ["git", "-C", root, "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        dirty = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "--", "dpkeras", "benchmarks"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return head.strip() + (", with uncommitted changes" if dirty.strip() else "")


def describe(gpus, replicas, parameter_device, replica_counts=None):
    """A dict describing the machine and the device layout of this run.

    Args:
        gpus: names of the physical GPUs found.
        replicas: int, the largest replica count of the run.
        parameter_device: str, where dpkeras and central_storage keep variables.
        replica_counts: the replica counts of a scaling run, or None.
    """
    cores = os.cpu_count()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = cores
    info = {
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpu_cores": cores,
        "usable_cpu_cores": usable,
        "memory_gib": _memory_gib(),
        "python": platform.python_version(),
        "tensorflow": _version("tensorflow"),
        "keras": _version("keras"),
        "dpkeras": _dpkeras_version(),
        "git": _git_state(repo_root()),
        "gpus": list(gpus),
        "loadavg_at_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    if gpus:
        info["devices"] = "gpu"
        info["layout"] = (
            f"{len(gpus)} GPU(s) found; compute replicas on /gpu:0../gpu:"
            f"{replicas - 1}; dpkeras and central_storage keep variables on "
            f"{parameter_device}; one_device runs on /gpu:0."
        )
    else:
        info["devices"] = "simulated"
        counts = sorted(set(replica_counts or [replicas]))
        split = (
            f"{replicas + 1} logical devices"
            if len(counts) == 1
            else f"replicas + 1 logical devices ({counts[0] + 1} to {counts[-1] + 1})"
        )
        info["layout"] = (
            f"No GPU found: SIMULATED devices. Each pair's process splits the CPU into "
            f"{split}: compute replicas on /cpu:1../cpu:{replicas}, "
            f"variables (dpkeras, central_storage) and input on {parameter_device}; "
            f"one_device runs on /cpu:1. The logical devices share the {usable} physical "
            f"core(s), so the numbers measure each strategy's overhead, not a speed-up."
        )
    return info


def lines(info):
    """`describe`'s dict as the lines the benchmark prints and writes."""
    memory = f", {info['memory_gib']:.1f} GiB RAM" if info.get("memory_gib") else ""
    load = info.get("loadavg_at_start")
    out = [
        f"Machine: {info['cpu']}, {info['cpu_cores']} cores ({info['usable_cpu_cores']} "
        f"usable){memory}; {info['platform']}",
        f"Software: Python {info['python']}, TensorFlow {info['tensorflow']}, Keras "
        f"{info['keras']}, dpkeras {info['dpkeras']}"
        + (f" (git {info['git']})" if info.get("git") else ""),
        f"Devices: {info['layout']}",
    ]
    if load:
        out.append(
            f"Load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} "
            f"(other processes compete for the same cores)"
        )
    return out
