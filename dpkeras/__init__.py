"""dpkeras: data-parallel Keras 3 training with variables on a parameter device.

```python
import dpkeras
with dpkeras.scope():
    model = build_model()
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
model.fit(x, y, batch_size=256)
```
"""

from dpkeras import lookups as _lookups  # noqa: F401  (registers the tf.gather dispatcher)
from dpkeras.devices import simulate_cpu_devices
from dpkeras.strategy import ParameterDeviceStrategy
from dpkeras.strategy_scope import get_strategy, scope
from dpkeras.transfers import TransferReport, record_transfers, train_step_transfers
from dpkeras.variables import ParameterVariable

__version__ = "0.1.0"

__all__ = [
    "ParameterDeviceStrategy",
    "ParameterVariable",
    "TransferReport",
    "__version__",
    "get_strategy",
    "record_transfers",
    "scope",
    "simulate_cpu_devices",
    "train_step_transfers",
]
