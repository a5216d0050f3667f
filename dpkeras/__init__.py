"""dpkeras: data-parallel Keras 3 training with variables on a parameter device.

```python
import dpkeras
with dpkeras.scope():
    model = build_model()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
model.fit(x, y, batch_size=256)
```
"""

from dpkeras import placement
from dpkeras.devices import simulate_cpu_devices
from dpkeras.report import PlacementReport, placement_report
from dpkeras.strategy import ParameterDeviceStrategy
from dpkeras.strategy_scope import get_strategy, scope
from dpkeras.tf1 import (
    AUTO_REUSE,
    LocalVariable,
    VariableScope,
    VariableStore,
    add_model_variable,
    get_local_variables,
    get_model_variables,
    get_variable,
    get_variable_store,
    get_variables,
    local_variable,
    model_variable,
    regularization_losses,
    variable,
    variable_scope,
)
from dpkeras.transfers import TransferReport, record_transfers, train_step_transfers
from dpkeras.variables import ParameterVariable

__version__ = "0.1.0"

__all__ = [
    # The strategy and its scope.
    "ParameterDeviceStrategy",
    "ParameterVariable",
    "get_strategy",
    "scope",
    "simulate_cpu_devices",
    # Where variables live, and what a step sends.
    "placement",
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
