"""dpkeras's settings, resolved once into a frozen `Config`.

Precedence everywhere in dpkeras: an explicit argument, then the environment variable, then the
default. This module is the one place that reads them: each `DPKERAS_*` variable is parsed here
and nowhere else, and `TF_CONFIG` is read here (its JSON is parsed by `dpkeras.cluster._spec`).
Every consumer reads the `Config` that `config_in_force` returns (a strategy, `dpkeras serve`,
`dpkeras env`), or, for one process-wide setting outside a strategy, the `Setting` that
`setting` returns. `dpkeras env` prints the `Config`, with where each setting came from.

| setting | environment variable | default |
|---|---|---|
| `compute_devices` | `DPKERAS_COMPUTE_DEVICES` (comma-separated) | None: every GPU, else CPUs |
| `parameter_device` | `DPKERAS_PARAMETER_DEVICE` (comma-separated, or `hybrid`) | None: `/cpu:0` |
| `deduplicate` | `DPKERAS_DEDUPLICATE` (1, 0, true, false, sum) | `Deduplicate.ON` |
| `cpus` | `DPKERAS_CPUS` (logical CPU devices of a task) | 1 |
| `client_start_timeout` | `DPKERAS_CLIENT_START_TIMEOUT` (seconds) | 1800 |
| `connect_timeout` | `DPKERAS_CONNECT_TIMEOUT` (seconds the client waits for the tasks) | 60 |
| `task_restart_timeout` | `DPKERAS_TASK_RESTART_TIMEOUT` (seconds, 0: off) | 300 |
| `elastic_workers` | `DPKERAS_ELASTIC_WORKERS` (1, 0, true, false) | True |
| `exit_with_client` | `DPKERAS_EXIT_WITH_CLIENT` (1, 0, true, false) | None: `serve` decides |
| `verbose` | `DPKERAS_VERBOSE` (1, 0, true, false: TensorFlow's log noise in commands) | False |
| `tf_config` | `TF_CONFIG` (its text) | None |

A variable set to blank is unset. A bad value raises ValueError naming the argument or variable
and the value received.
"""

import dataclasses
import enum
import os
import typing
from math import inf

VARIABLES = {
    "compute_devices": "DPKERAS_COMPUTE_DEVICES",
    "parameter_device": "DPKERAS_PARAMETER_DEVICE",
    "deduplicate": "DPKERAS_DEDUPLICATE",
    "cpus": "DPKERAS_CPUS",
    "client_start_timeout": "DPKERAS_CLIENT_START_TIMEOUT",
    "connect_timeout": "DPKERAS_CONNECT_TIMEOUT",
    "task_restart_timeout": "DPKERAS_TASK_RESTART_TIMEOUT",
    "elastic_workers": "DPKERAS_ELASTIC_WORKERS",
    "exit_with_client": "DPKERAS_EXIT_WITH_CLIENT",
    "verbose": "DPKERAS_VERBOSE",
    "tf_config": "TF_CONFIG",
}
DEFAULT_CLIENT_START_TIMEOUT = 1800.0  # seconds: a client's pod may start late
DEFAULT_CONNECT_TIMEOUT = 60.0  # seconds the client waits for every task to answer
# Seconds `fit` waits for a lost task to answer again: a Kubernetes pod restarted on its node
# (image cached) is back in well under a minute; a rescheduled one can take minutes.
DEFAULT_TASK_RESTART_TIMEOUT = 300.0
_BOOLEANS = {"1": True, "true": True, "0": False, "false": False}


class Deduplicate(enum.Enum):
    """How an embedding lookup's repeated ids cross between a replica and the parameter device.

    - `ON` (the default): each distinct id and its row cross once per replica and step;
      gradient rows of repeats are summed before they cross where that keeps Keras's numbers
      (SGD without clipping), and sent as they are otherwise.
    - `SUM`: gradient rows are always summed per distinct id before the optimizer (tf.keras's
      and TF1's semantics: Adam and Adagrad then square the sum, not each repeat).
    - `OFF`: every repeat crosses, both ways.

    `deduplicate=` also takes True (`ON`), False (`OFF`) and "sum" (`SUM`);
    `$DPKERAS_DEDUPLICATE` takes 1 or true, 0 or false, and sum.
    """

    ON = "on"
    OFF = "off"
    SUM = "sum"

    def __repr__(self):
        return f"dpkeras.Deduplicate.{self.name}"

    @classmethod
    def of(cls, value):
        """`value` as a member: a member itself, True (`ON`), False (`OFF`) or "sum" (`SUM`).

        Raises:
            ValueError: for any other value, naming it.
        """
        if isinstance(value, cls):
            return value
        if isinstance(value, bool):
            return cls.ON if value else cls.OFF
        if isinstance(value, str) and value == "sum":
            return cls.SUM
        raise ValueError(
            f"deduplicate must be True, False or 'sum', or a dpkeras.Deduplicate (ON, OFF, "
            f"SUM). Received: {value!r} (of type {type(value).__name__})"
        )


@dataclasses.dataclass(frozen=True)
class Config:
    """Every dpkeras setting, resolved (see the module); frozen and hashable.

    Equality and hashing are over the settings' values, not where they came from: the same
    devices given as arguments or through the environment are the same configuration.

    Attributes:
        compute_devices: tuple of device strings, or None (the default devices); an argument
            of another type is kept as given, for the devices' validation to name it.
        parameter_device: a device string, a tuple of them, a placement policy, or None;
            "hybrid" (argument or variable, any case) and the `placement.hybrid` function not
            called are resolved to `placement.hybrid()`.
        deduplicate: a `Deduplicate`.
        cpus: int >= 1, logical CPU devices of a cluster task.
        client_start_timeout: float > 0, seconds a task waits for the client to appear.
        connect_timeout: float > 0, seconds the client waits for every task to answer.
        task_restart_timeout: float >= 0, seconds `fit` waits for a lost task (a ps, or a
            worker under all-on-ps) to answer again before it restores the backup and goes on;
            0: a lost task ends `fit` at once.
        elastic_workers: bool, whether `fit` goes on without a worker lost mid-`fit` (all-on-ps,
            with a backup), on the other workers' replicas, taking it back once it answers
            again; False: it is waited for, as a ps is.
        exit_with_client: bool, or None (`dpkeras serve` decides: on under `TF_CONFIG`).
        verbose: bool, whether dpkeras's commands show TensorFlow's log noise (`dpkeras._quiet`).
        tf_config: the text of `TF_CONFIG`, or None.
        origins: `((setting, "argument" | "environment" | "default", text received or None),
            ...)`, for messages and `dpkeras env`.
    """

    compute_devices: object = None
    parameter_device: object = None
    deduplicate: Deduplicate = Deduplicate.ON
    cpus: int = 1
    client_start_timeout: float = DEFAULT_CLIENT_START_TIMEOUT
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    task_restart_timeout: float = DEFAULT_TASK_RESTART_TIMEOUT
    elastic_workers: bool = True
    exit_with_client: object = None
    verbose: bool = False
    tf_config: object = None
    origins: tuple = dataclasses.field(default=(), compare=False, repr=False)

    def source(self, setting):
        """Where `setting` came from: "argument", "environment" or "default"."""
        return next((source for name, source, _ in self.origins if name == setting), "default")

    def text(self, setting):
        """The environment variable's text `setting` was parsed from, or None."""
        return next((text for name, _, text in self.origins if name == setting), None)

    def received(self, setting):
        """`"VARIABLE='text'"` for a setting taken from the environment, else None."""
        text = self.text(setting)
        return None if text is None else f"{VARIABLES[setting]}={text!r}"


def _devices_argument(value, name):
    return tuple(value) if isinstance(value, list) else value


def _device_list(text, name):
    devices = tuple(d.strip() for d in text.split(","))
    if not all(devices):
        raise ValueError(
            f"{name} must be a comma-separated list of devices such as '/gpu:0,/gpu:1'. "
            f"Received: {name}={text!r}"
        )
    return devices


def _is_hybrid(value):
    """Whether `value` asks for `placement.hybrid()`: the string "hybrid" (any case), or the
    `placement.hybrid` function itself, not called."""
    if isinstance(value, str):
        return value.strip().lower() == "hybrid"
    if getattr(value, "__module__", None) != "dpkeras.placement":
        return False
    from dpkeras import placement  # imported only when it is one of placement's (TensorFlow)

    return value is placement.hybrid


def _hybrid():
    from dpkeras import placement

    return placement.hybrid()


def _parameter_argument(value, name):
    return _hybrid() if _is_hybrid(value) else _devices_argument(value, name)


def _parameter_devices(text, name):
    if _is_hybrid(text):
        return _hybrid()
    devices = _device_list(text, name)
    return devices[0] if len(devices) == 1 else devices


def _deduplicate(text, name):
    value = {**_BOOLEANS, "sum": "sum"}.get(text.strip().lower())
    if value is None:
        raise ValueError(
            f"{name} must be one of 1, 0, true, false or sum. Received: {name}={text!r}"
        )
    return Deduplicate.of(value)


def _positive_int(value, name):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer. Received: {name}={value!r}")
    return value


def _positive_int_text(text, name):
    try:
        return _positive_int(int(text.strip()), name)
    except ValueError:
        raise ValueError(
            f"{name} must be a positive integer (logical CPU devices). Received: {name}={text!r}"
        ) from None


def _seconds(value, name):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds. Received: {name}={value!r}")
    return float(value)


def _seconds_or_off(value, name):
    """A bounded wait: 0 (off) or more, finite (not NaN, not infinity)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < inf:
        raise ValueError(
            f"{name} must be a number of seconds, 0 or more (0: off), and finite. "
            f"Received: {name}={value!r}"
        )
    return float(value)


def _seconds_or_off_text(text, name):
    try:
        return _seconds_or_off(float(text.strip()), name)
    except ValueError:
        raise ValueError(
            f"{name} must be a number of seconds, 0 or more (0: off), and finite. "
            f"Received: {name}={text!r}"
        ) from None


def _seconds_text(text, name):
    try:
        return _seconds(float(text.strip()), name)
    except ValueError:
        raise ValueError(
            f"{name} must be a positive number of seconds. Received: {name}={text!r}"
        ) from None


def _boolean(value, name):
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False. Received: {name}={value!r}")
    return value


def _boolean_text(text, name):
    value = _BOOLEANS.get(text.strip().lower())
    if value is None:
        raise ValueError(f"{name} must be one of 1, 0, true or false. Received: {name}={text!r}")
    return value


def _text(text, name):
    return text


# setting: (parses an argument, parses the environment variable's text)
_PARSERS = {
    "compute_devices": (_devices_argument, _device_list),
    "parameter_device": (_parameter_argument, _parameter_devices),
    "deduplicate": (lambda value, name: Deduplicate.of(value), _deduplicate),
    "cpus": (_positive_int, _positive_int_text),
    "client_start_timeout": (_seconds, _seconds_text),
    "connect_timeout": (_seconds, _seconds_text),
    "task_restart_timeout": (_seconds_or_off, _seconds_or_off_text),
    "elastic_workers": (_boolean, _boolean_text),
    "exit_with_client": (_boolean, _boolean_text),
    "verbose": (_boolean, _boolean_text),
    "tf_config": (None, _text),
}
_DEFAULTS = {field.name: field.default for field in dataclasses.fields(Config)}


class Setting(typing.NamedTuple):
    """One setting resolved: its value, where it came from ("argument", "environment" or
    "default"), and the environment variable's text it was parsed from (or None)."""

    value: object
    source: str
    text: object


def setting(name, argument=None):
    """Resolves one setting: `argument` if not None, else its environment variable (unless
    unset or blank), else its default. Returns a `Setting`.

    `config_in_force` runs this for every setting. A consumer that needs one process-wide setting
    outside a strategy (`TF_CONFIG` to name tasks, `DPKERAS_CPUS` when connecting) resolves just
    that one, so a variable that an argument overrides elsewhere is never parsed.

    Raises:
        ValueError: for a bad argument or environment value, naming it and what was received.
    """
    from_argument, from_text = _PARSERS[name]
    if argument is not None:
        return Setting(from_argument(argument, name), "argument", None)
    text = os.environ.get(VARIABLES[name])
    if text is not None and text.strip():
        return Setting(from_text(text, VARIABLES[name]), "environment", text)
    return Setting(_DEFAULTS[name], "default", None)


def config_in_force(
    compute_devices=None,
    parameter_device=None,
    deduplicate=None,
    cpus=None,
    client_start_timeout=None,
    exit_with_client=None,
    connect_timeout=None,
):
    """The `Config` in force: each argument that is not None, else its environment variable
    (unless unset or blank), else its default (see `setting`).

    Args:
        compute_devices, parameter_device, deduplicate: as `dpkeras.ParameterDeviceStrategy`
            takes them.
        cpus, client_start_timeout, exit_with_client: as `dpkeras serve` takes them.
        connect_timeout: as `dpkeras.cluster.join` takes it (`timeout`).

    Raises:
        ValueError: for a bad argument or environment value, naming it and what was received.
    """
    arguments = {
        "compute_devices": compute_devices,
        "parameter_device": parameter_device,
        "deduplicate": deduplicate,
        "cpus": cpus,
        "client_start_timeout": client_start_timeout,
        "exit_with_client": exit_with_client,
        "connect_timeout": connect_timeout,
    }
    settings = {name: setting(name, arguments.get(name)) for name in VARIABLES}
    return Config(
        **{name: s.value for name, s in settings.items()},
        origins=tuple((name, s.source, s.text) for name, s in settings.items()),
    )


def other_variables():
    """`{name: text}` of the `DPKERAS_*` variables set that are no dpkeras setting (a typo?)."""
    known = set(VARIABLES.values())
    return {
        k: v for k, v in sorted(os.environ.items()) if k.startswith("DPKERAS_") and k not in known
    }
