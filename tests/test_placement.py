"""Placement policies (TF1's device functions and replica_device_setter) and the report."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

import dpkeras
from dpkeras import placement
from dpkeras.testing import assert_weights_close, run_python
from tests.models import build_model, make_data

L = keras.layers
REPLICAS = ["/cpu:1", "/cpu:2"]
SPREAD = ["/cpu:0", "/cpu:3"]


def _uneven_model():
    """Variables from 64 bytes to 256 KB: a table, two dense layers, their biases."""
    keras.utils.set_random_seed(3)
    model = keras.Sequential(
        [
            keras.Input((6,), dtype="int32"),
            L.Embedding(2000, 32),
            L.GlobalAveragePooling1D(),
            L.Dense(64, activation="relu"),
            L.Dense(512),
            L.Dense(4),
        ]
    )
    model.compile(
        optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    )
    return model


def _devices_after_a_fit(policy):
    """`{path: device}` of `_uneven_model`'s variables, built under `policy`, after one fit."""
    with dpkeras.scope(REPLICAS, policy):
        model = _uneven_model()
    model.fit(np.zeros((8, 6), "int32"), np.zeros(8, "int32"), batch_size=8, verbose=0)
    return {r.path: r.device for r in dpkeras.placement_report(model).rows}


def _weight_loads(model):
    loads = {}
    for v in model.weights:
        device = dpkeras._device_names.short_device(v.value.device)
        loads[device] = loads.get(device, 0) + v.value.shape.num_elements() * 4
    return loads


def _build_under(parameter_device, builder=_uneven_model):
    with dpkeras.scope(REPLICAS, parameter_device):
        return builder()


def test_greedy_balances_better_than_round_robin_and_within_one_variable_of_ideal():
    greedy = _weight_loads(_build_under(placement.greedy_by_size(SPREAD)))
    keras.backend.clear_session()
    robin = _weight_loads(_build_under(placement.round_robin(SPREAD)))
    sizes = [v.shape.num_elements() * 4 for v in _uneven_model().weights]
    ideal = sum(sizes) / len(SPREAD)
    assert set(greedy) == set(robin) == {"/cpu:0", "/cpu:3"}
    assert max(greedy.values()) <= max(robin.values())
    assert max(greedy.values()) <= ideal + max(sizes)
    assert max(greedy.values()) < max(robin.values()), (greedy, robin)  # strictly, here


def test_a_list_of_devices_means_greedy_by_size():
    strategy = dpkeras.get_strategy(REPLICAS, SPREAD)
    assert "greedy_by_size" in repr(strategy.extended.placement_policy)
    assert strategy.extended.parameter_devices == tuple(
        dpkeras._device_names.canonical_device(d) for d in SPREAD
    )


def test_a_task_named_without_a_device_is_its_cpu_0_wherever_a_device_is_taken(monkeypatch):
    """`/job:ps/task:0`, as TF1's `tf.device` and `replica_device_setter` write a ps: that
    task's CPU:0, as TensorFlow takes it, in the arguments, a policy's answer and the
    environment (on a cluster: tests/test_cluster_training.py)."""
    canonical = dpkeras._device_names.canonical_device
    assert canonical("/job:ps/task:1") == "/job:ps/replica:0/task:1/device:CPU:0"
    assert canonical("/job:ps") == "/job:ps/replica:0/task:0/device:CPU:0"
    for typed in ("/job:ps/task:1/gpu", "/job:ps/task:1/device:GPU:*"):  # a type, no index
        with pytest.raises(ValueError, match=r"must name a type and an index"):
            canonical(typed)
    cpu0, cpu3 = canonical("/cpu:0"), canonical("/cpu:3")
    assert canonical("/job:localhost/task:0") == cpu0
    strategy = dpkeras.get_strategy(["/job:localhost/replica:0/task:0", "/cpu:1"], "/cpu:3")
    assert strategy.compute_devices == (cpu0, canonical("/cpu:1"))
    assert dpkeras.get_strategy(REPLICAS, "/job:localhost/task:0").extended.parameter_devices == (
        cpu0,
    )
    model = _build_under(lambda spec: "/job:localhost/task:0")
    assert {v.value.device for v in model.weights} == {cpu0}
    monkeypatch.setenv("DPKERAS_PARAMETER_DEVICE", "/job:localhost/task:0,/cpu:3")
    assert dpkeras.get_strategy(REPLICAS).extended.parameter_devices == (cpu0, cpu3)


def test_by_path_answers_replicated_for_a_rule_or_the_default():
    """`by_path({...}, default=REPLICATED)`: the table on its device, the dense layers
    replicated; metric state, which cannot be replicated, on the devices the rules name."""
    tables = placement.by_path({r"embedding": "/cpu:3"}, default=placement.REPLICATED)
    assert repr(tables) == "by_path({'embedding': '/cpu:3'}, default=dpkeras.placement.REPLICATED)"
    dense = placement.by_path({r"dense": placement.REPLICATED}, default="/cpu:3")
    for policy in (tables, dense):
        devices = _devices_after_a_fit(policy)
        assert {d for p, d in devices.items() if "embedding" in p} == {"/cpu:3"}, devices
        assert {d for p, d in devices.items() if "/dense" in p} == {"replicated"}, devices
        assert {d for p, d in devices.items() if p.startswith("loss/")} == {"/cpu:3"}, devices


def test_by_path_places_the_shards_a_replicated_rule_matches_on_its_devices():
    """The shards of a partitioned variable cannot be replicated: a `REPLICATED` rule or
    default matching them sends them to the devices the other rules name."""
    policy = placement.by_path({r"never": SPREAD}, default=placement.REPLICATED)
    strategy = dpkeras.ParameterDeviceStrategy(
        REPLICAS,
        parameter_device=policy,
        partitioner=tf.distribute.experimental.partitioners.FixedShardsPartitioner(2),
    )
    with strategy.scope():
        table = L.Embedding(10, 4)
        table.build((None, 3))
    shards = {s.device for s in table.embeddings.value.shards}
    assert shards == {dpkeras._device_names.canonical_device(d) for d in SPREAD}, shards


def test_by_path_of_callables_alone_is_accepted():
    """A `by_path` whose rules and default are all callables names no device of its own: it is
    accepted, and the strategy's default parameter device holds what it does not place (the
    loss's state, reductions)."""
    policy = placement.by_path({r"embedding": lambda spec: "/cpu:3"}, default=lambda spec: "/cpu:0")
    assert policy.devices == ()
    devices = _devices_after_a_fit(policy)
    assert {d for p, d in devices.items() if "embedding" in p} == {"/cpu:3"}, devices
    assert {d for p, d in devices.items() if "/dense" in p} == {"/cpu:0"}, devices


def test_hybrid_by_name_by_function_and_from_the_environment(monkeypatch):
    """ "hybrid" (argument or `DPKERAS_PARAMETER_DEVICE`) and `placement.hybrid` not called
    are `placement.hybrid()`: the same strategy."""
    hybrid = dpkeras.get_strategy(["/cpu:1", "/cpu:2", "/cpu:3"], placement.hybrid())
    assert dpkeras.get_strategy(hybrid.compute_devices, "hybrid") is hybrid
    assert dpkeras.get_strategy(hybrid.compute_devices, " Hybrid ") is hybrid
    assert dpkeras.get_strategy(hybrid.compute_devices, placement.hybrid) is hybrid
    for text in ("hybrid", " HYBRID "):  # any case, as the argument
        monkeypatch.setenv("DPKERAS_PARAMETER_DEVICE", text)
        assert dpkeras.get_strategy(hybrid.compute_devices) is hybrid, text
    assert repr(hybrid.extended.placement_policy) == "hybrid([/cpu:0])"


def test_by_path_and_slots_follow_their_variable():
    model = _build_under(placement.by_path({r"embedding": "/cpu:0"}, default="/cpu:3"))
    x, y = np.zeros((8, 6), "int32"), np.zeros(8, "int32")
    model.fit(x, y, batch_size=8, verbose=0)  # creates the Adam slots
    for v in model.weights:
        expected = "CPU:0" if "embedding" in v.path else "CPU:3"
        assert v.value.device.endswith(expected), v.path
    slots = [v for v in model.optimizer.variables if "_momentum" in v.path or "_velocity" in v.path]
    assert len(slots) == 2 * len(model.trainable_weights)
    for slot in slots:
        expected = "CPU:0" if "embedding" in slot.path else "CPU:3"
        assert slot.value.device.endswith(expected), slot.path


def test_a_callable_policy_sees_each_variable_once_with_its_spec():
    seen = []

    def policy(spec):
        seen.append(spec)
        return "/cpu:3" if spec.kind == "weight" else "/cpu:0"

    keras.config.set_dtype_policy("float32")
    with dpkeras.scope(REPLICAS, policy):
        model = build_model("dropout")
    x, y = make_data("dense", 32)
    model.fit(x, y, batch_size=32, verbose=0)
    by_path = {s.path: s for s in seen}
    first_kernel = model.layers[0].kernel.path
    kernel = by_path[first_kernel]
    assert (kernel.shape, kernel.dtype, kernel.trainable, kernel.kind) == (
        (12, 16),
        "float32",
        True,
        "weight",
    )
    assert by_path[model.optimizer.iterations.path].kind == "optimizer"
    assert {s.kind for s in seen} == {"weight", "optimizer", "metric", "seed"}
    assert not any("momentum" in s.path or "velocity" in s.path for s in seen), (
        "slots must follow their variable, not ask the policy"
    )
    assert len(seen) == len(by_path), "each variable asked once"
    for v in model.weights:
        assert v.value.device.endswith("CPU:3" if v.value.kind == "weight" else "CPU:0")


def test_training_spread_over_two_parameter_devices_equals_one_device():
    x, y = make_data("dense", 192)
    reference = build_model("dense")
    reference.fit(x, y, batch_size=96, epochs=2, shuffle=False, verbose=0)
    model = _build_under(placement.round_robin(SPREAD), lambda: build_model("dense"))
    assert {v.value.device[-5:] for v in model.weights} == {"CPU:0", "CPU:3"}
    model.fit(x, y, batch_size=96, epochs=2, shuffle=False, verbose=0)
    assert_weights_close(reference.get_weights(), model.get_weights())


def test_gradients_are_reduced_where_each_variable_lives():
    model = _build_under(placement.round_robin(SPREAD), lambda: build_model("dense"))
    x, y = make_data("dense", 96)
    report = dpkeras.train_step_transfers(model, x, y, batch_size=96)
    home = {
        v.path.split("/", 1)[1]: dpkeras._device_names.short_device(v.value.device)
        for v in model.trainable_weights
    }
    grads = [t for t in report.transfers if "gradient_tape" in t.tensor]
    assert len(grads) == len(REPLICAS) * len(home)
    for t in grads:
        assert t.source in REPLICAS and t.destination in SPREAD
    # Between the two parameter devices only scalars travel (learning rate, iteration count).
    between = [t for t in report.transfers if {t.source, t.destination} == set(SPREAD)]
    assert all(t.shape in ((), None) for t in between), between
    assert sorted({t.destination for t in grads}) == sorted(set(home.values()))


def test_saving_and_loading_across_placements(tmp_path):
    x, y = make_data("dense", 96)
    spread = _build_under(placement.round_robin(SPREAD), lambda: build_model("dense"))
    spread.fit(x, y, batch_size=96, verbose=0)
    spread.save(tmp_path / "spread.keras")
    with dpkeras.scope(REPLICAS, "/cpu:3"):
        single = keras.models.load_model(tmp_path / "spread.keras")
    assert all(v.value.device.endswith("CPU:3") for v in single.weights)
    assert_weights_close(spread.get_weights(), single.get_weights(), rtol=0, atol=0)
    single.save(tmp_path / "single.keras")
    with dpkeras.scope(REPLICAS, placement.round_robin(SPREAD)):
        again = keras.models.load_model(tmp_path / "single.keras")
    assert {v.value.device[-5:] for v in again.weights} == {"CPU:0", "CPU:3"}
    assert_weights_close(spread.get_weights(), again.get_weights(), rtol=0, atol=0)


_PLACEMENT_PROGRAM = """
    import json, sys
    sys.path.insert(0, {tests!r})
    import dpkeras
    from dpkeras import placement
    from test_placement import _uneven_model
    with dpkeras.scope(["/cpu:1", "/cpu:2"], placement.greedy_by_size(["/cpu:0", "/cpu:3"])):
        model = _uneven_model()
    print(json.dumps({{v.path: v.value.device for v in model.weights}}))
"""


def test_placement_is_deterministic_across_processes():
    import pathlib

    tests = str(pathlib.Path(__file__).parent)
    runs = [
        json.loads(
            run_python(_PLACEMENT_PROGRAM.format(tests=tests), cpus=4).strip().splitlines()[-1]
        )
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    here = {v.path: v.value.device for v in _build_under(placement.greedy_by_size(SPREAD)).weights}
    assert here == runs[0]


BAD_POLICIES = [
    (
        lambda spec: "/cpu:9",
        r"placed variable 'sequential/embedding/embeddings' on /cpu:9, "
        r"which does not exist.*Available devices: /cpu:0",
    ),
    (
        lambda spec: 7,
        r"returned an invalid device for variable "
        r"'sequential/embedding/embeddings'.*Received: 7",
    ),
    (
        lambda spec: {}["missing"],
        r"failed for variable 'sequential/embedding/embeddings' "
        r"\(weight, shape \(2000, 32\)\): KeyError",
    ),
    (
        placement.by_path({r"dense": "/cpu:3"}),
        r"no by_path\(\) rule matches 'sequential/embedding/embeddings' and there is no default",
    ),
]


@pytest.mark.parametrize("policy,message", BAD_POLICIES)
def test_bad_policies_fail_before_training_naming_the_variable(policy, message):
    with pytest.raises(ValueError, match=message):
        _build_under(policy)


@pytest.mark.parametrize(
    "make,message",
    [
        (lambda: placement.round_robin("/cpu:0"), r"round_robin\(\) needs a non-empty list"),
        (lambda: placement.greedy_by_size(["/cpu:0", "cpu:0"]), r"lists a device twice"),
        (lambda: placement.by_path([("x", "/cpu:0")]), r"by_path\(\) needs a dict"),
        (lambda: placement.by_path({"(": "/cpu:0"}), r"'\(' is not a valid regular expression"),
        (
            lambda: placement.by_path({"x": "/cpu:0"}, default=3),
            r"by_path\(\): default must be a device string, a list of devices, a placement "
            r"policy or placement.REPLICATED. Received: 3 \(of type int\)",
        ),
        (
            lambda: placement.by_path({"x": "/cpu:0", "y": {}}),
            r"by_path\(\): the rule 'y' must be .* Received: \{\} \(of type dict\)",
        ),
        (
            lambda: placement.by_path({"x": placement.REPLICATED}),
            r"by_path\(\) answers placement.REPLICATED but names no device: metric state .* "
            r"Received: rules=\{'x': dpkeras.placement.REPLICATED\}, default=None",
        ),
    ],
)
def test_bad_policy_arguments(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_environment_list_of_parameter_devices(monkeypatch):
    monkeypatch.setenv("DPKERAS_PARAMETER_DEVICE", "/cpu:0,/cpu:3")
    strategy = dpkeras.ParameterDeviceStrategy(REPLICAS)
    assert [d[-5:] for d in strategy.extended.parameter_devices] == ["CPU:0", "CPU:3"]


def test_placement_report_of_a_model_and_of_a_strategy():
    model = _build_under(placement.by_path({r"embedding": "/cpu:0"}, default="/cpu:3"))
    x, y = np.zeros((8, 6), "int32"), np.zeros(8, "int32")
    model.fit(x, y, batch_size=8, verbose=0)
    report = dpkeras.placement_report(model)
    rows = {r.path: r for r in report.rows}
    table = rows["sequential/embedding/embeddings"]
    assert (table.kind, table.shape, table.dtype, table.bytes, table.device) == (
        "weight",
        (2000, 32),
        "float32",
        256000,
        "/cpu:0",
    )
    assert {r.kind for r in report.rows} == {"weight", "optimizer", "metric"}
    totals = report.totals
    assert sum(n for n, _ in totals.values()) == len(report.rows)
    assert totals["/cpu:0"][1] == sum(r.bytes for r in report.rows if r.device == "/cpu:0")
    text = str(report)
    assert "┃ Variable" in text and "sequential/embedding/embeddings" in text
    assert "/cpu:0:" in text and "/cpu:3:" in text
    strategy_report = dpkeras.placement_report(dpkeras.get_strategy(REPLICAS, "/cpu:0"))
    assert strategy_report.title.startswith("Placement: ParameterDeviceStrategy(")
    lines = []
    report.print(print_fn=lines.append)
    assert lines == [text]


def test_placement_report_rejects_other_objects():
    with pytest.raises(
        TypeError,
        match=r"takes a keras.Model or a "
        r"dpkeras.ParameterDeviceStrategy.*of type int",
    ):
        dpkeras.placement_report(3)


# ---------------------------------------------------------------------------------------------
# TF1's device functions: `replica_device_setter` as it is, any other through
# `placement.device_function`. Round robin over ps tasks needs a cluster:
# tests/test_cluster_training.py::test_replica_device_setter_places_round_robin_over_the_ps_tasks.

CPU3 = "/job:localhost/replica:0/task:0/device:CPU:3"


def _dense_model():
    return keras.Sequential([keras.Input((3,)), L.Dense(4, name="fc"), L.Dense(2, name="out")])


def test_replica_device_setter_is_a_placement_policy_asked_as_tf1_asked_it():
    """Its `ps_strategy` sees one VarHandleOp per variable, named by its path, with its dtype
    and shape, in creation order; the variables go where the device function says."""
    asked = []

    def ps_strategy(op):
        shape = tf.TensorShape(op.node_def.attr["shape"].shape).as_list()
        asked.append((op.name, op.node_def.op, tf.as_dtype(op.node_def.attr["dtype"].type), shape))
        return 0

    setter = tf.compat.v1.train.replica_device_setter(
        ps_tasks=1, ps_device="/job:localhost", worker_device="/cpu:1", ps_strategy=ps_strategy
    )
    with dpkeras.scope(REPLICAS, setter) as strategy:
        model = _dense_model()
    assert asked == [
        ("sequential/fc/kernel", "VarHandleOp", tf.float32, [3, 4]),
        ("sequential/fc/bias", "VarHandleOp", tf.float32, [4]),
        ("sequential/out/kernel", "VarHandleOp", tf.float32, [4, 2]),
        ("sequential/out/bias", "VarHandleOp", tf.float32, [2]),
    ]
    assert {v.value.device for v in model.weights} == {CPU3.replace("CPU:3", "CPU:0")}
    assert repr(strategy.extended.placement_policy) == (
        "placement.device_function(replica_device_setter(...))"
    )


def test_a_ps_strategy_balancing_by_bytes_reads_them_off_the_variable_s_op():
    """A load function written for TF1's `VariableV2` ops (tf_cnn_benchmarks'
    `byte_size_load_fn`: the op's one output's dtype size times its shape, else the `shape`
    attribute) reads each variable's bytes off its stand-in op."""
    loads = []

    def byte_size(op):
        (output,) = op.outputs
        shape = output.get_shape()
        assert tf.TensorShape(op.get_attr("shape")) == shape and op.get_attr("dtype") == tf.float32
        return shape.num_elements() * output.dtype.size

    def greedy(op):  # the least-loaded task so far, as GreedyLoadBalancingStrategy
        loads.append((op.name, byte_size(op)))
        return 0

    setter = tf.compat.v1.train.replica_device_setter(
        ps_tasks=1, ps_device="/job:localhost", worker_device="/cpu:1", ps_strategy=greedy
    )
    with dpkeras.scope(REPLICAS, setter):
        _dense_model()
    assert loads == [
        ("sequential/fc/kernel", 3 * 4 * 4),
        ("sequential/fc/bias", 4 * 4),
        ("sequential/out/kernel", 4 * 2 * 4),
        ("sequential/out/bias", 2 * 4),
    ]


def test_a_tf1_device_function_of_op_type_places_variables_by_it():
    """The TF1 idiom's own function (TF1_IDIOMS.md, idiom 1), wrapped."""

    def my_device_placement(device, vars_device):
        def device_function(op):
            return vars_device if op.type in ["Variable", "VariableV2", "VarHandleOp"] else device

        return device_function

    policy = placement.device_function(my_device_placement("/cpu:1", "/cpu:3"))
    with dpkeras.scope(REPLICAS, policy):
        model = _dense_model()
        model.compile(optimizer="sgd", loss="mse")
    assert {v.value.device for v in model.weights} == {CPU3}
    model.fit(np.ones((4, 3)), np.ones((4, 2)), batch_size=4, verbose=0)
    assert placement.device_function(policy) is policy


def test_the_tf_internals_recognise_replica_device_setter():
    """Fails loudly if a TensorFlow upgrade renames `_ReplicaDeviceChooser`: without it, TF1's
    device function would be called with a VariableSpec and fail on `spec.device`."""
    from dpkeras import _tf_internals

    setter = tf.compat.v1.train.replica_device_setter(ps_tasks=2)
    assert _tf_internals.is_replica_device_setter(setter)
    assert not _tf_internals.is_replica_device_setter(lambda op: "/cpu:0")
    assert not _tf_internals.is_replica_device_setter(placement.single("/cpu:0"))
    assert setter(
        placement._VariableOp(placement.VariableSpec("w", (2,), "float32", True, "other"))
    )


def test_error_a_device_function_answering_no_device_of_this_process():
    """`ps_device` without a job: TF1 answers a device pattern (`/device:CPU:*`)."""
    setter = tf.compat.v1.train.replica_device_setter(ps_tasks=2, ps_device="/cpu")
    with dpkeras.VariableStore():
        with pytest.raises(
            ValueError,
            match=r"^The placement policy placement.device_function\(replica_device_setter"
            r"\(\.\.\.\)\) returned an invalid device for variable 'sequential/fc/kernel': .* "
            r"Received: '/device:CPU:\*'$",
        ):
            _build_under(setter, _dense_model)
    with pytest.raises(ValueError, match=r"device_function\(\) takes a TF1 device function.*"):
        placement.device_function("/cpu:0")
