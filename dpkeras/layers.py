"""Keras layers dpkeras adds: `DynamicEmbedding`, an embedding without a fixed vocabulary.

It works with or without a dpkeras strategy; files that hold it load after `import dpkeras`
(Keras finds the class by its registered name, `dpkeras>DynamicEmbedding`, which `import
dpkeras` registers without importing this module: `dpkeras._serializable`).
"""

from dpkeras._dynamic.layer import DynamicEmbedding

__all__ = ["DynamicEmbedding"]
