"""The rendezvous driver service shared by every backend (launcher, Spark, Ray)."""

from hora.driver.client import EventStream, Joined, host_updates, join_round, register
from hora.driver.elastic import ElasticRounds, HostUpdateResult
from hora.driver.service import DriverService
from hora.driver.topology import Assignment, Registration, assign_ranks

__all__ = [
    "Assignment",
    "DriverService",
    "ElasticRounds",
    "EventStream",
    "HostUpdateResult",
    "Joined",
    "Registration",
    "assign_ranks",
    "host_updates",
    "join_round",
    "register",
]
