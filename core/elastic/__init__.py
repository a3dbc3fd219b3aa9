"""Elastic training: a job that keeps training when workers die and grows when hosts are added.

Written once for every framework, as Horovod's ``hvd.elastic``::

    import hora.torch as hvd

    hvd.init()
    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            ...
            state.commit()

    train(state)

Start it with ``horarun --min-np 1 --max-np 4 --host-discovery-script ./hosts.sh python train.py``.
"""

from hora.driver.elastic import HostUpdateResult
from hora.elastic.retry import lost_peer, run, run_fn
from hora.elastic.state import ObjectState, State
from hora.exceptions import HostsUpdatedInterrupt

__all__ = ["HostUpdateResult", "HostsUpdatedInterrupt", "ObjectState", "State", "lost_peer", "run", "run_fn"]
