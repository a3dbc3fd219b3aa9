"""A fit in MLflow: the estimator's Params, rank 0's per-epoch metrics and the fitted model, in one run.

``mlflow=None`` (the default) logs when MLflow is installed and a run is
active, into a run of the fit's own nested in it; ``True`` also starts a
run when none is (and ends it after the fit) and fails when MLflow is
missing; ``False`` never logs. Logging never costs a finished fit: a
failure to log the model is a warning. The metrics reach
the run epoch by epoch while training goes on (see
:func:`hora.spark.log_metrics`); the model is logged with the framework's
MLflow flavor (``mlflow.pytorch``, ``mlflow.keras``) under ``model``.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hora.exceptions import HoraError

__all__ = ["log_params", "mlflow_run", "model_signature"]

_MAX_PARAM = 500  # characters of a Param's logged value (MLflow takes up to 6000)


@contextmanager
def mlflow_run(mode: bool | None) -> Iterator[Any | None]:
    """The MLflow run a fit logs to, or None; see the module's docstring for ``mode``."""
    if mode is False:
        yield None
        return
    try:
        import mlflow
    except ImportError:
        if mode:
            raise HoraError("mlflow=True, but MLflow is not installed: pip install 'hora[mlflow]'.") from None
        yield None
        return
    if mlflow.active_run() is None and not mode:
        yield None
        return
    # Under an active run, each fit is a run of its own inside it (a Pipeline, a CrossValidator, a second fit
    # in one notebook run log their own Params); without one, mlflow=True starts a run for the fit.
    with mlflow.start_run(nested=mlflow.active_run() is not None) as started:
        yield started


def _logged(value: Any) -> str | None:
    """A Param's value as MLflow shows it: strings as they are, other plain values as JSON, objects by their name
    (functions, classes) or as they show themselves."""
    if value is None:
        return None
    if isinstance(value, str):
        return value[:_MAX_PARAM]
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        if isinstance(value, (list, tuple)):
            text = json.dumps([_logged(v) for v in value])
        else:  # a function or class by its name, another object as it shows itself
            text = getattr(value, "__name__", None) or repr(value)
    return text[:_MAX_PARAM]


def log_params(params: dict[str, Any]) -> None:
    """Logs every set Param (by its camelCase name) to the active MLflow run."""
    import mlflow

    logged = {name: _logged(value) for name, value in params.items()}
    try:
        mlflow.log_params({name: text for name, text in logged.items() if text is not None})
    except mlflow.exceptions.MlflowException as exc:  # e.g. autologging logged these names differently
        warnings.warn(f"hora.estimators: could not log the Params to MLflow: {exc}", stacklevel=2)


def model_signature(model: Any, df: Any) -> Any:
    """The MLflow signature of ``model`` (a fitted Hora model) from one row of ``df``; None for several inputs or
    outputs, or an empty ``df``."""
    from hora.estimators.prediction import input_example
    from mlflow.models import infer_signature

    predictor = model._predictor()
    example = input_example(model, df, predictor.float_dtype)
    if example is None or len(example) != 1:
        return None
    outputs = predictor.load()(example)
    return infer_signature(example[0], outputs[0]) if len(outputs) == 1 else None
