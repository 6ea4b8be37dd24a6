"""The package base class and the bridge between it and the component's ``stages`` export.

``nodewright plugin build`` generates the component's entry module, which imports the
plugin's module (registering its package with :func:`export`) and then :class:`Stages`
from here. Every stage converts the WIT context into a :class:`Context`, runs the package
method and converts the result back; an exception becomes a ``step-error``, never a trap.
"""

from __future__ import annotations

import traceback
from typing import Optional, Type

from ._caps import Context
from ._model import (
    CapabilityError,
    InvalidConfig,
    Interrupt,
    Outcome,
    PackageFailed,
    Stage,
    StepError,
)


class Package:
    """A nodewright package. Implement ``plan`` and ``apply``; the other stages default to
    what most packages want, documented on each."""

    def plan(self, ctx: Context) -> Outcome:
        """Read-only: what ``apply`` (and ``config``) would change on this node, and the
        interrupt needed. Return :meth:`Outcome.converged` when the node already matches;
        nodewright then completes the node without cordon, drain or interrupt."""
        raise NotImplementedError(f"{type(self).__name__} does not implement plan")

    def apply(self, ctx: Context) -> Outcome:
        """Installs the package."""
        raise NotImplementedError(f"{type(self).__name__} does not implement apply")

    def config(self, ctx: Context) -> Outcome:
        """Applies configuration. Default: runs ``apply`` again (idempotent packages converge)."""
        return self.apply(ctx)

    def interrupt(self, ctx: Context) -> Outcome:
        """Custom interrupt work. Default: nothing (the host performs reboots and restarts)."""
        return Outcome.converged()

    def post_interrupt(self, ctx: Context) -> Outcome:
        """Runs after the interrupt took effect. Default: nothing."""
        return Outcome.converged()

    def upgrade(self, ctx: Context) -> Outcome:
        """Moves from ``ctx.previous_version`` to ``ctx.version``. Default: runs ``apply``."""
        return self.apply(ctx)

    def uninstall(self, ctx: Context) -> Outcome:
        """Removes the package. Default: nothing (packages that leave state should override)."""
        return Outcome.converged()

    def check(self, ctx: Context) -> Outcome:
        """Verifies that ``ctx.stage`` took effect. Default: after an install stage ``plan``
        must report converged; after any other stage, success."""
        if ctx.stage not in (Stage.APPLY, Stage.CONFIG, Stage.UPGRADE):
            return Outcome.converged()
        plan = self.plan(ctx)
        if plan.is_converged:
            return plan
        pending = ", ".join(f"{c.kind} {c.target}" for c in plan.changes)
        raise PackageFailed(f"{ctx.stage} did not converge: still pending {pending}")


_registered: Optional[Type[Package]] = None


def export(cls: Type[Package]) -> Type[Package]:
    """Class decorator: this class is the plugin's package. Use it exactly once."""
    global _registered
    if not (isinstance(cls, type) and issubclass(cls, Package)):
        raise TypeError("@nodewright.export decorates a subclass of nodewright.Package")
    if _registered is not None and _registered is not cls:
        raise TypeError(
            f"@nodewright.export used twice ({_registered.__name__} and {cls.__name__}): "
            "a plugin exports one package"
        )
    _registered = cls
    return cls


def registered() -> Type[Package]:
    """The exported package class (the build fails here when there is none)."""
    if _registered is None:
        raise TypeError(
            "no package exported: decorate your nodewright.Package subclass with @nodewright.export"
        )
    return _registered


def _context(raw) -> Context:
    return Context(
        node=raw.node,
        package=raw.package,
        version=raw.version,
        previous_version=raw.previous_version,
        stage=Stage(raw.stage.name.lower().replace("_", "-")),
        config=dict(raw.config),
        changed_keys=list(raw.changed_keys),
    )


def _interrupt(types, i: Interrupt):
    if i.kind == "services":
        return types.Interrupt_Services(list(i.units))
    if i.kind == "restart-all-services":
        return types.Interrupt_RestartAllServices()
    if i.kind == "reboot":
        return types.Interrupt_Reboot()
    return types.Interrupt_None_()


def _outcome(types, out: Outcome):
    if not isinstance(out, Outcome):
        raise PackageFailed(f"a stage returned {type(out).__name__}, not nodewright.Outcome")
    return types.Outcome(
        [types.Change(c.kind, c.target, c.detail) for c in out.changes],
        _interrupt(types, out.interrupt),
        out.message,
    )


def _step_error(types, e: BaseException):
    if isinstance(e, CapabilityError) and e.raw is not None:
        return types.StepError_Capability(e.raw)
    if isinstance(e, InvalidConfig):
        return types.StepError_InvalidConfig(str(e))
    if isinstance(e, StepError):
        return types.StepError_Failed(str(e))
    # Any other exception is the package's own failure: say where it came from.
    frame = traceback.extract_tb(e.__traceback__)[-1:] if e.__traceback__ else []
    where = f" at {frame[0].filename}:{frame[0].lineno}" if frame else ""
    return types.StepError_Failed(f"{type(e).__name__}: {e}{where}")


def _run(method: str, raw_ctx):
    from componentize_py_types import Err
    from wit_world.imports import types

    package = registered()()
    try:
        return _outcome(types, getattr(package, method)(_context(raw_ctx)))
    except Exception as e:  # noqa: BLE001 - every failure becomes a step-error
        raise Err(_step_error(types, e)) from None


class Stages:
    """The ``nodewright:plugin/stages`` export (componentize-py looks it up by this name)."""

    def plan(self, ctx):
        return _run("plan", ctx)

    def apply(self, ctx):
        return _run("apply", ctx)

    def config(self, ctx):
        return _run("config", ctx)

    def interrupt(self, ctx):
        return _run("interrupt", ctx)

    def post_interrupt(self, ctx):
        return _run("post_interrupt", ctx)

    def upgrade(self, ctx):
        return _run("upgrade", ctx)

    def uninstall(self, ctx):
        return _run("uninstall", ctx)

    def check(self, ctx):
        return _run("check", ctx)
