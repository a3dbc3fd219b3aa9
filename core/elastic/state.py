"""The state of an elastic training job: what is committed, restored after a failure and synced to new workers.

As in Horovod. ``state.commit()`` saves the state (a copy in memory) and
then checks whether the job's hosts changed; after a failure, the state goes
back to the last commit; after the job re-forms, rank 0's state is sent to
every rank (new workers included).

Host changes reach the job through rank 0: at each commit it asks the
driver service for the updates since the last it saw, and broadcasts what it
learnt, so every rank raises :class:`~hora.exceptions.HostsUpdatedInterrupt`
at the same commit (or none does).
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable, Iterable
from typing import Any

from hora import basics
from hora.driver.client import host_updates
from hora.driver.elastic import HostUpdateResult
from hora.exceptions import HostsUpdatedInterrupt, RendezvousError
from hora.objects import broadcast_object

__all__ = ["ObjectState", "State"]

_log = logging.getLogger("hora.elastic")

# Seconds rank 0 waits for the driver service's answer about host updates.
_ASK_TIMEOUT_SECONDS = 30.0


class State:
    """The state of a training job that :func:`hora.elastic.run` restores, re-forms and syncs.

    Subclasses say how to :meth:`save`, :meth:`restore` and :meth:`sync`
    their objects.

    Args:
        bcast_object: broadcasts a picklable object from rank 0.
        get_rank: this process's rank.
    """

    def __init__(
        self,
        bcast_object: Callable[[Any], Any] = broadcast_object,
        get_rank: Callable[[], int] = basics.rank,
    ) -> None:
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._host_messages: queue.Queue[tuple[int, HostUpdateResult]] = queue.Queue()
        self._last_updated_timestamp = _round_updates()
        self._reset_callbacks: list[Callable[[], None]] = []

    def register_reset_callbacks(self, callbacks: Iterable[Callable[[], None]]) -> None:
        """Adds functions called (in order) after every reset, before the state is synced.

        Use them to adjust what depends on the number of ranks (the learning
        rate, the data shards).
        """
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Called after the job re-formed: forgets host updates the new round reflects, then runs the callbacks."""
        self._host_messages = queue.Queue()
        self._last_updated_timestamp = _round_updates()
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp: int, update_res: HostUpdateResult) -> None:
        """Records a host update (Horovod's notification entry point); the next commit acts on it."""
        self._host_messages.put((timestamp, update_res))

    def commit(self) -> None:
        """Saves the state, then raises HostsUpdatedInterrupt (on every rank) if the job's hosts changed.

        Commit at a point every rank reaches together (end of a batch or an
        epoch): it communicates. Work done after the last commit is lost when
        a worker fails.
        """
        self.save()
        self.check_host_updates()

    def check_host_updates(self) -> None:
        """Raises HostsUpdatedInterrupt on every rank if hosts were added or removed since the last check.

        Rank 0 asks the job's driver service and broadcasts its answer, so
        every rank decides the same.
        """
        prev_timestamp = last_timestamp = self._last_updated_timestamp
        all_update = HostUpdateResult.no_update
        while not self._host_messages.empty():
            timestamp, update = self._host_messages.get()
            if timestamp > last_timestamp:
                last_timestamp = timestamp
                all_update |= update
        job = basics.current_job()
        settings = job.settings
        if settings.elastic and self._rank() == 0:
            assert settings.driver_address is not None and settings.secret is not None
            try:
                timestamp, update = host_updates(
                    settings.driver_address, settings.secret, prev_timestamp, timeout=_ASK_TIMEOUT_SECONDS
                )
            except RendezvousError as exc:  # the driver busy or briefly unreachable: ask again at the next commit
                _log.warning("Could not ask the driver for host updates (%s); asking again at the next commit.", exc)
            else:
                if timestamp > last_timestamp:
                    last_timestamp = timestamp
                all_update |= update
        if job.size > 1:
            prev_timestamp, last_timestamp, all_update = self._bcast_object(
                (prev_timestamp, last_timestamp, int(all_update))
            )
        self._last_updated_timestamp = last_timestamp
        if last_timestamp > prev_timestamp:
            raise HostsUpdatedInterrupt(HostUpdateResult(all_update) == HostUpdateResult.removed)

    def save(self) -> None:
        """Keeps a copy of the state: the point :meth:`restore` returns to."""
        raise NotImplementedError

    def restore(self) -> None:
        """Returns the state to the last :meth:`save`."""
        raise NotImplementedError

    def sync(self) -> None:
        """Makes every rank's state rank 0's."""
        raise NotImplementedError

    def reset(self) -> None:
        """Adjusts the state to the re-formed job (before it is synced); nothing by default."""


class ObjectState(State):
    """State made of picklable attributes, synced with ``broadcast_object``.

    ``ObjectState(epoch=0, batch=0)`` has attributes ``epoch`` and ``batch``;
    :meth:`save` copies their current values, :meth:`restore` sets them back,
    :meth:`sync` sets rank 0's saved values everywhere.

    Args:
        bcast_object: broadcasts a picklable object from rank 0.
        get_rank: this process's rank.
        **kwargs: the attributes and their first values.
    """

    def __init__(
        self,
        bcast_object: Callable[[Any], Any] = broadcast_object,
        get_rank: Callable[[], int] = basics.rank,
        **kwargs: Any,
    ) -> None:
        self._saved_state = kwargs
        self._set_attrs()
        super().__init__(bcast_object=bcast_object, get_rank=get_rank)

    def save(self) -> None:
        self._saved_state = {attr: getattr(self, attr) for attr in self._saved_state}

    def restore(self) -> None:
        self._set_attrs()

    def sync(self) -> None:
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state)
            self._set_attrs()

    def _set_attrs(self) -> None:
        for attr, value in self._saved_state.items():
            setattr(self, attr, value)


def _round_updates() -> int:
    """The latest host update the job's current rendezvous round reflects (0 outside an elastic job)."""
    job = basics._job
    return job.host_updates if job is not None else 0
