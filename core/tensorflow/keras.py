"""``import hora.tensorflow.keras as hvd``: Horovod's module name for :mod:`hora.keras`."""

from hora.keras import *  # noqa: F403 - this module is hora.keras under Horovod's name
from hora.keras import __all__, load_model  # noqa: F401
