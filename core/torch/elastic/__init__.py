"""Elastic training with PyTorch (``hvd.elastic`` of ``import hora.torch as hvd``), as Horovod's.

:class:`TorchState` commits, restores and syncs a model, its optimizer, an
:class:`ElasticSampler` and any other attributes; :func:`run` re-forms the job
after a failure or a host change (see :mod:`hora.elastic`).
"""

from hora.elastic import HostsUpdatedInterrupt, ObjectState, State, run, run_fn
from hora.torch.elastic.sampler import ElasticSampler
from hora.torch.elastic.state import TorchState

__all__ = ["ElasticSampler", "HostsUpdatedInterrupt", "ObjectState", "State", "TorchState", "run", "run_fn"]
