"""The strategy users see: `ParameterDeviceStrategy`, `dpkeras.scope()`, the placement report.

- `strategy`: `ParameterDeviceStrategy`, the `tf.distribute.Strategy`;
- `scope`: `dpkeras.scope()` and `get_strategy`, one cached strategy per configuration;
- `report`: `placement_report`, where each variable of a model lives.
"""
