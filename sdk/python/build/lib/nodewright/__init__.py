"""Write nodewright package plugins in Python.

A plugin is a WebAssembly component that the nodewright agent runs on a node, one stage at
a time, in a wasmtime sandbox. Subclass :class:`Package`, implement the stages you need,
decorate the class with :func:`export`, list the capabilities it uses in ``pyproject.toml``
(``[tool.nodewright] capabilities = ["files"]``) and build with ``nodewright plugin build``.
The cluster admin grants each capability (``spec.packages.<name>.capabilities``); a call
outside the grant raises :class:`Denied` naming the grant to add::

    import nodewright
    from nodewright import Change, Context, Outcome, describe_file_change

    PATH = "/etc/motd"

    @nodewright.export
    class Motd(nodewright.Package):
        def plan(self, ctx: Context) -> Outcome:
            wanted = ctx.value("message") or "managed by nodewright"
            detail = describe_file_change(ctx.files.read_opt(PATH), wanted.encode())
            return Outcome.changed([Change("file", PATH, detail)] if detail else [])

        def apply(self, ctx: Context) -> Outcome:
            plan = self.plan(ctx)
            if plan.changes:
                ctx.files.write(PATH, ctx.value("message") or "managed by nodewright", 0o644)
            return plan
"""

from ._caps import (
    Context,
    Exec,
    ExecOutput,
    FileStat,
    Files,
    Kmod,
    NodeInfo,
    Power,
    Services,
    Sysctl,
    UnitStatus,
)
from ._export import Package, export
from ._log import debug, error, info, trace, warn
from ._model import (
    CapabilityError,
    CapabilityNotDeclared,
    Change,
    Denied,
    HostFailed,
    Interrupt,
    InvalidConfig,
    NotFound,
    Outcome,
    PackageFailed,
    Stage,
    StepError,
    WrongStage,
    describe_file_change,
)

__all__ = [
    "CapabilityError",
    "CapabilityNotDeclared",
    "Change",
    "Context",
    "Denied",
    "Exec",
    "ExecOutput",
    "FileStat",
    "Files",
    "HostFailed",
    "Interrupt",
    "InvalidConfig",
    "Kmod",
    "NodeInfo",
    "NotFound",
    "Outcome",
    "Package",
    "PackageFailed",
    "Power",
    "Services",
    "Stage",
    "StepError",
    "Sysctl",
    "UnitStatus",
    "WrongStage",
    "debug",
    "describe_file_change",
    "error",
    "export",
    "info",
    "trace",
    "warn",
]
