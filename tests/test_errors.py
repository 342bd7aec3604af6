"""One root for pgcdc's exceptions: every public exception class of every module is a
``PgcdcError``, and keeps its built-in kind (bad input stays a ``ValueError``)."""

from __future__ import annotations

import importlib
import inspect
import pickle
import pkgutil

import pgcdc
from pgcdc.errors import PgcdcError
from pgcdc.filters.errors import FilterSyntaxError
from pgcdc.lake.config import ConfigError
from pgcdc.protocol.errors import ProtocolError


def _exception_classes() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for info in pkgutil.walk_packages(pgcdc.__path__, "pgcdc."):
        if info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        for name, value in vars(module).items():
            if (
                inspect.isclass(value)
                and issubclass(value, BaseException)
                and value.__module__ == info.name
                and not name.startswith("_")
            ):
                found[f"{info.name}.{name}"] = value
    return found


def test_every_public_exception_is_a_pgcdc_error() -> None:
    classes = _exception_classes()
    assert len(classes) > 30  # the walk found the layers' errors
    outside = sorted(name for name, cls in classes.items() if not issubclass(cls, PgcdcError))
    assert outside == []


def test_errors_keep_their_kind_and_pickle() -> None:
    error = ProtocolError("I", 3, "truncated")
    assert isinstance(error, ValueError) and isinstance(error, PgcdcError)
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is ProtocolError and str(again) == str(error)
    assert issubclass(ConfigError, ValueError) and issubclass(FilterSyntaxError, ValueError)
