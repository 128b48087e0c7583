"""One error root: every exception class harvest defines derives from ``HarvestOutboxError``.

Imports every module of the installed ``harvest_outbox`` package and checks each exception class
whose ``__module__`` is one of them, so a new ``class FooError(Exception)`` anywhere (a module's
own error, a nested class) fails here until it joins the family.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType

import pytest

import harvest_outbox
from harvest_outbox.consumer.errors import ConfigError as ConsumerConfigError
from harvest_outbox.consumer.errors import ConsumerError
from harvest_outbox.errors import HarvestOutboxError
from harvest_outbox.harvest_local.errors import HarvestLocalError
from harvest_outbox.producer.errors import ConfigError, HarvestError
from harvest_outbox.sequencer.errors import SequencerError, SequencerStateError, UUIDError
from harvest_outbox.spark_reader.errors import ReaderConfigError, SparkReaderError


def _modules() -> list[ModuleType]:
    names = [harvest_outbox.__name__]
    names += [m.name for m in pkgutil.walk_packages(harvest_outbox.__path__, f"{harvest_outbox.__name__}.")]
    # The subpackages live in other folders (package-dir): walk each of them too.
    for sub in ("producer", "sequencer", "consumer", "spark_reader", "harvest_local"):
        pkg = importlib.import_module(f"harvest_outbox.{sub}")
        names.append(pkg.__name__)
        names += [m.name for m in pkgutil.walk_packages(pkg.__path__, f"{pkg.__name__}.")]
    return [importlib.import_module(name) for name in sorted(set(names)) if not name.endswith("__main__")]


def _exception_classes(module: ModuleType) -> list[type[BaseException]]:
    found = []
    todo = [obj for _, obj in inspect.getmembers(module, inspect.isclass)]
    while todo:
        cls = todo.pop()
        if cls.__module__ != module.__name__:
            continue  # imported from elsewhere: checked in its own module
        if issubclass(cls, BaseException):
            found.append(cls)
        todo += [obj for obj in vars(cls).values() if inspect.isclass(obj)]  # nested classes
    return found


def test_every_exception_class_in_the_package_descends_from_the_root() -> None:
    classes = [cls for module in _modules() for cls in _exception_classes(module)]
    assert len(classes) > 20, f"the walk found too few exception classes to be checking anything: {classes}"
    strays = [f"{cls.__module__}.{cls.__qualname__}" for cls in classes if not issubclass(cls, HarvestOutboxError)]
    assert not strays, (
        "derive these from the package's error (harvest_outbox.errors.HarvestOutboxError):\n" + "\n".join(strays)
    )


@pytest.mark.parametrize(
    ("error", "other_bases"),
    [
        (HarvestError, ()),
        (ConfigError, (ValueError,)),
        (SequencerError, ()),
        (UUIDError, (ValueError,)),
        (SequencerStateError, (RuntimeError,)),
        (ConsumerError, ()),
        (ConsumerConfigError, (ValueError,)),
        (SparkReaderError, ()),
        (ReaderConfigError, (ValueError,)),
        (HarvestLocalError, ()),
    ],
)
def test_each_package_root_joins_the_family_and_keeps_its_bases(
    error: type[Exception], other_bases: tuple[type[Exception], ...]
) -> None:
    assert issubclass(error, HarvestOutboxError)
    for base in other_bases:
        assert issubclass(error, base), f"{error.__name__} must stay a {base.__name__}: callers catch it as one"
    with pytest.raises(HarvestOutboxError):
        raise error("x")
