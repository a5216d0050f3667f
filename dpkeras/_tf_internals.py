"""Every private TensorFlow use dpkeras makes, in one place, each with its reason.

The public `tf.distribute` API lets users *use* a strategy, not *write* one: a strategy's
extended class, its replica threads, its distributed datasets and its value containers are all
private. Keeping those uses here means a TensorFlow upgrade breaks one file; it is checked
against every TensorFlow of dpkeras's span (`dpkeras._version`, the matrix of noxfile.py, which
runs tests/test_architecture.py's checks of these members on each). Each import
below says why no public API does it; `tests/test_architecture.py` checks that no other module
imports TensorFlow's private modules or reads private attributes of its objects.

dpkeras's classes that derive from the private classes exported here live with their concept:
the extended class in `_extended/`, the variables in `_variables/`, input's distributed datasets
in `_input/at_first_use.py`. What each overrides of TensorFlow's, a method or an instance
attribute its base sets, is listed with the reason in `tests/test_architecture.py`, which fails
if the installed TensorFlow no longer has it.
"""

# ruff: noqa: F401
import sys

import tensorflow as tf

# On a cluster each input host (a worker task's CPU) runs its own copy of the input pipeline:
# a dataset made on the client must be serialised and rebuilt on each input host, as TF's own
# distributed datasets do (`input_lib`); there is no public call. dpkeras also reads and edits
# that graph before rebuilding it (`pipeline_graph`, `dataset_from_graph`), to give a random op
# or dataset that has no seed the same seeds on every host (`dpkeras._input.seeds`): with
# `replicate`'s own class (`_RemoteDataset`) and serialisation options (ExternalStatePolicy).
from tensorflow.python.data.experimental.ops.distribute import _RemoteDataset, replicate

# Which iterator TensorFlow made for an input host (see `host_iterator_kinds`): the class of a
# MultiDeviceIterator is not exported.
from tensorflow.python.data.ops.multi_device_iterator_ops import OwnedMultiDeviceIterator
from tensorflow.python.data.ops.options import ExternalStatePolicy

# An epoch's iterator that makes its input hosts' iterators at first use
# (`dpkeras._input.at_first_use`) derives from TensorFlow's own distributed dataset and
# iterator classes, so `tf.function` and Keras take it as theirs, and makes the hosts' datasets
# and iterators as they do (`datasets_from_function`, `iterators_per_host`). The members of
# these classes it overrides and reads are listed in tests/test_architecture.py.
from tensorflow.python.distribute import input_lib as _input_lib

# A strategy's extended class must derive from StrategyExtendedV1: `Strategy.run` and
# `merge_call` reach `call_for_each_replica` and `_use_merge_call`, which only V1 defines.
# UpdateContext marks "inside `extended.update`" as TF's own strategies do, so code that checks
# `tf.distribute.in_cross_replica_context()` behaves the same. InputContext,
# InputReplicationMode and ValueContext are what `dataset_fn` and `value_fn` receive, and the
# input options' enum: public only as types, not constructors.
from tensorflow.python.distribute.distribute_lib import (
    InputContext,
    InputReplicationMode,
    StrategyExtendedV1,
    UpdateContext,
    ValueContext,
)

# The per-replica containers `strategy.run` returns and `experimental_local_results` unpacks
# (`tf.distribute.DistributedValues` cannot be built); a distributed dataset's element spec
# holds one spec per replica (PerReplicaSpec), and building a Keras model from the spec alone
# needs one replica's.
from tensorflow.python.distribute.distribute_utils import regroup

# Distributed datasets (rebatching a global batch into per-replica batches, prefetching to the
# compute devices, DistributedIterator) have no public constructor.
from tensorflow.python.distribute.input_lib import (
    DistributedDataset,
    DistributedDatasetsFromFunction,
    DistributedIterator,
    InputWorkers,
)

# `Strategy.run` in TF's strategies is a thread per replica, lock-stepped at `merge_call`; it
# also turns a `tf.function` replica fn into one function holding all replicas, which Keras's
# TF trainer relies on. Writing our own would duplicate ~400 lines of delicate threading;
# CentralStorageStrategy reuses it the same way.
from tensorflow.python.distribute.mirrored_run import call_for_each_replica
from tensorflow.python.distribute.values import Mirrored, PerReplicaSpec

# Counting the tensors a step sends needs the partitioned graphs TF runs; only the eager
# context's run-metadata switch exposes them. It also tells whether TF has initialised its
# devices (for `simulate_cpu_devices`).
from tensorflow.python.eager import context as _context

# A cached replica-side read of a variable must be registered on the GradientTape as a read of
# that variable (`ResourceVariable._read_variable_op` does the same), and a replica that uses
# the copy its task already pulled must tell its (thread-local) tape that it accessed the
# variable (`variable_accessed`); there is no public way to add an edge to the tape.
from tensorflow.python.eager.record import record_operation

# Which inputs of a dataset op are its seeds (`op_inputs`, for `dpkeras._input.seeds`): the
# op's registered definition; `tf.raw_ops` gives only a Python function.
from tensorflow.python.framework import op_def_registry

# A variable is created under `tf.device(chosen device)` with any enclosing colocation
# constraint cleared (Keras may create optimizer state inside a colocation scope of the graph
# being traced); `tf.compat.v1.colocate_with` does the same but is deprecated and logs a
# warning each time, and TF's own "internal interface" is this one.
from tensorflow.python.framework import ops as _ops

# The variable dpkeras hands to Keras shares the handle of the one the creator chain made; only
# BaseResourceVariable has a handle-taking constructor (see `handle_sharing_arguments`).
from tensorflow.python.ops.resource_variable_ops import (
    BaseResourceVariable,
    is_resource_variable,
    variable_accessed,
)

# TF1's `tf.compat.v1.train.replica_device_setter` returns the bound method `device_function`
# of a `_ReplicaDeviceChooser` (a device function of an op), which a placement policy cannot
# tell from a policy of a `VariableSpec` by its signature; no public type names it. dpkeras
# recognises it by its class, to ask it about a stand-in op of each variable
# (`dpkeras.placement.device_function`).
from tensorflow.python.training.device_setter import _ReplicaDeviceChooser

# `tf.experimental.dispatch_for_api` (public) only dispatches on types registered as
# dispatchable (ExtensionTypes register themselves); Keras variables must be registered for
# the `tf.gather` dispatcher of `dpkeras._variables.lookups` to see them.
from tensorflow.python.util.dispatch import register_dispatchable_type


def replace_input(op, index, tensor):
    """Makes `op` (of the graph being traced) read `tensor` as its input `index` instead.

    The reads of a step's variables that cross from one ps to one worker are known only once
    the replicas are traced (`dpkeras._extended.packing.pack_reads`); their copies on the
    worker, already used by the step, then take their values from one packed tensor. Graph
    operations have no public way to change an input; `tf.cond` and `tf.while_loop` (v2)
    rewire their own ops with this one. tests/test_packing.py fails if it is gone.
    """
    op._update_input(index, tensor)  # pylint: disable=protected-access


def function_names():
    """The names of the functions registered in the eager context: what tracing a
    `tf.function`, and making TensorFlow's distributed iterators, add. Tests count them per
    fit (tests/test_whole_batches.py); only the context lists them."""
    return frozenset(_context.context().list_function_names())


def enable_run_metadata():
    """Starts recording partition graphs of functions instantiated from now on.

    Anything recorded before (by an earlier recording, see below) is discarded first.
    """
    context = _context.context()
    context.enable_run_metadata()
    context.export_run_metadata()


def export_and_disable_run_metadata():
    """Returns the recorded `RunMetadata` proto and stops recording.

    `disable_run_metadata` alone leaves the context storing the graphs of every function it
    instantiates afterwards (TF 2.21), which would grow for the rest of the process;
    `disable_graph_collection` turns that off.
    """
    context = _context.context()
    try:
        return context.export_run_metadata()
    finally:
        context.disable_run_metadata()
        context.disable_graph_collection()


def context_initialized():
    """Whether TensorFlow has already initialised its devices in this process."""
    return _context.context()._initialized  # pylint: disable=protected-access


def no_colocation():
    """A context that clears enclosing colocation constraints (graph mode); see above."""
    return _ops.colocate_with(None, ignore_existing=True)


def replica_spec(spec):
    """One replica's spec of a distributed dataset's element spec component."""
    return spec._component_specs[0] if isinstance(spec, PerReplicaSpec) else spec


def handle_sharing_arguments(variable):
    """`BaseResourceVariable.__init__` arguments for a variable sharing `variable`'s handle.

    A `ParameterVariable` is a second Python object over the resource the creator chain made
    (`dpkeras._variables.variables`). The handle-taking constructor needs the original's
    initialisation state (initial value and ops, caching device, graph element, unique id,
    distribute strategy), which TensorFlow keeps only in private attributes of the variable.
    """
    name = variable.name
    return dict(
        trainable=variable.trainable,
        shape=variable.shape,
        dtype=variable.dtype,
        handle=variable.handle,
        constraint=variable.constraint,
        synchronization=variable.synchronization,
        aggregation=variable.aggregation,
        distribute_strategy=variable._distribute_strategy,
        name=name,
        unique_id=variable._unique_id,
        handle_name=name[:-2] if name.endswith(":0") else name,
        graph_element=variable._graph_element,
        initial_value=variable._initial_value,
        initializer_op=variable._initializer_op,
        is_initialized_op=variable._is_initialized_op,
        cached_value=variable._cached_value,
        save_slice_info=variable._save_slice_info,
        caching_device=variable._caching_device,
        in_graph_mode=variable._in_graph_mode,
        validate_shape=variable._validate_shape,
    )


def restore_variable(variable, restored_tensors):
    """What `BaseResourceVariable` does with a checkpoint's value: assigns it to the current
    handle (checking the shape). A replicated variable restores each copy this way
    (`dpkeras._variables.replicated`); the method is the private half of TensorFlow's
    `Trackable` saving protocol, with no public equivalent."""
    return BaseResourceVariable._restore_from_tensors(variable, restored_tensors)


# -- tf.data pipelines: which transformations a dataset is made of --------------------------
# dpkeras cuts a dataset's elements to the input hosts of a cluster before its per-element maps
# (dpkeras/_input/sharding.py); tf.data offers no public way to see a dataset's transformations
# or to apply one of them again to another input. These read the Python dataset objects'
# private attributes (TensorFlow 2.21's `dataset_ops`); tests/test_input_sharding.py fails if a
# standard pipeline is no longer recognised.

_KINDS = {
    "_OptionsDataset": "options",
    "_PrefetchDataset": "prefetch",
    "_BatchDataset": "batch",
    "_MapDataset": "map",
    "_ParallelMapDataset": "map",
    "_RepeatDataset": "repeat",
    "_ShuffleDataset": "shuffle",
}


def new_variable_handle(variable):
    """A handle to a new, uninitialised resource for `variable` on its device, carrying the
    shape and dtype that reads in a traced function infer from (as `tf.Variable` makes them).

    After a ps task restarted, the resources this client's variables had there are gone; the
    client makes new ones in their place (`dpkeras._patches.lost_tasks`). TensorFlow makes a
    variable's handle in the private `resource_variable_ops.eager_safe_variable_handle` and
    keeps it in the private `_handle` (`variable_handle_attribute`); no public API makes a
    variable's resource again.
    """
    from tensorflow.python.ops import resource_variable_ops

    with tf.device(variable.device):
        return resource_variable_ops.eager_safe_variable_handle(
            initial_value=tf.zeros(variable.shape, variable.dtype),
            shape=variable.shape,
            shared_name=None,  # eager: an anonymous resource, as a new tf.Variable's
            name=variable.name.split(":")[0],
            graph_mode=False,
        )


def new_table_state(table, device, default_value):
    """`{attribute: value}` that make a `tf.lookup` table's resource again, empty, on
    `device`, in the same Python object (its checkpoint tracking and the layers holding it
    unchanged), once set on it in order: after a ps task restarted, the table this client had
    there is gone (`dpkeras._patches.lost_tasks`), and so is its default value, a tensor made on
    `device` with it (`default_value` makes it again). TensorFlow's tables make their resource
    in the private `_create_resource` and keep it in the private `_resource_handle`, the
    default in the private `_default_value`; no public API makes them again."""
    with tf.device(device):
        return {
            "_default_value": tf.convert_to_tensor(default_value, table.value_dtype),
            "_resource_handle": table._create_resource(),
        }


def variable_handle_attribute():
    """The attribute in which a `BaseResourceVariable` keeps its handle (see
    `new_variable_handle`)."""
    return "_handle"


def reconnect_restarted_tasks():
    """Connects this client again to the tasks of its cluster that restarted, keeping its
    state on every other task.

    `tf.config.experimental_connect_to_cluster` with the cluster this process is connected to
    ends in the private `Context.update_server_def`, which compares each task's incarnation:
    a task that restarted is treated as removed and added (a context of this client made on
    it again), every other task keeps this client's context, variables and functions
    (measured: 0.04-0.2 s, the worker's variables readable after). It is called with the
    server definition in force (`Context.get_server_def`), so nothing else changes.
    """
    ctx = _context.context()
    ctx.update_server_def(ctx.get_server_def())


def server_def():
    """The server definition this client is connected with (a `tensorflow.ServerDef`, a
    copy): its cluster, and this process's job and task in it (`Context.get_server_def`, see
    `reconnect_restarted_tasks`)."""
    return _context.context().get_server_def()


def connect_with(definition):
    """Connects this client to the cluster of server definition `definition` (from
    `server_def`, changed), keeping its state on every task it was connected to and still
    has: a task left out of the cluster is dropped (this client's context there is forgotten,
    measured: 0.004 s with the task dead), one added (or restarted) gets a context of this
    client, as in `reconnect_restarted_tasks`."""
    _context.context().update_server_def(definition)


def dataset_kind(dataset):
    """`"options"`, `"prefetch"`, `"batch"`, `"map"`, `"repeat"`, `"shuffle"` or `"other"`."""
    return _KINDS.get(type(dataset).__name__, "other")


def dataset_input(dataset):
    """The dataset a unary transformation reads, or None (a source, or several inputs)."""
    return getattr(dataset, "_input_dataset", None)


def dataset_inputs(dataset):
    """The datasets `dataset` reads (none for a source; two for `zip` or `concatenate`).

    `tf.data.Dataset._inputs()` is how TensorFlow's own graph rewrites walk a pipeline; there
    is no public way.
    """
    return list(dataset._inputs())


_PYTHON_OPS = {"EagerPyFunc", "PyFunc", "PyFuncStateless"}


def pipeline(dataset):
    """`dataset` and every dataset it reads, each once (see `dataset_inputs`)."""
    pending, seen = [dataset], set()
    while pending:
        current = pending.pop()
        if id(current) not in seen:
            seen.add(id(current))
            yield current
            pending.extend(dataset_inputs(current))


def dataset_function_graphs(dataset):
    """The GraphDefs of the functions of `dataset`'s own transformation (`map`'s function,
    `filter`'s predicate, ...), each with its function library.

    A transformation keeps its traced function in a private attribute (a
    `StructuredFunctionWrapper`, such as `_map_func`); found by its `function` attribute. Read
    from the function's graph, not the serialised pipeline, which would embed every tensor the
    pipeline captured (Keras's NumPy arrays).
    """
    for value in vars(dataset).values():
        function = getattr(value, "function", None)
        graph = getattr(function, "graph", None)
        if graph is not None and hasattr(graph, "as_graph_def"):
            yield graph.as_graph_def()


def runs_python(dataset):
    """Whether `dataset`'s pipeline calls Python (`tf.py_function`, `tf.numpy_function`,
    `Dataset.from_generator`), in any of its transformations' functions.

    Python runs only in the process that made the function: such a pipeline cannot run on
    another task.
    """
    return any(
        node.op in _PYTHON_OPS for current in pipeline(dataset) for node in function_nodes(current)
    )


def function_nodes(dataset):
    """Every node of `dataset`'s own transformation functions (`dataset_function_graphs`),
    those of the functions they call (a `tf.cond` branch, a nested map) included."""
    for graph_def in dataset_function_graphs(dataset):
        yield from graph_def.node
        for library_function in graph_def.library.function:
            yield from library_function.node_def


def dataset_seeds_unset(dataset):
    """Whether `dataset` is itself a random dataset (`shuffle`, `Dataset.random`) whose two
    seeds are 0: it draws fresh seeds each time it is made. Such datasets keep their seeds in
    the private `_seed` and `_seed2` (tensors), set from `tf.random` rules at construction."""
    found = [getattr(dataset, name, None) for name in ("_seed", "_seed2")]
    if any(value is None for value in found):
        return False
    values = [tf.get_static_value(value) for value in found]
    return all(value is not None and int(value) == 0 for value in values)


def draws_anew_each_iteration(dataset):
    """Whether `dataset` is a random dataset that draws anew each time it is iterated:
    `shuffle(..., reshuffle_each_iteration=True)` (the default) keeps it in the private
    `_reshuffle_each_iteration`, `Dataset.random(rerandomize_each_iteration=True)` in
    `_rerandomize`."""
    return bool(
        getattr(dataset, "_reshuffle_each_iteration", False)
        or getattr(dataset, "_rerandomize", False)
    )


def pipeline_graph(dataset):
    """`(GraphDef, element_spec)` of `dataset`'s pipeline, serialised as `replicate` serialises
    it to rebuild it on another device."""
    with _ops.colocate_with(dataset._variant_tensor):
        dataset = dataset._apply_debug_options()
        serialized = dataset._as_serialized_graph(
            strip_device_assignment=True, external_state_policy=ExternalStatePolicy.WARN
        )
    return tf.compat.v1.GraphDef.FromString(serialized.numpy()), dataset.element_spec


def dataset_from_graph(graph_def, device, element_spec):
    """The dataset of `graph_def` (from `pipeline_graph`), made on `device`."""
    return _RemoteDataset(graph_def.SerializeToString(), device, element_spec)


def op_inputs(op):
    """The names of op type `op`'s inputs, in order, each with its count attribute: a list of
    `(name, number_attr, type_list_attr)` from the op's registered definition (empty for an op
    TensorFlow does not know)."""
    op_def = op_def_registry.get(op)
    if op_def is None:
        return []
    return [(a.name, a.number_attr, a.type_list_attr) for a in op_def.input_arg]


def repeat_count(dataset):
    """The count of a `repeat` transformation (-1: endless), or None if not static."""
    count = tf.get_static_value(dataset._count)
    return None if count is None else int(count)


def batch_arguments(dataset):
    """`(batch size, drop_remainder)` of a `batch` transformation (size None if not static)."""
    size = tf.get_static_value(dataset._batch_size)
    return (None if size is None else int(size)), bool(tf.get_static_value(dataset._drop_remainder))


class MapStage:
    """A `map` transformation, to apply again to another input with the same function and
    parallelism (`apply`)."""

    def __init__(self, dataset):
        self._function = dataset._map_func._func  # what the user passed to `map`
        calls = getattr(dataset, "_num_parallel_calls", None)
        self._parallel = None if calls is None else int(tf.get_static_value(calls))
        deterministic = getattr(dataset, "_deterministic", "default")
        self._deterministic = {"true": True, "false": False}.get(deterministic)

    def apply(self, dataset):
        if self._parallel is None:
            return dataset.map(self._function)
        return dataset.map(
            self._function, num_parallel_calls=self._parallel, deterministic=self._deterministic
        )


# ---- Iterators on input hosts that feed only their own CPU (dpkeras/_input/plan.py) ----
# TensorFlow's distributed datasets make a `MultiDeviceIterator` per input host for every
# iterator (every epoch) unless the replication mode is PER_REPLICA without
# `experimental_fetch_to_device`: then `input_lib._SingleWorkerOwnedDatasetIterator` holds a
# plain iterator of the host's dataset and wraps its element in a list, one element per host
# (`_should_use_multi_device_iterator`, `_format_data_list_with_options`). Nothing public
# chooses the iterator. (Making every host's iterator in one function call, to make an epoch's
# iterator one dispatch, crashed the worker task in TF 2.21: a function returning iterator
# handles of several tasks.) tests/test_cluster_costs.py fails if these options no longer give
# plain iterators.


def plain_iterator_options(options):
    """`options` (a `tf.distribute.InputOptions`, or None) with which TensorFlow's distributed
    datasets give each input host a plain iterator of its dataset: valid only where each host
    feeds exactly one replica, the host's own device."""
    options = options if options is not None else tf.distribute.InputOptions()
    return options._replace(
        experimental_replication_mode=InputReplicationMode.PER_REPLICA,
        experimental_fetch_to_device=False,
        experimental_place_dataset_on_device=False,
    )


def host_iterator_kinds(distributed_iterator):
    """For each input host of a distributed iterator, `"plain"` or `"multi_device"`: which
    iterator it reads (its `_iterators`, each holding `_iterator`)."""
    return [
        "multi_device" if isinstance(host._iterator, OwnedMultiDeviceIterator) else "plain"
        for host in distributed_iterator._iterators
    ]


# ---- What `dpkeras._input.at_first_use` reuses of TensorFlow's distributed datasets ----
# Its distributed datasets derive from TensorFlow's classes (exported above) and make each input
# host's dataset and iterator as TensorFlow's own `__init__` and `__iter__` do; `input_lib` has
# no public way to make them. tests/test_iterators_at_first_use.py fails if these change.


def datasets_from_function(input_contexts, input_workers, dataset_fn):
    """Each input host's dataset from `dataset_fn`, as TensorFlow's
    `DistributedDatasetsFromFunction.__init__` makes them."""
    datasets, _ = _input_lib._create_datasets_from_function_with_input_context(
        input_contexts, input_workers, dataset_fn
    )
    return datasets


def iterators_per_host(per_host, input_workers, options, strategy):
    """Each input host's iterator of its dataset (`per_host`), as TensorFlow's distributed
    datasets' `__iter__` makes them (`_create_iterators_per_worker`), with the strategy's
    device canonicalisation (`_canonicalize_devices`, True when the strategy has none)."""
    canonicalize = getattr(strategy, "_canonicalize_devices", True)
    return _input_lib._create_iterators_per_worker(
        per_host, input_workers, options=options, canonicalize_devices=canonicalize
    )


def state_shared_by_iterators(dataset):
    """The transformations of `dataset`'s pipeline whose iterators draw from state the
    dataset keeps (their names), so that making an iterator changes what the next one yields:
    `shuffle` with `reshuffle_each_iteration` (the default) and `Dataset.random` with
    `rerandomize_each_iteration` (their seeds, `_seed`, come from a generator shared by the
    dataset's iterators). A pipeline whose inputs cannot be walked (`_inputs`) counts as
    sharing state."""
    found = []
    try:
        datasets = list(pipeline(dataset))
    except Exception:  # noqa: BLE001 - an unknown dataset class: assume the worst
        return ["(a pipeline that cannot be walked)"]
    for current in datasets:
        if not hasattr(current, "_seed"):
            continue
        if getattr(current, "_reshuffle_each_iteration", None) is False:
            continue
        if hasattr(current, "_rerandomize") and not current._rerandomize:
            continue
        found.append(type(current).__name__.lstrip("_"))
    return found


# ---- What `dpkeras._patches.step_loop` reads of TensorFlow's distributed iterators ----
# Its loop reads each input host's next batch on that host (TensorFlow's `get_next_as_optional`
# makes one `Optional` of every replica's batch on the calling device, which Keras's loop then
# carries through worker 0); `input_lib` has no public per-host read. tests/test_cluster_loop.py
# fails if these change.


def host_optionals(distributed_iterator):
    """Each input host's next batch, read on that host: per host, a list of one
    `tf.experimental.Optional` per device it feeds (`get_next_as_optional_list`)."""
    optionals = []
    for i, host in enumerate(distributed_iterator._input_workers.worker_devices):
        with tf.device(host):
            optionals.append(distributed_iterator._iterators[i].get_next_as_optional_list())
    return optionals


def per_replica_values(distributed_iterator, optionals):
    """The replicas' batches (a `PerReplica` structure) from `host_optionals`, each read on
    its device, as TensorFlow's iterator regroups them (`_create_per_replica`)."""
    values = _input_lib._get_value_or_dummy(
        distributed_iterator._input_workers, optionals, produce_dummy=False
    )
    return _input_lib._create_per_replica(values, distributed_iterator._strategy)


def reads_replicas_in_order(distributed_iterator):
    """Whether the iterator yields its hosts' replicas in order (no `_replica_order`)."""
    return getattr(distributed_iterator, "_replica_order", None) is None


def is_replica_device_setter(function):
    """Whether `function` is what TF1's `replica_device_setter` returned."""
    return isinstance(getattr(function, "__self__", None), _ReplicaDeviceChooser)


def device_scope():
    """The device the innermost `tf.device` in effect names, or "" when none does.

    Eagerly it is the context's device name; in a graph being traced (a `tf.function`), the
    newest entry of the graph's device stack (a device function there answers ""). No public
    API reads the device scope without creating an op.
    """
    if tf.executing_eagerly():
        return _context.context().device_name or ""
    for spec in _ops.get_default_graph()._device_function_stack.peek_objs():
        name = spec.raw_string  # a `_UserDeviceSpec`: the string given, None for a function
        return name if isinstance(name, str) else ""
    return ""


def called_from_tf1_get_variable():
    """Whether `tf.compat.v1.get_variable` is on this thread's call stack.

    A variable creator sees TF1's `get_variable` only as a V1 variable (its keyword arguments
    hold `collections`), like `tf.compat.v1.Variable`; which function called is known only from
    the stack (`sys._getframe`), by the code object of the public function itself.
    """
    code = tf.compat.v1.get_variable.__code__
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False
