"""The ``horarun`` launcher: starts a job's workers as processes, locally or over ssh."""

from hora.runner.config import LaunchConfig, config_from_args
from hora.runner.launch import launch

__all__ = ["LaunchConfig", "config_from_args", "launch"]
