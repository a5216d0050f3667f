"""dpkeras: data-parallel Keras 3 training with variables on a parameter device.

```python
import dpkeras
with dpkeras.scope():
    model = build_model()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
model.fit(x, y, batch_size=256)
```

The public API is the names below (`__all__`) and five public modules: `dpkeras.placement`
(where variables live), `dpkeras.tf1` (TF1's variable scopes, re-exported here too),
`dpkeras.cluster` (ps/worker clusters), `dpkeras.layers` (`DynamicEmbedding`) and
`dpkeras.testing` (simulated devices, a local cluster). Everything else is private: its
names start with an underscore.

The package, floor by floor from the top. A module imports only from its own room (its
subpackage, or itself) and from the floors below; the last floor imports nothing of dpkeras.
Each line is a floor, its rooms separated by semicolons; tests/test_package_map.py holds every
`import dpkeras...` of every module to it.

- `__main__`: `python -m dpkeras`;
- `_cli/`: the `dpkeras` command, one module a verb (`env`, `serve`, `bench`, `launch`);
  `testing/`: simulated devices and a local cluster, for tests of programs that use dpkeras;
- `__init__`: this module: the public names, each imported from its room when first used;
- `_strategy/`: `ParameterDeviceStrategy`, `dpkeras.scope()`, the placement report; `tf1/`:
  TF1's `variable_scope`, `get_variable` and slim's variables on Keras 3 (a layer built under
  `reuse` holds the first layer's variable through `_patches/`); `_transfers`: counting what
  a step sends (it runs Keras's steps as `_extended/` makes them); `layers`: the public
  `DynamicEmbedding`;
- `_patches/`: every change dpkeras makes to Keras, TensorFlow and keras-rs, one table of
  entries (crash-safe saving, exact resume, the symbolic build, naming failed tasks and going
  on without or after a lost one, the on-cluster loop, whole batches on CPU replicas, the
  optimizer summing first, keras-rs's SparseCore tables refused, the `tf.gather` dispatcher,
  refusing a model compiled or trained outside its strategy), checked and reversible
  (`uninstall()`);
- `_extended/`: the strategy's extended class and the parts it delegates to (devices, the
  variable creator, reductions, the all-reduce, the optimizer on the sum, Keras steps);
  `_dynamic/`: `DynamicEmbedding`'s hash index, admission and eviction, new rows' initial
  values and optimizer slots;
- `_input/`: feeding the replicas (which input host feeds which replicas, each host's
  pipeline on a cluster, the same seeds on every host, the split of a global batch into the
  replicas' shares, a batch's rows, the hosts' iterators made at first use);
- `_variables/`: the kinds of variable (`ParameterVariable`, `ShardedParameterVariable` and
  `ReplicatedVariable`), each answering for itself how it is read, written, updated and
  summed, one piece at a time; lookups (each distinct id once), partitioning; `cluster/`: a
  cluster's tasks, `TF_CONFIG` roles, joining (`join`) and connecting, devices, health, the
  client's record on each task, the on-cluster loop;
- `_quiet`: TensorFlow's log noise kept out of the commands' output;
- `_config`: every setting, resolved once (arguments, then `DPKERAS_*`, then defaults);
- `placement`: placement policies, which parameter device holds each variable;
- `_tf_internals`: every private TensorFlow use, with its reason; `_keras_internals`: every
  Keras internal, with its reason; `_cache`: the graph-keyed cache; `_lazy`: a package's
  names imported when first used; `_serializable`: the classes dpkeras registers with
  Keras's serialization, registered by `import dpkeras` alone, before Keras is imported;
  `_device_names`: one canonical spelling of a device; `_sizes`: sizes in bytes;
  `_compat_scopes`: TensorFlow's `tf.compat.v1.variable_scope` around dpkeras's variables,
  refused by name; `_carried`: the thread-local state a replica thread takes from the thread
  that runs the step; `_version`: the version.
"""

import typing

from dpkeras import _quiet, _serializable
from dpkeras._lazy import exports
from dpkeras._version import __version__

# The classes of dpkeras's files (`dpkeras>DynamicEmbedding`), registered with Keras now or when
# Keras is imported, so that `import dpkeras` is enough for `keras.models.load_model`.
_serializable.register()

# Each public name and the module that holds it, imported when first used (`dpkeras._lazy`).
_EXPORTS = {
    "cluster": "dpkeras.cluster",
    "layers": "dpkeras.layers",
    "placement": "dpkeras.placement",
    "testing": "dpkeras.testing",
    "tf1": "dpkeras.tf1",
    "Deduplicate": "dpkeras._config",
    "simulate_cpu_devices": "dpkeras._extended.devices",
    "uninstall": "dpkeras._patches.table",
    "PlacementReport": "dpkeras._strategy.report",
    "placement_report": "dpkeras._strategy.report",
    "get_strategy": "dpkeras._strategy.scope",
    "scope": "dpkeras._strategy.scope",
    "ParameterDeviceStrategy": "dpkeras._strategy.strategy",
    "TransferReport": "dpkeras._transfers",
    "record_transfers": "dpkeras._transfers",
    "train_step_transfers": "dpkeras._transfers",
    "ParameterVariable": "dpkeras._variables.variables",
    "ReplicatedVariable": "dpkeras._variables.replicated",
    "TaskFailedError": "dpkeras.cluster",
    **dict.fromkeys(
        (
            "AUTO_REUSE",
            "LocalVariable",
            "VariableScope",
            "VariableStore",
            "add_model_variable",
            "get_local_variables",
            "get_model_variables",
            "get_variable",
            "get_variable_scope",
            "get_variable_store",
            "get_variables",
            "local_variable",
            "model_variable",
            "regularization_losses",
            "variable",
            "variable_scope",
        ),
        "dpkeras.tf1",
    ),
}
__getattr__, __dir__ = exports(__name__, _EXPORTS)
_quiet.quiet_own_logger()  # dpkeras's INFO records stay hidden under absl's app.run

if typing.TYPE_CHECKING:  # what the names are, for readers and tools
    from dpkeras import layers, placement
    from dpkeras._config import Deduplicate
    from dpkeras._extended.devices import simulate_cpu_devices
    from dpkeras._patches.table import uninstall
    from dpkeras._strategy.report import PlacementReport, placement_report
    from dpkeras._strategy.scope import get_strategy, scope
    from dpkeras._strategy.strategy import ParameterDeviceStrategy
    from dpkeras._transfers import TransferReport, record_transfers, train_step_transfers
    from dpkeras._variables.replicated import ReplicatedVariable
    from dpkeras._variables.variables import ParameterVariable
    from dpkeras.cluster import TaskFailedError
    from dpkeras.tf1 import (
        AUTO_REUSE,
        LocalVariable,
        VariableScope,
        VariableStore,
        add_model_variable,
        get_local_variables,
        get_model_variables,
        get_variable,
        get_variable_scope,
        get_variable_store,
        get_variables,
        local_variable,
        model_variable,
        regularization_losses,
        variable,
        variable_scope,
    )

__all__ = [
    # The strategy and its scope.
    "ParameterDeviceStrategy",
    "ParameterVariable",
    "ReplicatedVariable",
    "get_strategy",
    "scope",
    "Deduplicate",
    "simulate_cpu_devices",
    "TaskFailedError",
    "uninstall",
    # Where variables live, and what a step sends.
    "placement",
    "layers",
    "placement_report",
    "PlacementReport",
    "TransferReport",
    "record_transfers",
    "train_step_transfers",
    # TF1's variable_scope / get_variable and slim's variables, for Keras 3.
    "AUTO_REUSE",
    "VariableScope",
    "VariableStore",
    "get_variable",
    "get_variable_scope",
    "get_variable_store",
    "variable_scope",
    "LocalVariable",
    "add_model_variable",
    "get_local_variables",
    "get_model_variables",
    "get_variables",
    "local_variable",
    "model_variable",
    "regularization_losses",
    "variable",
    "__version__",
]
