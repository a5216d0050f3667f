"""Programs in fresh processes, strategies over simulated CPU devices, and weight checks."""

import subprocess
import sys
import textwrap

from dpkeras.testing._cluster import server_env


def run_python(code, cpus=None, env=None, timeout=600):
    """Runs `code` (dedented) in a fresh Python; returns its standard output.

    Args:
        code: str, the program.
        cpus: int or None; with it, the program is preceded by
            `dpkeras.simulate_cpu_devices(cpus)`.
        env: dict or None, environment variables added to this process's.
        timeout: float, seconds before the program is killed (`subprocess.TimeoutExpired`).

    Raises:
        AssertionError: if the program fails; the message ends with its standard error.
    """
    prefix = "" if cpus is None else f"import dpkeras\ndpkeras.simulate_cpu_devices({cpus})\n"
    proc = subprocess.run(
        [sys.executable, "-c", prefix + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=dict(server_env(), **(env or {})),
        timeout=timeout,
    )
    if proc.returncode != 0:
        raise AssertionError(f"subprocess failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc.stdout


def cpu_strategy(replicas, parameter_device="/cpu:0"):
    """The dpkeras strategy with `replicas` replicas on `/cpu:1` ... and variables on
    `parameter_device` (cached: `dpkeras.get_strategy`). The process needs at least
    `replicas + 1` CPU devices (`dpkeras.simulate_cpu_devices`)."""
    import dpkeras

    return dpkeras.get_strategy([f"/cpu:{i}" for i in range(1, replicas + 1)], parameter_device)


def assert_weights_close(expected, actual, rtol=1e-5, atol=1e-6):
    """Asserts two lists of arrays (e.g. `model.get_weights()`) are equal within tolerance."""
    import numpy as np

    assert len(expected) == len(actual), f"{len(expected)} arrays expected, got {len(actual)}"
    for i, (e, a) in enumerate(zip(expected, actual)):
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=f"weight {i}")
