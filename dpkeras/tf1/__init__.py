"""TF1's name-keyed variables on Keras 3: `variable_scope`, `get_variable` and slim's variables.

One module per concept, each using the others through their public names only:

- `_store`: the `VariableStore` and its entries, by full path.
- `_errors`: argument validation and the error messages, defined once.
- `_state`: this thread's scopes and the store that applies where code runs.
- `_sharing`: the creator that names, creates and shares Keras layers' weights in a scope.
- `_scopes`: `variable_scope`, `VariableScope` and `get_variable_scope` (the root scope).
- `_get_variable`: `get_variable`, and creating each kind of variable by name.
- `_collections`: slim's `variable`, `model_variable`, `local_variable` and the lists of them.

Every public name is also `dpkeras.<name>`.
"""

from dpkeras.tf1._collections import (
    LocalVariable,
    add_model_variable,
    get_local_variables,
    get_model_variables,
    get_variables,
    local_variable,
    model_variable,
    regularization_losses,
    variable,
)
from dpkeras.tf1._get_variable import get_variable
from dpkeras.tf1._scopes import VariableScope, get_variable_scope, variable_scope
from dpkeras.tf1._state import get_variable_store
from dpkeras.tf1._store import AUTO_REUSE, VariableStore

__all__ = [
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
]
