"""``import hora.tensorflow.keras as hvd``: Horovod's module name for :mod:`hora.keras`.

Its submodules are Horovod's too: ``hora.tensorflow.keras.callbacks`` is :mod:`hora.keras.callbacks`
and ``hora.tensorflow.keras.elastic`` is :mod:`hora.keras.elastic`, so
``from horovod.tensorflow.keras.callbacks import ...`` needs only its package name changed.
"""

import sys

from hora.keras import *  # noqa: F403 - this module is hora.keras under Horovod's name
from hora.keras import __all__, callbacks, elastic, load_model  # noqa: F401

# Registered under Horovod's names: the import system finds them there, after importing this module.
sys.modules[f"{__name__}.callbacks"] = callbacks
sys.modules[f"{__name__}.elastic"] = elastic
