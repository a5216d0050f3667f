"""Keras layers dpkeras adds: `DynamicEmbedding`, an embedding without a fixed vocabulary.

It works with or without a dpkeras strategy; files that hold it load where `dpkeras` is
importable (Keras finds the class by its registered name, `dpkeras>DynamicEmbedding`).
"""

from dpkeras._dynamic.layer import DynamicEmbedding

__all__ = ["DynamicEmbedding"]
