"""The `process` marker, put on at collection: a test whose code starts another process (a
`surge serve`, gateway, autoscaler or Prometheus, the CLI, any child) is marked, so
`make test-fast` (`-m "not process"`) runs only in-process tests.

Found, not listed: from the test function and every fixture it uses, the names its code refers to
are followed through the suite's own helpers (functions and classes under `tests`), and a test
that reaches the subprocess or multiprocessing module, or asyncio's subprocess calls, starts a
process. So a new test that uses `ServerProcess`, `GatewayProcess`, `tiny_server` or a helper of
its own around them is marked with nothing to remember; `surge` code itself is not followed (the
engine's kernel builds and spawned core are what every in-process test would otherwise reach).
An explicit `@pytest.mark.process` still works for what the scan cannot see."""

from __future__ import annotations

import inspect
import sys
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

PROCESS_MODULES = frozenset({"subprocess", "multiprocessing"})
PROCESS_CALLS = frozenset({"create_subprocess_exec", "create_subprocess_shell"})


def mark_process_tests(items: list[pytest.Item]) -> None:
    """Add the `process` marker to every item whose test or fixtures start a process."""
    memo: dict[types.CodeType, bool] = {}
    for item in items:
        if item.get_closest_marker("process") is None and _starts_process(item, memo):
            item.add_marker(pytest.mark.process)


def _starts_process(item: pytest.Item, memo: dict[types.CodeType, bool]) -> bool:
    funcs: list[Callable[..., Any]] = []
    if isinstance(item, pytest.Function):
        funcs.append(item.function)
    info = getattr(item, "_fixtureinfo", None)  # pytest's own record of the fixture closure
    for name in getattr(item, "fixturenames", ()):
        for fixturedef in info.name2fixturedefs.get(name, ()) if info is not None else ():
            funcs.append(fixturedef.func)
    return any(_reaches(f, memo) for f in funcs)


def _reaches(func: Callable[..., Any], memo: dict[types.CodeType, bool]) -> bool:
    func = inspect.unwrap(func)
    code = getattr(func, "__code__", None)
    if code is None:
        return False
    if code in memo:
        return memo[code]
    memo[code] = False  # a cycle of helpers reaches nothing new
    found = any(
        _is_starter(name, func.__globals__.get(name))
        or any(_reaches(f, memo) for f in _helpers(func.__globals__.get(name)))
        for c in _codes(code)
        for name in c.co_names
    )
    memo[code] = found
    return found


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    """The code and its nested functions, lambdas and comprehensions."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _is_starter(name: str, value: object) -> bool:
    if name in PROCESS_CALLS:
        return True
    module = (
        value.__name__
        if isinstance(value, types.ModuleType)
        else getattr(value, "__module__", None)
    )
    return isinstance(module, str) and module.split(".")[0] in PROCESS_MODULES


def _helpers(value: object) -> Iterator[Callable[..., Any]]:
    """The suite's own functions that `value` is or holds (a class's methods and properties)."""
    module = getattr(value, "__module__", None)
    if not (isinstance(module, str) and (module == "tests" or module.startswith("tests."))):
        return
    if inspect.isfunction(value):
        yield value
    elif inspect.isclass(value):
        for klass in value.__mro__:
            if klass.__module__ in sys.modules and klass.__module__.startswith("tests"):
                for attr in vars(klass).values():
                    if isinstance(attr, (staticmethod, classmethod)):
                        attr = attr.__func__
                    if isinstance(attr, property):
                        yield from (f for f in (attr.fget, attr.fset) if f is not None)
                    elif inspect.isfunction(attr):
                        yield attr
