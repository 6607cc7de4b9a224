"""What a job's task is, and the shape of its call: the arguments checked at registration.

A job's ``args`` and ``kwargs`` are bound against its task's signature with the
``RunContext`` parameter left out, wherever it stands, so a missing, extra or doubled
argument (or a ``ctx`` that is not annotated) fails in ``add_job`` with a
:class:`~cronlock.ScheduleError` instead of at every run. What the check leaves is the
job's call :data:`Shape`, which ``Job.call`` follows at each run without looking anything up.

A service registers one task many times over (``args=(tenant_id,)``): what the task is is
worked out for the first job given it, and the arguments are bound again only when their
count or keyword names change (binding looks at nothing else), so jobs registered alike
share one shape and one check.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._errors import ScheduleError
from .._records import RunContext
from .settings import GivenTask, Recall

__all__ = ("Shape", "TaskInfo", "task_shape")

# (is async, the RunContext parameter's name or None, where the context goes: None by
# keyword, an int at that position among the args).
Shape = tuple[bool, str | None, int | None]

_Parameter = inspect.Parameter
_POSITIONAL = (_Parameter.POSITIONAL_ONLY, _Parameter.POSITIONAL_OR_KEYWORD)
_VARIADIC = (_Parameter.VAR_POSITIONAL, _Parameter.VAR_KEYWORD)
# A parameter of these names, not annotated RunContext, is most likely meant to be one.
_CONTEXT_NAMES = frozenset({"ctx", "context"})


class TaskInfo:
    """What a task is: async or not, its RunContext parameter and its signature without it."""

    __slots__ = ("index", "keyword", "param", "positional_only", "rest", "task")

    def __init__(
        self,
        task: Callable[..., object],
        is_async: bool,
        param: inspect.Parameter | None,
        index: int | None,
        rest: inspect.Signature | None,
    ) -> None:
        self.task = task
        self.param = param  # the RunContext parameter, if any
        self.index = index  # its position among the positional parameters; None: keyword-only
        self.positional_only = param is not None and param.kind is _Parameter.POSITIONAL_ONLY
        self.rest = rest  # the signature without it; None when it cannot be read
        # The shape of a call that passes the context (if any) by keyword.
        self.keyword: Shape = (is_async, None if param is None else param.name, None)

    def check(self, job: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Shape:
        """The call shape of job *job* given *args* and *kwargs*, which are bound against
        the task's signature; raises :class:`~cronlock.ScheduleError` naming the job, the
        parameter and what is wrong with it."""
        param, index, rest = self.param, self.index, self.rest
        if rest is None:  # a signature that cannot be read: called as given, unchecked
            return self.keyword
        if param is not None and param.name in kwargs:
            raise ScheduleError(
                f"job {job!r}: argument {param.name!r} given twice: the scheduler passes the "
                f"run's RunContext to it, so leave it out of kwargs ({self._task_text()})"
            )
        try:
            rest.bind(*args, **kwargs)
        except TypeError as exc:
            problem = _problem(rest, args, kwargs, param is not None) or str(exc)
            raise ScheduleError(f"job {job!r}: {problem} ({self._task_text()})") from None
        if param is None or index is None:
            return self.keyword
        given = len(args)
        if given > index or (given == index and self.positional_only):
            # The args reach its position: it goes in between, and they fill the others.
            is_async, name, _ = self.keyword
            return (is_async, name, index)
        if self.positional_only:  # after parameters left to their defaults
            raise ScheduleError(
                f"job {job!r}: the RunContext parameter {param.name!r} is positional-only, so "
                f"args must fill the {index} parameter(s) before it ({self._task_text()})"
            )
        return self.keyword  # the args end before it: by keyword

    def _task_text(self) -> str:
        target = self.task
        name = getattr(target, "__qualname__", None) or type(target).__qualname__
        try:
            signature = inspect.signature(target)
        except (TypeError, ValueError):
            return f"task {name}"
        # Without the annotations, which would print as long module paths.
        params = [p.replace(annotation=_Parameter.empty) for p in signature.parameters.values()]
        bare = signature.replace(parameters=params, return_annotation=_Parameter.empty)
        return f"task {name}{bare}"


def task_shape(
    job: str,
    func: Callable[..., object],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    recall: Recall,
) -> Shape:
    """The call shape of job *job* (*func* given *args* and *kwargs*), checked (raises
    :class:`~cronlock.ScheduleError`), and remembered in *recall* for the next job: a job
    given the very same task and argument count, without kwargs, shares that shape
    without a check (new_job)."""
    last = recall.task  # one read: a registration in another thread replaces it whole
    info = last.info if func is last.func else describe_task(func)
    names = tuple(kwargs) if kwargs else ()
    if info is last.info and len(args) == last.arg_count and names == last.kwarg_names:
        shape: Shape = last.shape  # binding depends on nothing else
    else:
        shape = info.check(job, args, kwargs)
    recall.task = GivenTask(func, len(args), names, shape, info)
    return shape


def describe_task(func: Callable[..., object]) -> TaskInfo:
    """What *func* is."""
    target = func
    while isinstance(target, functools.partial):
        target = target.func
    is_async = inspect.iscoroutinefunction(target) or inspect.iscoroutinefunction(
        getattr(target, "__call__", None)  # noqa: B004 - async callable objects
    )
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):  # a builtin without one: nothing to check or inject
        return TaskInfo(func, is_async, None, None, None)
    param = _context_parameter(func, signature)
    params = list(signature.parameters.values())
    index = None
    if param is not None:
        params.remove(param)
        if param.kind in _POSITIONAL:
            index = list(signature.parameters).index(param.name)
    return TaskInfo(func, is_async, param, index, signature.replace(parameters=params))


def _context_parameter(
    func: Callable[..., object], signature: inspect.Signature
) -> inspect.Parameter | None:
    """The parameter annotated ``RunContext``, if any (a string annotation resolved)."""
    params = [p for p in signature.parameters.values() if p.kind not in _VARIADIC]
    for param in params:
        if param.annotation is RunContext:
            return param
    if not any(isinstance(p.annotation, str) and "RunContext" in p.annotation for p in params):
        # Resolving string annotations evaluates each of them (slow, and it may fail):
        # skip it when no annotation could be RunContext, which is nearly every task.
        return None
    try:
        resolved = inspect.signature(func, eval_str=True).parameters
    except Exception:  # unresolvable forward references: fall back to the raw annotations
        resolved = signature.parameters
    for param in params:
        hint = resolved[param.name].annotation
        if hint is RunContext or (
            isinstance(hint, str) and (hint == "RunContext" or hint.endswith(".RunContext"))
        ):
            return param
    return None


def _problem(
    rest: inspect.Signature, args: Sequence[Any], kwargs: Mapping[str, Any], has_context: bool
) -> str | None:
    """What is wrong with binding *args* and *kwargs* to *rest* (the task's signature
    without its RunContext parameter, if *has_context*), naming the parameter; None if
    none of these, and the caller says what ``bind`` said."""
    params = list(rest.parameters.values())
    kinds = {p.kind for p in params}
    positional = [p for p in params if p.kind in _POSITIONAL]
    if len(args) > len(positional) and _Parameter.VAR_POSITIONAL not in kinds:
        extra = len(positional)
        besides = " besides its RunContext" if has_context else ""
        return (
            f"unexpected argument {args[extra]!r} (args[{extra}]): the task takes "
            f"{extra} positional argument(s){besides}"
        )
    filled = {p.name for p in positional[: len(args)]}
    named = {p.name: p for p in params if p.kind not in _VARIADIC}
    takes_any = _Parameter.VAR_KEYWORD in kinds
    for key in kwargs:
        if not isinstance(key, str):
            return f"kwargs key {key!r} is not a string"
        found = named.get(key)
        if found is not None and found.kind is _Parameter.POSITIONAL_ONLY:
            if takes_any:
                continue  # it goes to the **kwargs parameter
            return f"argument {key!r} is positional-only: give it in args"
        if key in filled:
            return f"argument {key!r} given twice, in args and in kwargs"
        if found is None and not takes_any:
            return f"unexpected argument {key!r}"
    for p in params:
        if p.default is _Parameter.empty and p.kind not in _VARIADIC and p.name not in filled:
            if p.name in kwargs and p.kind is not _Parameter.POSITIONAL_ONLY:
                continue
            if not has_context and p.name in _CONTEXT_NAMES:
                return (
                    f"missing argument {p.name!r}; annotate it `{p.name}: RunContext` "
                    "to receive the run's context"
                )
            return f"missing argument {p.name!r}"
    return None
