"""The rendezvous driver service shared by every backend (launcher, Spark, Ray)."""

from hora.driver.client import EventStream, register
from hora.driver.service import DriverService
from hora.driver.topology import Assignment, Registration, assign_ranks

__all__ = ["Assignment", "DriverService", "EventStream", "Registration", "assign_ranks", "register"]
