"""The `DPKERAS_*` environment settings, parsed in one place.

Precedence everywhere in dpkeras: an explicit argument, then the environment variable, then the
default. `dpkeras env` prints what is in force.
"""

import os

COMPUTE_DEVICES_ENV = "DPKERAS_COMPUTE_DEVICES"
PARAMETER_DEVICE_ENV = "DPKERAS_PARAMETER_DEVICE"


def env_settings():
    """Returns `{name: value}` for every `DPKERAS_*` variable set in the environment."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("DPKERAS_")}


def env_device_list(name):
    """Parses a comma-separated device list from environment variable `name`.

    Returns:
        A list of stripped device strings, or `None` if the variable is unset or blank.

    Raises:
        ValueError: if the variable is set but names no device (for example `","`).
    """
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return None
    devices = [d.strip() for d in raw.split(",")]
    if not all(devices):
        raise ValueError(
            f"{name} must be a comma-separated list of devices such as '/gpu:0,/gpu:1'. "
            f"Received: {name}={raw!r}"
        )
    return devices


def env_device(name):
    """Returns the stripped value of environment variable `name`, or `None` if unset/blank."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return None
    return raw.strip()


DEDUPLICATE_ENV = "DPKERAS_DEDUPLICATE"
_DEDUPLICATE_VALUES = {"1": True, "true": True, "0": False, "false": False, "sum": "sum"}


def env_deduplicate():
    """`$DPKERAS_DEDUPLICATE` as True, False or "sum"; None if unset or blank.

    Raises:
        ValueError: for a value other than 1, 0, true, false or sum, naming it.
    """
    raw = env_device(DEDUPLICATE_ENV)
    if raw is None:
        return None
    try:
        return _DEDUPLICATE_VALUES[raw.lower()]
    except KeyError:
        raise ValueError(
            f"{DEDUPLICATE_ENV} must be one of 1, 0, true, false or sum. "
            f"Received: {DEDUPLICATE_ENV}={raw!r}"
        ) from None
