"""A `fit` under dpkeras shows no warning that dpkeras itself causes.

TensorFlow logs deprecations through its logger (`tf.get_logger()`), and Python warnings go
through `warnings`; both are captured while a model is built and trained, and any that comes
from a dpkeras source file, or names one of TensorFlow's deprecated calls dpkeras once made
(`colocate_with`), fails the test.
"""

import logging
import warnings

import keras
import numpy as np

from dpkeras.testing import cpu_strategy


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


def test_fit_under_dpkeras_warns_about_nothing_of_dpkeras():
    logger = logging.getLogger("tensorflow")
    handler, level = _Records(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with cpu_strategy(3).scope():
                model = keras.Sequential(
                    [
                        keras.Input((6,)),
                        keras.layers.Dense(8),
                        keras.layers.BatchNormalization(),
                        keras.layers.Dense(2),
                    ]
                )
                model.compile(optimizer="adam", loss="mse", metrics=["mae"])
            x, y = np.ones((30, 6), "float32"), np.ones((30, 2), "float32")
            model.fit(x, y, batch_size=10, epochs=2, verbose=0)
            model.evaluate(x, y, verbose=0)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    ours = [str(w.message) for w in caught if "/dpkeras/" in w.filename.replace("\\", "/")]
    deprecations = [r.getMessage() for r in handler.records if "deprecat" in r.getMessage().lower()]
    assert ours == []
    assert not [m for m in deprecations if "colocate" in m.lower() or "dpkeras" in m], deprecations
