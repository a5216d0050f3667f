"""`placement_report`: where every variable lives, of which kind, and how much each device holds.

```python
report = dpkeras.placement_report(model)      # or a ParameterDeviceStrategy
report.print()                                # a table like model.summary()
report.totals                                 # {"/cpu:0": (variables, bytes), ...}
```
"""

import dataclasses

import keras
import tensorflow as tf

from dpkeras import _sizes as sizes
from dpkeras._device_names import short_device
from dpkeras._strategy.strategy import ParameterDeviceStrategy
from dpkeras._variables import placed


@dataclasses.dataclass(frozen=True)
class PlacementRow:
    """One variable: its Keras path, kind, shape, dtype, size in bytes and device (short).

    A replicated variable (`placement.REPLICATED`) has device `"replicated"` and the devices
    of its copies in `copies` (short names, in replica order); it counts in the totals of
    every one of them.
    """

    path: str
    kind: str
    shape: tuple
    dtype: str
    bytes: int
    device: str
    copies: tuple = ()


@dataclasses.dataclass(frozen=True)
class PlacementReport:
    """Rows in creation (or model) order, and `(variables, bytes)` per device."""

    rows: tuple
    title: str

    @property
    def totals(self):
        totals = {}
        for row in self.rows:
            for device in row.copies or (row.device,):
                n, b = totals.get(device, (0, 0))
                totals[device] = (n + 1, b + row.bytes)
        return dict(sorted(totals.items()))

    def __str__(self):
        headers = ("Variable", "Kind", "Shape", "Dtype", "Bytes", "Device")
        cells = [
            (r.path, r.kind, str(r.shape), r.dtype, f"{r.bytes:,}", r.device) for r in self.rows
        ]
        widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(headers)]

        def line(left, fill, mid, right):
            return left + mid.join(fill * (w + 2) for w in widths) + right

        def row(values):
            return "│" + "│".join(f" {v:<{w}} " for v, w in zip(values, widths)) + "│"

        out = [
            self.title,
            line("┏", "━", "┳", "┓"),
            "┃" + "┃".join(f" {h:<{w}} " for h, w in zip(headers, widths)) + "┃",
            line("┡", "━", "╇", "┩"),
        ]
        out += [row(c) for c in cells]
        out.append(line("└", "─", "┴", "┘"))
        for device, (n, b) in self.totals.items():
            out.append(f" {device}: {n} variables, {sizes.human_bytes(b)}")
        return "\n".join(out)

    def print(self, print_fn=print):
        """Prints the table (through `print_fn`, like `model.summary`)."""
        print_fn(str(self))


def _row(variable, path=None):
    value = variable.value if isinstance(variable, keras.Variable) else variable
    ours = placed.of(value)
    kind = "-" if ours is None else ours.kind
    shape = tuple(value.shape.as_list())
    dtype = tf.as_dtype(value.dtype)
    size = sizes.nbytes(value.shape, dtype)
    copies = () if ours is None else tuple(short_device(d) for d in ours.copy_devices)
    if copies:
        device = "replicated"
    else:
        device = short_device(value.device) if value.device else "-"
    return PlacementRow(
        path or getattr(variable, "path", None) or value.name.split(":")[0],
        kind,
        shape,
        dtype.name,
        size,
        device,
        copies,
    )


def _rows(variable):
    """One row, or one per shard (path `<path>/part_<i>`) for a sharded variable."""
    value = variable.value if isinstance(variable, keras.Variable) else variable
    ours = placed.of(value)
    if ours is None or ours.parts == (ours,):
        return [_row(variable)]
    path = getattr(variable, "path", None) or value.name.split(":")[0]
    return [_row(part, f"{path}/part_{i}") for i, part in enumerate(ours.parts)]


def _model_variables(model):
    seen, out = set(), []
    groups = [model.variables]
    if getattr(model, "optimizer", None) is not None:
        groups.append(model.optimizer.variables)
    groups += [m.variables for m in getattr(model, "metrics", [])]
    for group in groups:
        for v in group:
            key = id(v.value if isinstance(v, keras.Variable) else v)
            if key not in seen:
                seen.add(key)
                out.append(v)
    return out


def placement_report(model_or_strategy):
    """Where every variable of a Keras model, or of a strategy, lives.

    For a model: its weights, its optimizer's variables (slots appear once the optimizer is
    built, i.e. after the first training step or `optimizer.build`) and its metrics' state.
    A sharded variable has one row per shard (`<path>/part_<i>`).
    For a `ParameterDeviceStrategy`: every live variable created under it, in creation order.

    Args:
        model_or_strategy: a `keras.Model` or a `dpkeras.ParameterDeviceStrategy`.

    Returns:
        A `PlacementReport`; `print(report)` shows a table like `model.summary()`.

    Raises:
        TypeError: for anything else.
    """
    if isinstance(model_or_strategy, ParameterDeviceStrategy):
        rows = tuple(_row(v, v.spec.path) for v in model_or_strategy.extended.variables())
        return PlacementReport(rows, f"Placement: {model_or_strategy!r}")
    if isinstance(model_or_strategy, keras.Model):
        rows = tuple(row for v in _model_variables(model_or_strategy) for row in _rows(v))
        return PlacementReport(rows, f'Placement: model "{model_or_strategy.name}"')
    raise TypeError(
        f"placement_report() takes a keras.Model or a dpkeras.ParameterDeviceStrategy. "
        f"Received: {model_or_strategy!r} (of type {type(model_or_strategy).__name__})"
    )
