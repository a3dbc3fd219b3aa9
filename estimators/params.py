"""The Params of Hora's estimators and models, each declared once in a ``Has*`` mixin (pyspark.ml's way).

Every Param is camelCase with a type converter. Estimators and models mix
in what they use, so ``featureCols`` is the same Param on
``TorchEstimator`` and ``TorchModel``. Horovod's snake_case spellings
(``feature_cols=``) are accepted by the constructors through
:func:`camel_case_kwargs`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from pyspark.ml.param import Param, Params, TypeConverters

__all__ = ["EstimatorParams", "HasCustomObjects", "ModelParams", "camel_case_kwargs", "with_accessors"]


def _int_at_least(minimum: int) -> Any:
    """A type converter to an integer that is at least ``minimum``."""

    def convert(value: Any) -> int:
        converted = TypeConverters.toInt(value)
        if converted < minimum:
            raise TypeError(f"expected an integer >= {minimum}, got {value!r}")
        return converted

    return convert


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def _optional_positive_int(value: Any) -> int | None:
    return None if value is None else _positive_int(value)


def _optional_bool(value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise TypeError(f"expected True, False or None, got {value!r}")


def _validation(value: Any) -> float | str:
    """A fraction in [0, 1) or the name of a column that marks validation rows."""
    if isinstance(value, bool):
        raise TypeError(f"validation must be a fraction in [0, 1) or a column name, got {value!r}")
    if isinstance(value, str):
        return value
    fraction = TypeConverters.toFloat(value)
    if not 0.0 <= fraction < 1.0:
        raise TypeError(f"validation must be a fraction in [0, 1) or a column name, got {value!r}")
    return fraction


def _list_of_lists(value: Any) -> list[list[int]] | None:
    if value is None:
        return None
    return [TypeConverters.toListInt(shape) for shape in TypeConverters.toList(value)]


def _list(value: Any) -> list[Any]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        return [value]
    return list(value)


def _param(name: str, doc: str, converter: Any = TypeConverters.identity) -> Param:
    return Param(Params._dummy(), name, doc, typeConverter=converter)


class HasModel(Params):
    model = _param("model", "the model to train (or trained): a torch.nn.Module, or a built keras.Model")

    def getModel(self) -> Any:
        """The value of Param ``model``."""
        return self.getOrDefault(self.model)


class HasFeatureCols(Params):
    featureCols = _param("featureCols", "the feature columns, one model input each", TypeConverters.toListString)

    def getFeatureCols(self) -> list[str]:
        """The value of Param ``featureCols``."""
        return self.getOrDefault(self.featureCols)


class HasLabelCols(Params):
    labelCols = _param("labelCols", "the label columns, one model output each", TypeConverters.toListString)

    def getLabelCols(self) -> list[str]:
        """The value of Param ``labelCols``."""
        return self.getOrDefault(self.labelCols)


class HasInputShapes(Params):
    inputShapes = _param(
        "inputShapes", "the shape of each feature input, -1 for the batch (e.g. [[-1, 1, 8, 8]])", _list_of_lists
    )

    def getInputShapes(self) -> list[list[int]] | None:
        """The value of Param ``inputShapes``, or None when it is not set."""
        return self.getOrDefault(self.inputShapes)


class HasOutputCols(Params):
    outputCols = _param("outputCols", "the prediction columns, one per label", TypeConverters.toListString)

    def getOutputCols(self) -> list[str]:
        """The value of Param ``outputCols``; by default ``<label>__output`` for every label column."""
        if self.isDefined(self.outputCols):
            return self.getOrDefault(self.outputCols)
        return [f"{label}__output" for label in self.getOrDefault("labelCols")]


class HasBatchSize(Params):
    batchSize = _param("batchSize", "rows per training batch and rank", _positive_int)
    valBatchSize = _param("valBatchSize", "rows per validation batch and rank (default: batchSize)",
                          _optional_positive_int)  # fmt: skip


class HasTraining(Params):
    """What and how long to train."""

    numProc = _param("numProc", "the number of ranks (default: every Spark task slot)", _optional_positive_int)
    optimizer = _param("optimizer", "a torch.optim optimizer over the model's parameters, or a Keras optimizer")
    loss = _param("loss", "a loss function (output, label) -> tensor, or one per label (Keras: also loss names)")
    lossWeights = _param("lossWeights", "the weight of each label's loss", TypeConverters.toListFloat)
    metrics = _param("metrics", "metrics (output, label) -> tensor, or names (torch: 'accuracy', 'mse', 'mae')", _list)
    sampleWeightCol = _param("sampleWeightCol", "a column of per-row loss weights", TypeConverters.toString)
    validation = _param("validation", "a fraction of rows, or a column that is true for validation rows", _validation)
    epochs = _param("epochs", "passes over the training data", _positive_int)
    trainStepsPerEpoch = _param("trainStepsPerEpoch", "batches per epoch (default: one pass)", _optional_positive_int)
    validationStepsPerEpoch = _param(
        "validationStepsPerEpoch", "validation batches per epoch (default: one pass)", _optional_positive_int
    )
    shuffleBufferSize = _param("shuffleBufferSize", "rows in each rank's shuffle buffer; 0: no shuffling",
                               _non_negative_int)  # fmt: skip
    randomSeed = _param("randomSeed", "seed of the validation split, shuffling and model initialisation",
                        TypeConverters.toInt)  # fmt: skip
    store = _param("store", "a hora.spark.Store (or a path/URL for one) for data, checkpoints and logs")
    runId = _param("runId", "the run's name in the store; fitting again with it resumes", TypeConverters.toString)
    callbacks = _param(
        "callbacks", "Keras callbacks (every rank), or objects whose on_epoch_end(epoch, metrics) runs on rank 0", _list
    )
    gradientCompression = _param("gradientCompression", "hora.compression.Compression.fp16 or .none")
    backwardPassesPerStep = _param("backwardPassesPerStep", "batches accumulated per optimizer step", _positive_int)
    transformationFn = _param("transformationFn", "a function applied to each batch (a dict of numpy arrays)")
    verbose = _param("verbose", "0: quiet; 1: a line per epoch; 2: also progress within epochs", TypeConverters.toInt)
    mlflow = _param("mlflow", "log to MLflow: None when a run is active, True (starting one if none is), False never",
                    _optional_bool)  # fmt: skip


class HasCustomObjects(Params):
    customObjects = _param("customObjects", "Keras custom objects (name -> class or function) to load the model with")

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(customObjects={})

    def getCustomObjects(self) -> dict[str, Any]:
        """The value of Param ``customObjects``."""
        return self.getOrDefault(self.customObjects)


class EstimatorParams(HasModel, HasFeatureCols, HasLabelCols, HasInputShapes, HasOutputCols, HasBatchSize,
                      HasTraining):  # fmt: skip
    """Every Param of a Hora estimator."""

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(
            numProc=None, loss=None, optimizer=None, lossWeights=None, metrics=[], sampleWeightCol=None,
            validation=0.0, batchSize=32, valBatchSize=None, epochs=1, trainStepsPerEpoch=None,
            validationStepsPerEpoch=None, shuffleBufferSize=4096, randomSeed=0, store=None, runId=None, callbacks=[],
            gradientCompression=None, backwardPassesPerStep=1, transformationFn=None, verbose=1, inputShapes=None,
            mlflow=None,
        )  # fmt: skip


class ModelParams(HasModel, HasFeatureCols, HasLabelCols, HasInputShapes, HasOutputCols, HasBatchSize):
    """Every Param of a Hora model."""

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(batchSize=256, inputShapes=None)


def camel_case_kwargs(kwargs: dict[str, Any], owner: Params) -> dict[str, Any]:
    """``kwargs`` with Horovod's snake_case names turned into Params' camelCase; unknown names raise TypeError."""
    converted = {}
    for name, value in kwargs.items():
        camel = re.sub(r"_([a-z])", lambda m: m.group(1).upper(), name)
        if not owner.hasParam(camel):
            known = sorted(p.name for p in owner.params)
            raise TypeError(f"{type(owner).__name__} has no parameter {name!r}; its parameters are {known}.")
        converted[camel] = value
    return converted


def with_accessors(cls: type) -> type:
    """Adds ``getX()``/``setX(value)`` for every Param ``x`` of ``cls`` that does not define them."""
    for name in dir(cls):
        param = getattr(cls, name, None)
        if not isinstance(param, Param):
            continue
        title = name[0].upper() + name[1:]
        if not hasattr(cls, f"get{title}"):
            setattr(cls, f"get{title}", _getter(name))
        if not hasattr(cls, f"set{title}"):
            setattr(cls, f"set{title}", _setter(name))
    return cls


def _getter(name: str) -> Any:
    def get(self: Params) -> Any:
        return self.getOrDefault(name)

    get.__name__ = f"get{name[0].upper()}{name[1:]}"
    get.__doc__ = f"Returns the value of Param ``{name}``."
    return get


def _setter(name: str) -> Any:
    def set_(self: Params, value: Any) -> Params:
        return self._set(**{name: value})

    set_.__name__ = f"set{name[0].upper()}{name[1:]}"
    set_.__doc__ = f"Sets Param ``{name}``; returns self."
    return set_
