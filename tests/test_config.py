"""Settings resolved once (`dpkeras._config`): an argument, then its `DPKERAS_*` variable, then
the default, into a frozen `Config`; bad values named; the strategy cache keyed on it; `dpkeras
env` printing it; `Deduplicate` and the old True/False/"sum"; one place that reads the
environment."""

import ast
import dataclasses
import io
import json
import os
import re

import pytest

import dpkeras
from dpkeras import _config
from dpkeras._cli import env as env_cli
from dpkeras._cli.serve import serve
from dpkeras.cluster import _spec

Deduplicate = dpkeras.Deduplicate
TF_CONFIG = json.dumps({"cluster": {"worker": ["127.0.0.1:2"]}})

# setting: (an argument, what it resolves to, an environment text, what it resolves to, default)
PRECEDENCE = {
    "compute_devices": (["/cpu:1"], ("/cpu:1",), "/cpu:2, /cpu:3", ("/cpu:2", "/cpu:3"), None),
    "parameter_device": ("/cpu:0", "/cpu:0", " /cpu:1,/cpu:2 ", ("/cpu:1", "/cpu:2"), None),
    "deduplicate": (False, Deduplicate.OFF, "sum", Deduplicate.SUM, Deduplicate.ON),
    "cpus": (3, 3, "2", 2, 1),
    "client_start_timeout": (5, 5.0, "7.5", 7.5, 1800.0),
    "connect_timeout": (5, 5.0, "90", 90.0, 60.0),
    "task_restart_timeout": (None, None, "2.5", 2.5, 300.0),  # no argument: the variable only
    "elastic_workers": (None, None, "0", False, True),  # no argument: the variable only
    "exit_with_client": (False, False, "TRUE", True, None),
    "verbose": (None, None, "1", True, False),  # --verbose sets $DPKERAS_VERBOSE
    "tf_config": (None, None, TF_CONFIG, TF_CONFIG, None),  # no argument: TF_CONFIG or None
}


def test_every_setting_is_tested_and_has_its_variable():
    assert set(PRECEDENCE) == set(_config.VARIABLES)
    assert {f.name for f in dataclasses.fields(_config.Config)} == set(PRECEDENCE) | {"origins"}


@pytest.mark.parametrize("name", list(PRECEDENCE))
def test_argument_then_environment_then_default(monkeypatch, name):
    argument, from_argument, text, from_text, default = PRECEDENCE[name]
    variable = _config.VARIABLES[name]
    monkeypatch.delenv(variable, raising=False)
    config = _config.config_in_force()
    assert (getattr(config, name), config.source(name), config.received(name)) == (
        default,
        "default",
        None,
    )
    for blank in ("", "  "):  # a blank variable is unset
        monkeypatch.setenv(variable, blank)
        assert getattr(_config.config_in_force(), name) == default
    monkeypatch.setenv(variable, text)
    config = _config.config_in_force()
    assert getattr(config, name) == from_text
    assert config.source(name) == "environment"
    assert config.received(name) == f"{variable}={text!r}"
    assert _config.setting(name) == (from_text, "environment", text)
    if argument is not None:
        config = _config.config_in_force(**{name: argument})
        assert (getattr(config, name), config.source(name)) == (from_argument, "argument")


def test_one_parameter_device_from_the_environment_is_a_string(monkeypatch):
    monkeypatch.setenv("DPKERAS_PARAMETER_DEVICE", " /gpu:0 ")
    assert _config.config_in_force().parameter_device == "/gpu:0"


@pytest.mark.parametrize(
    "variable, text, message",
    [
        (
            "DPKERAS_COMPUTE_DEVICES",
            "/cpu:1,,/cpu:2",
            "DPKERAS_COMPUTE_DEVICES must be a comma-separated list of devices such as "
            "'/gpu:0,/gpu:1'. Received: DPKERAS_COMPUTE_DEVICES='/cpu:1,,/cpu:2'",
        ),
        (
            "DPKERAS_PARAMETER_DEVICE",
            "/cpu:0,",
            "DPKERAS_PARAMETER_DEVICE must be a comma-separated list of devices such as "
            "'/gpu:0,/gpu:1'. Received: DPKERAS_PARAMETER_DEVICE='/cpu:0,'",
        ),
        (
            "DPKERAS_DEDUPLICATE",
            "maybe",
            "DPKERAS_DEDUPLICATE must be one of 1, 0, true, false or sum. "
            "Received: DPKERAS_DEDUPLICATE='maybe'",
        ),
        (
            "DPKERAS_CPUS",
            "two",
            "DPKERAS_CPUS must be a positive integer (logical CPU devices). "
            "Received: DPKERAS_CPUS='two'",
        ),
        (
            "DPKERAS_CPUS",
            "0",
            "DPKERAS_CPUS must be a positive integer (logical CPU devices). "
            "Received: DPKERAS_CPUS='0'",
        ),
        (
            "DPKERAS_TASK_RESTART_TIMEOUT",
            "-5",
            "DPKERAS_TASK_RESTART_TIMEOUT must be a number of seconds, 0 or more (0: off), and "
            "finite. Received: DPKERAS_TASK_RESTART_TIMEOUT='-5'",
        ),
        (
            "DPKERAS_TASK_RESTART_TIMEOUT",
            "later",
            "DPKERAS_TASK_RESTART_TIMEOUT must be a number of seconds, 0 or more (0: off), and "
            "finite. Received: DPKERAS_TASK_RESTART_TIMEOUT='later'",
        ),
        (
            "DPKERAS_TASK_RESTART_TIMEOUT",
            "nan",
            "DPKERAS_TASK_RESTART_TIMEOUT must be a number of seconds, 0 or more (0: off), and "
            "finite. Received: DPKERAS_TASK_RESTART_TIMEOUT='nan'",
        ),
        (
            "DPKERAS_TASK_RESTART_TIMEOUT",
            "inf",
            "DPKERAS_TASK_RESTART_TIMEOUT must be a number of seconds, 0 or more (0: off), and "
            "finite. Received: DPKERAS_TASK_RESTART_TIMEOUT='inf'",
        ),
        (
            "DPKERAS_CLIENT_START_TIMEOUT",
            "soon",
            "DPKERAS_CLIENT_START_TIMEOUT must be a positive number of seconds. "
            "Received: DPKERAS_CLIENT_START_TIMEOUT='soon'",
        ),
        (
            "DPKERAS_CLIENT_START_TIMEOUT",
            "-1",
            "DPKERAS_CLIENT_START_TIMEOUT must be a positive number of seconds. "
            "Received: DPKERAS_CLIENT_START_TIMEOUT='-1'",
        ),
        (
            "DPKERAS_CLIENT_START_TIMEOUT",
            "nan",
            "DPKERAS_CLIENT_START_TIMEOUT must be a positive number of seconds. "
            "Received: DPKERAS_CLIENT_START_TIMEOUT='nan'",
        ),
        (
            "DPKERAS_EXIT_WITH_CLIENT",
            "yes please",
            "DPKERAS_EXIT_WITH_CLIENT must be one of 1, 0, true or false. "
            "Received: DPKERAS_EXIT_WITH_CLIENT='yes please'",
        ),
    ],
)
def test_a_bad_environment_value_is_named(monkeypatch, variable, text, message):
    monkeypatch.setenv(variable, text)
    with pytest.raises(ValueError) as raised:
        _config.config_in_force()
    assert str(raised.value) == message


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"cpus": 0}, "cpus must be a positive integer. Received: cpus=0"),
        ({"cpus": True}, "cpus must be a positive integer. Received: cpus=True"),
        ({"cpus": 1.5}, "cpus must be a positive integer. Received: cpus=1.5"),
        (
            {"client_start_timeout": 0},
            "client_start_timeout must be a positive number of seconds. "
            "Received: client_start_timeout=0",
        ),
        (
            {"exit_with_client": 1},
            "exit_with_client must be True or False. Received: exit_with_client=1",
        ),
        (
            {"deduplicate": "yes"},
            "deduplicate must be True, False or 'sum', or a dpkeras.Deduplicate (ON, OFF, SUM). "
            "Received: 'yes' (of type str)",
        ),
    ],
)
def test_a_bad_argument_is_named(arguments, message):
    with pytest.raises(ValueError) as raised:
        _config.config_in_force(**arguments)
    assert str(raised.value) == message


def test_an_argument_overrides_a_bad_variable_which_is_then_never_parsed(monkeypatch):
    monkeypatch.setenv("DPKERAS_COMPUTE_DEVICES", "/cpu:1,,")
    monkeypatch.setenv("DPKERAS_DEDUPLICATE", "maybe")
    config = _config.config_in_force(compute_devices=["/cpu:1"], deduplicate=True)
    assert (config.compute_devices, config.deduplicate) == (("/cpu:1",), Deduplicate.ON)
    strategy = dpkeras.get_strategy(["/cpu:1"], "/cpu:0", deduplicate="sum")
    assert strategy.deduplicate is Deduplicate.SUM


def test_the_config_is_frozen_hashable_and_equal_by_value(monkeypatch):
    config = _config.config_in_force(
        compute_devices=["/cpu:1", "/cpu:2"], parameter_device=["/cpu:0"]
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.cpus = 4
    assert {config: 1}[
        _config.config_in_force(compute_devices=("/cpu:1", "/cpu:2"), parameter_device=("/cpu:0",))
    ]
    monkeypatch.setenv("DPKERAS_DEDUPLICATE", "0")
    from_environment = _config.config_in_force()
    from_argument = _config.config_in_force(deduplicate=False)
    assert from_environment.source("deduplicate") != from_argument.source("deduplicate")
    assert from_environment == from_argument  # where a value came from is not the value
    assert hash(from_environment) == hash(from_argument)
    monkeypatch.setenv("DPKERAS_CPUS", "2")
    assert _config.config_in_force() != from_argument


def test_get_strategy_follows_the_resolved_config(monkeypatch):
    first = dpkeras.get_strategy(["/cpu:1", "/cpu:2"], "/cpu:0")
    assert dpkeras.get_strategy(["/device:CPU:1", "cpu:2"]) is first  # same once resolved
    monkeypatch.setenv("DPKERAS_DEDUPLICATE", "sum")
    summing = dpkeras.get_strategy(["/cpu:1", "/cpu:2"], "/cpu:0")
    assert summing is not first and summing.deduplicate is Deduplicate.SUM
    assert dpkeras.get_strategy(["/cpu:1", "/cpu:2"], "/cpu:0", deduplicate="sum") is summing
    monkeypatch.setenv("DPKERAS_DEDUPLICATE", "1")
    assert dpkeras.get_strategy(["/cpu:1", "/cpu:2"], "/cpu:0") is first
    monkeypatch.setenv("DPKERAS_COMPUTE_DEVICES", "/cpu:2,/cpu:3")
    moved = dpkeras.get_strategy(parameter_device="/cpu:0")
    assert moved is not first
    assert [d[-5:] for d in moved.compute_devices] == ["CPU:2", "CPU:3"]
    monkeypatch.delenv("DPKERAS_COMPUTE_DEVICES")
    monkeypatch.setenv("DPKERAS_CLIENT_START_TIMEOUT", "60")
    assert dpkeras.get_strategy(["/cpu:1", "/cpu:2"], "/cpu:0") is not first


def test_get_strategy_resolves_devices_once_per_strategy_made(monkeypatch):
    """The devices are resolved by the constructor alone: once for a new strategy, never for
    one found in the cache (they were resolved twice before, for the key and again)."""
    from dpkeras._extended import devices

    calls = []
    real = devices.strategy_devices

    def counting(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(devices, "strategy_devices", counting)
    monkeypatch.setenv("DPKERAS_CLIENT_START_TIMEOUT", "61")  # settings no other test uses
    made = dpkeras.get_strategy(["/cpu:2", "/cpu:3"], "/cpu:1")
    assert len(calls) == 1
    assert dpkeras.get_strategy(["/cpu:2", "/cpu:3"], "/cpu:1") is made
    assert len(calls) == 1


@pytest.mark.parametrize(
    "given, member",
    [
        (True, Deduplicate.ON),
        (False, Deduplicate.OFF),
        ("sum", Deduplicate.SUM),
        (Deduplicate.ON, Deduplicate.ON),
        (Deduplicate.OFF, Deduplicate.OFF),
        (Deduplicate.SUM, Deduplicate.SUM),
    ],
)
def test_the_old_deduplicate_values_are_still_accepted(given, member):
    assert Deduplicate.of(given) is member
    assert dpkeras.get_strategy(["/cpu:1"], "/cpu:0", deduplicate=given).deduplicate is member


@pytest.mark.parametrize("bad", [1, 0, "SUM", "on", None, "True"])
def test_a_bad_deduplicate_names_what_it_received_and_what_is_valid(bad):
    with pytest.raises(ValueError) as raised:
        Deduplicate.of(bad)
    assert str(raised.value) == (
        f"deduplicate must be True, False or 'sum', or a dpkeras.Deduplicate (ON, OFF, SUM). "
        f"Received: {bad!r} (of type {type(bad).__name__})"
    )


def test_a_strategy_names_a_mode_other_than_on():
    assert "deduplicate" not in repr(dpkeras.get_strategy(["/cpu:1"], "/cpu:0"))
    summing = dpkeras.get_strategy(["/cpu:1"], "/cpu:0", deduplicate="sum")
    assert repr(summing).endswith(", deduplicate=dpkeras.Deduplicate.SUM)")


def test_dpkeras_env_prints_every_setting_and_where_it_came_from(monkeypatch):
    monkeypatch.setenv("DPKERAS_DEDUPLICATE", "sum")
    monkeypatch.setenv("DPKERAS_CPUS", " 2")
    monkeypatch.setenv("DPKERAS_COMPUTE_DEVICE", "/cpu:1")  # a typo
    monkeypatch.delenv("DPKERAS_CLIENT_START_TIMEOUT", raising=False)
    out = io.StringIO()
    assert env_cli.env([], out=out) == 0
    text = out.getvalue()
    lines = text.split("Settings (the argument, else the environment variable, else the ")[1]
    lines = [line.strip() for line in lines.splitlines()[1 : 1 + len(_config.VARIABLES)]]
    assert [line.split()[0] for line in lines] == list(_config.VARIABLES)
    assert re.sub(r"\s+", " ", lines[2]) == (
        "deduplicate dpkeras.Deduplicate.SUM (from DPKERAS_DEDUPLICATE=sum)"
    )
    assert re.sub(r"\s+", " ", lines[3]) == "cpus 2 (from DPKERAS_CPUS=2)"
    assert re.sub(r"\s+", " ", lines[4]) == (
        "client_start_timeout 1800.0 (default: $DPKERAS_CLIENT_START_TIMEOUT unset)"
    )
    others = text.split("Other DPKERAS_* variables (no dpkeras setting: a typo?):\n")[1]
    assert "  DPKERAS_COMPUTE_DEVICE=/cpu:1\n" in others


def test_dpkeras_serve_names_a_bad_variable_in_one_line(capsys, monkeypatch):
    monkeypatch.setenv("DPKERAS_CPUS", "many")
    assert serve(["--cluster", TF_CONFIG, "--job", "worker", "--task", "0"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "dpkeras serve: error: DPKERAS_CPUS must be a positive integer (logical CPU devices). "
        "Received: DPKERAS_CPUS='many'\n"
    )


def test_tf_config_is_read_through_the_config(monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["127.0.0.1:2"]}}))
    assert _spec.cluster_spec_of().as_dict() == {"worker": ["127.0.0.1:2"]}
    assert _spec.parse_tf_config(None) == (None, None)


# -- one place reads the environment ---------------------------------------------------------

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Reads of the environment by a name that is not a literal, outside dpkeras._config.
NON_LITERAL_READS_ALLOWED = {
    ("dpkeras._quiet", "name"): "the related, non-dpkeras variables `dpkeras env` prints "
    "(_RELATED_ENV), as the user gave them",
    ("dpkeras._quiet", "LEVEL_VARIABLE"): "whether the user set TF_CPP_MIN_LOG_LEVEL",
}


def _environment_reads(tree):
    """`(key, literal?)` of each `os.environ.get(key)`, `os.getenv(key)`, `os.environ[key]`
    read and `key in os.environ` in `tree`."""

    def is_environ(node):
        return ast.unparse(node) in ("os.environ", "environ")

    reads = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call) and node.args:
            name = ast.unparse(node.func)
            if name in ("os.environ.get", "environ.get", "os.getenv", "getenv"):
                key = node.args[0]
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            key = node.slice if is_environ(node.value) else None
        elif isinstance(node, ast.Compare) and any(is_environ(c) for c in node.comparators):
            key = node.left
        if key is not None:
            literal = isinstance(key, ast.Constant)
            reads.append((key.value if literal else ast.unparse(key), literal))
    return reads


def test_only_dpkeras_config_reads_dpkeras_variables_and_tf_config():
    found = {}
    for folder, _, files in os.walk(os.path.join(ROOT, "dpkeras")):
        for file in files:
            if not file.endswith(".py"):
                continue
            path = os.path.join(folder, file)
            module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".").removesuffix(".__init__")
            with open(path, encoding="utf-8") as f:
                found[module] = _environment_reads(ast.parse(f.read()))
    assert ("VARIABLES[name]", False) in found["dpkeras._config"]  # the check sees the reads
    wrong = [
        f"{module} reads {key}"
        for module, reads in found.items()
        if module != "dpkeras._config"
        for key, literal in reads
        if (literal and (key.startswith("DPKERAS_") or key == "TF_CONFIG"))
        or (not literal and (module, key) not in NON_LITERAL_READS_ALLOWED)
    ]
    assert wrong == []


def test_the_environment_read_check_sees_each_kind_of_read():
    tree = ast.parse(
        'a = os.environ.get("DPKERAS_CPUS")\nb = os.environ["TF_CONFIG"]\n'
        'c = "DPKERAS_X" in os.environ\nd = os.getenv(name)\nos.environ["Y"] = "1"\n'
    )
    assert set(_environment_reads(tree)) == {
        ("DPKERAS_CPUS", True),
        ("TF_CONFIG", True),
        ("DPKERAS_X", True),
        ("name", False),
    }
