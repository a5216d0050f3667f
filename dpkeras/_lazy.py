"""A package's public names imported when first used (PEP 562's module `__getattr__`).

`import dpkeras` and the `dpkeras` command then import no TensorFlow until a name that needs
it is used: `dpkeras --help` answers at once, and a command quiets TensorFlow's start-up lines
before TensorFlow is imported (`dpkeras._quiet`).
"""

import importlib
import sys


def exports(package, table):
    """`(__getattr__, __dir__)` for `package`, whose public names are `table`'s keys.

    Args:
        package: the package's name (`__name__`).
        table: `{name: module}`: the module that holds `name`, or, when the module is
            `package.name`, the module itself.
    """

    def __getattr__(name):
        module = table.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        imported = importlib.import_module(module)
        value = imported if module == f"{package}.{name}" else getattr(imported, name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__():
        return sorted(set(table) | set(vars(sys.modules[package])))

    return __getattr__, __dir__
