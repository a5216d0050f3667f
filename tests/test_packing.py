"""Packing: the dense gradients a worker sends to one parameter device cross as one tensor.

Built in a graph with a cluster's device names and never run: what crosses where, and in what
order each sum adds its terms, are the graph's structure (`dpkeras._extended.packing`). The
numbers are checked on a real cluster by tests/test_cluster_loop.py.
"""

import numpy as np
import tensorflow as tf
from tensorflow.python.framework import func_graph

import dpkeras
from dpkeras._extended import packing, reductions
from dpkeras._variables import placed, replica_step

PS0 = "/job:ps/replica:0/task:0/device:CPU:0"
PS1 = "/job:ps/replica:0/task:1/device:CPU:0"
WORKERS = [f"/job:worker/replica:0/task:{i}/device:CPU:0" for i in range(3)]


def _gradient(shape, dtype=tf.float32, devices=WORKERS):
    """One component per replica, each on its worker."""
    parts = []
    for device in devices:
        with tf.device(device):
            parts.append(tf.compat.v1.placeholder(dtype, shape))
    return parts


def _ops(graph, kind):
    return [op for op in graph.get_operations() if op.type == kind]


def _source_worker(tensor):
    """The worker whose pack (or own component) a term of a sum comes from."""
    op = tensor.op
    while op.type in ("Reshape", "SplitV", "ConcatV2", "Identity"):
        op = op.inputs[0].op
    return tf.DeviceSpec.from_string(op.device).task


def test_gradients_for_one_ps_cross_as_one_tensor_per_worker_dtype_and_ps():
    graph = tf.Graph()
    with graph.as_default():
        entries = [
            (_gradient([2, 3]), PS0),
            (_gradient([4]), PS0),
            (_gradient([5]), PS1),
            (_gradient([3]), PS1),
            (_gradient([2], tf.float64), PS0),
            (_gradient([2], tf.float64), PS0),
            (_gradient([1]), PS1),
        ]
        sums = packing.sum_packed(entries)
    assert all(s is not None for s in sums)
    packs = sorted(
        (
            tf.DeviceSpec.from_string(op.device).task,
            op.outputs[0].dtype.name,
            op.outputs[0].shape.num_elements(),
        )
        for op in _ops(graph, "ConcatV2")
    )
    # Per worker: ps 0's float32 gradients (6 + 4), ps 1's (5 + 3 + 1), ps 0's float64 (2 + 2).
    assert packs == sorted(
        (w, dtype, n)
        for w in range(3)
        for dtype, n in (("float32", 10), ("float32", 9), ("float64", 4))
    )
    for op in _ops(graph, "ConcatV2"):
        assert op.device.startswith("/job:worker/"), op.device  # packed where it is computed
    for op in _ops(graph, "SplitV"):
        assert op.device.startswith("/job:ps/"), op.device  # split where it is summed
    for total, (components, device) in zip(sums, entries):
        assert total.device == device
        assert total.shape == components[0].shape and total.dtype == components[0].dtype
        # Each sum adds one term per worker, in the workers' order (as its own sum would).
        assert [_source_worker(t) for t in total.op.inputs] == [0, 1, 2]
        for term in total.op.inputs:
            split = term.op.inputs[0].op
            assert split.type == "SplitV" and split.device == device


def test_terms_on_the_variables_own_task_are_added_first_and_not_packed():
    """A cluster without ps tasks: the variables live on worker 0, whose own replica's gradient
    stays there; workers 1 and 2 each send one pack."""
    graph = tf.Graph()
    with graph.as_default():
        entries = [(_gradient([3]), WORKERS[0]), (_gradient([2, 2]), WORKERS[0])]
        sums = packing.sum_packed(entries)
    assert sorted(tf.DeviceSpec.from_string(op.device).task for op in _ops(graph, "ConcatV2")) == [
        1,
        2,
    ]
    for total, (components, _) in zip(sums, entries):
        inputs = list(total.op.inputs)
        assert inputs[0] is components[0]  # worker 0's own term, first, as it was
        assert [_source_worker(t) for t in inputs] == [0, 1, 2]
    # Worker 1 runs two replicas (GPUs, say): it sums their gradients first and sends one pack.
    two = [WORKERS[0], WORKERS[1], WORKERS[1].replace("CPU:0", "CPU:1"), WORKERS[2]]
    graph = tf.Graph()
    with graph.as_default():
        entries = [(_gradient([3], devices=two), WORKERS[0]) for _ in range(2)]
        sums = packing.sum_packed(entries)
    for total, (components, _) in zip(sums, entries):
        inputs = list(total.op.inputs)
        assert inputs[0] is components[0]
        assert [_source_worker(t) for t in inputs] == [0, 1, 2]
    presums = [op for op in _ops(graph, "AddN") if "task:1" in op.device]
    assert len(presums) == 2  # one per gradient, on worker 1, before packing


def test_a_presummed_sum_adds_its_own_tasks_terms_in_replica_order_then_each_tasks_presum():
    """`presum_by_task` where a sum has terms from several tasks and some task runs two
    replicas: worker 0 holds the variable and runs replicas 0 and 1, worker 1 replicas 2 and
    3, worker 2 replica 4. The sum on worker 0 adds replicas 0 and 1 as they are, in their
    order, then worker 1's presum (made on worker 1) and worker 2's term: the order of the
    replicas. So it does alone (`ReductionLedger.reduce_components`, dense: an `AddN`;
    sparse: a concatenation of the rows) and packed (`packing.sum_packed`)."""
    replicas = [
        WORKERS[0],
        WORKERS[0].replace("CPU:0", "CPU:1"),
        WORKERS[1],
        WORKERS[1].replace("CPU:0", "CPU:1"),
        WORKERS[2],
    ]

    def presum_of(tensor, parts):  # an AddN (dense) or ConcatV2 (rows) of `parts`, on worker 1
        inputs = list(tensor.op.inputs)
        if tensor.op.type == "ConcatV2":
            inputs = inputs[:-1]  # the last input is the axis
        assert len(inputs) == len(parts) and all(a is b for a, b in zip(inputs, parts))
        assert tf.DeviceSpec.from_string(tensor.device).task == 1, tensor.device

    ledger = reductions.ReductionLedger(len(replicas), lambda value: value)
    graph = tf.Graph()
    with graph.as_default():
        dense = _gradient([3], devices=replicas)
        total = ledger.reduce_components("SUM", dense, WORKERS[0])
        assert total.op.type == "AddN" and total.device == WORKERS[0]
        terms = list(total.op.inputs)
        assert len(terms) == 4
        assert terms[0] is dense[0] and terms[1] is dense[1] and terms[3] is dense[4]
        presum_of(terms[2], dense[2:4])

        rows = []
        for device in replicas:
            with tf.device(device):
                rows.append(
                    tf.IndexedSlices(
                        tf.compat.v1.placeholder(tf.float32, [2, 3]),
                        tf.compat.v1.placeholder(tf.int64, [2]),
                        tf.constant([9, 3], tf.int64),
                    )
                )
        total = ledger.reduce_components("SUM", rows, WORKERS[0])
        assert isinstance(total, tf.IndexedSlices)
        for part in ("values", "indices"):
            concat = getattr(total, part).op
            assert concat.type == "ConcatV2", concat.type
            terms = list(concat.inputs)[:-1]  # the last input is the axis
            ours = [getattr(r, part) for r in rows]
            assert len(terms) == 4
            assert terms[0] is ours[0] and terms[1] is ours[1] and terms[3] is ours[4]
            presum_of(terms[2], ours[2:4])

        entries = [(_gradient([3], devices=replicas), WORKERS[0]) for _ in range(2)]
        sums = packing.sum_packed(entries)
    for total, (components, _) in zip(sums, entries):
        terms = list(total.op.inputs)
        assert terms[0] is components[0] and terms[1] is components[1]
        assert [_source_worker(t) for t in terms] == [0, 0, 1, 2]


def test_nothing_is_packed_where_nothing_crosses_a_task_or_alone():
    graph = tf.Graph()
    local = [f"/job:localhost/replica:0/task:0/device:CPU:{i}" for i in range(2)]
    with graph.as_default():
        on_one_machine = [(_gradient([3], devices=local), local[0]) for _ in range(3)]
        assert packing.sum_packed(on_one_machine) == [None, None, None]
        alone = [(_gradient([3]), PS0), (_gradient([3]), PS1), (_gradient([3], tf.float64), PS0)]
        assert packing.sum_packed(alone) == [None, None, None]  # one per ps and dtype
        with tf.device(WORKERS[1]):
            rows = tf.IndexedSlices(tf.zeros([2, 3]), tf.constant([0, 1]), tf.constant([9, 3]))
        sparse = [([rows, rows, rows], PS0), ([rows, rows, rows], PS0)]
        assert packing.sum_packed(sparse) == [None, None]
        unknown = [(_gradient([None]), PS0), (_gradient([None]), PS0)]
        assert packing.sum_packed(unknown) == [None, None]
    assert _ops(graph, "ConcatV2") == [] and _ops(graph, "SplitV") == []
    # Eagerly each op is its own call: nothing to pack.
    assert packing.sum_packed([([tf.ones([2])] * 2, PS0)] * 2) == [None, None]


def test_a_gradient_larger_than_a_pack_crosses_alone_with_its_shape(monkeypatch):
    monkeypatch.setattr(packing, "PACK_BYTES", 64)
    graph = tf.Graph()
    with graph.as_default():
        entries = [(_gradient([4, 4]), PS0), (_gradient([3]), PS0), (_gradient([5]), PS0)]
        sums = packing.sum_packed(entries)
    assert sums[0] is None  # 64 bytes: alone, summed as before, never flattened
    assert sums[1] is not None and sums[2] is not None
    assert sorted(op.outputs[0].shape.num_elements() for op in _ops(graph, "ConcatV2")) == [8] * 3


def test_a_variable_sums_its_dense_gradient_plainly_only_if_kept_whole_on_one_device():
    """Replicated copies are all-reduced and shards summed shard by shard: neither is packed."""
    replicas = ["/cpu:1", "/cpu:2"]
    hybrid = dpkeras.get_strategy(replicas, dpkeras.placement.hybrid())
    with hybrid.scope():
        replicated = tf.Variable(tf.zeros([3]))
    cut = dpkeras.get_strategy(
        replicas,
        ["/cpu:0", "/cpu:3"],
        partitioner=tf.distribute.experimental.partitioners.FixedShardsPartitioner(2),
    )
    with cut.scope():
        table = tf.Variable(tf.zeros([10, 2]))
    with dpkeras.get_strategy(replicas, "/cpu:0").scope():
        whole = tf.Variable(tf.zeros([3]))
    assert placed.of(replicated).copy_devices
    assert placed.of(replicated).dense_sum_device is None
    assert len(placed.of(table).parts) == 2
    assert placed.of(table).dense_sum_device is None
    assert len(placed.of(whole).parts) == 1
    assert placed.of(whole).dense_sum_device == whole.device
    np.testing.assert_array_equal(whole.numpy(), np.zeros(3))


# -- reads: the variables a worker reads from one ps cross as one tensor ----------------------


def _pull(pulls, variable, source, host, shape, dtype=tf.float32, used=True):
    """A replica's pull of `variable` (its read on `source`, copied to `host`), as
    `WholeVariable._new_replica_read` makes it, and the step's use of it; recorded in `pulls`
    if it may be packed."""
    with tf.device(source):
        read = tf.compat.v1.placeholder(dtype, shape)
    with tf.device(host):
        pulled = tf.identity(read)
        if used:
            tf.math.square(pulled)
        tf.shape(pulled, out_type=tf.int64)  # a use of its shape alone: not a use
    pulls.add(variable, host, read, pulled)
    return read, pulled


def _variables(n):
    with dpkeras.scope():
        return [tf.Variable(float(i)) for i in range(n)]


def test_reads_from_one_ps_to_one_host_cross_as_one_tensor_per_dtype():
    v = _variables(6)
    hosts = WORKERS[1:]
    graph = tf.Graph()
    with graph.as_default():
        pulls = replica_step.Pulls(graph)
        made = [
            _pull(pulls, v[0], PS0, hosts[0], [2, 3]),
            _pull(pulls, v[1], PS0, hosts[0], [4]),
            _pull(pulls, v[2], PS1, hosts[0], [5]),  # alone from its ps: not packed
            _pull(pulls, v[0], PS0, hosts[1], [2, 3]),
            _pull(pulls, v[1], PS0, hosts[1], [4]),
            _pull(pulls, v[3], PS0, hosts[1], [2], tf.float64),  # alone in its dtype
            # read whole but unused (a table whose rows are gathered): TensorFlow sends
            # nothing for it, and packed it would cross whole every step
            _pull(pulls, v[4], PS0, hosts[1], [7], used=False),
        ]
        packing.pack_reads(pulls)
    concats = _ops(graph, "ConcatV2")
    assert len(concats) == 2  # PS0 -> each host, float32
    assert {c.device for c in concats} == {PS0}
    for read, pulled in made:
        source = pulled.op.inputs[0]
        if read.shape in ([5], [7]) or read.dtype == tf.float64:
            assert source is read  # sent as before
            continue
        assert source.op.type == "Reshape" and source.op.device == pulled.op.device
        split = source.op.inputs[0].op
        assert split.type == "SplitV" and split.device == pulled.op.device
        concat = split.inputs[0].op
        assert concat.type == "ConcatV2" and concat.device == PS0
        # the piece is this read's: the concat's inputs are the reads, flattened, in order
        flat = [i.op.inputs[0] for i in concat.inputs[:-1]]
        assert read in flat
        offsets = np.cumsum([0] + [t.shape.num_elements() for t in flat])
        k = flat.index(read)
        assert tf.get_static_value(split.inputs[1]).tolist() == np.diff(offsets).tolist()
        assert source.op.inputs[0] is split.outputs[k]


def test_reads_pack_at_most_pack_bytes_and_a_larger_read_crosses_alone(monkeypatch):
    monkeypatch.setattr(packing, "PACK_BYTES", 40)  # 10 floats
    v = _variables(4)
    graph = tf.Graph()
    with graph.as_default():
        pulls = replica_step.Pulls(graph)
        made = [_pull(pulls, v[i], PS0, WORKERS[1], [n]) for i, n in enumerate([4, 6, 11, 3])]
        packing.pack_reads(pulls)
    sizes = sorted(len(c.inputs) - 1 for c in _ops(graph, "ConcatV2"))
    assert sizes == [2]  # 4 + 6 floats; 11 alone; 3 alone after it
    assert made[2][1].op.inputs[0] is made[2][0] and made[3][1].op.inputs[0] is made[3][0]


def test_a_pull_is_packed_only_as_a_first_read_before_any_write_in_the_calls_own_graph():
    """A read the automatic control dependencies order after a write (to its variable, in
    this graph or in one nested in it) could depend on the step's own values: packing it with
    reads the step consumes would make a cycle. Reads in a nested graph (a `tf.cond` branch, a
    `tf.function`) cannot be rewired from the call's graph; reads of unknown shape cannot be
    cut."""
    v = _variables(5)
    graph = func_graph.FuncGraph("call")
    with graph.as_default():
        pulls = replica_step.Pulls(graph)
        _pull(pulls, v[0], PS0, WORKERS[1], [1])
        v[1].assign(3.0)  # written in the call's graph before its read
        _pull(pulls, v[1], PS0, WORKERS[1], [1])
        inner = func_graph.FuncGraph("inner")
        inner.outer_graph = graph
        with inner.as_default():
            v[2].assign(4.0)  # written in a nested graph: counts for the call's graph too
            _pull(pulls, v[3], PS0, WORKERS[1], [1])  # read in a nested graph
        _pull(pulls, v[2], PS0, WORKERS[1], [1])
        _pull(pulls, v[4], PS0, WORKERS[1], [None])  # unknown shape
        # made to wait for a value of the step (an assert on a layer's input): packed with
        # the reads that value comes from, it would wait for itself
        with tf.control_dependencies([tf.identity(_pull(pulls, v[0], PS0, WORKERS[2], [1])[1])]):
            _pull(pulls, v[3], PS0, WORKERS[2], [1])
    assert [entry[0] for entry in pulls.entries] == [v[0], v[0]]
    with graph.as_default():
        assert v[1].written_in_graph() and v[2].written_in_graph()
        assert not v[0].written_in_graph()
    assert not v[1].written_in_graph()  # eagerly: nothing is recorded
