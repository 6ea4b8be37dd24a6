"""The values a stage returns and the errors it raises, in plain Python.

Nothing here touches the host: these types are converted to and from the component's
WIT values at the boundary (``_export``), so plugin logic can be unit-tested natively.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import List, Optional, Sequence


class Stage(str, enum.Enum):
    """The lifecycle stage being run (for ``check``, the stage being verified)."""

    PLAN = "plan"
    APPLY = "apply"
    CONFIG = "config"
    INTERRUPT = "interrupt"
    POST_INTERRUPT = "post-interrupt"
    UPGRADE = "upgrade"
    UNINSTALL = "uninstall"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Interrupt:
    """The disruption a change needs before it takes effect, weakest first.

    Build one with :meth:`none`, :meth:`services`, :meth:`restart_all_services` or
    :meth:`reboot`; combine two with :meth:`max`.
    """

    kind: str = "none"
    units: Sequence[str] = ()

    _RANK = {"none": 0, "services": 1, "restart-all-services": 2, "reboot": 3}

    @classmethod
    def none(cls) -> "Interrupt":
        """Nothing: the change is live."""
        return cls("none")

    @classmethod
    def services(cls, units: Sequence[str]) -> "Interrupt":
        """Restart these systemd units."""
        return cls("services", tuple(units))

    @classmethod
    def restart_all_services(cls) -> "Interrupt":
        """Restart every service the operator is configured to restart."""
        return cls("restart-all-services")

    @classmethod
    def reboot(cls) -> "Interrupt":
        """Reboot the node."""
        return cls("reboot")

    @property
    def rank(self) -> int:
        """none < services < restart-all-services < reboot."""
        return self._RANK[self.kind]

    def max(self, other: "Interrupt") -> "Interrupt":
        """The stronger of two interrupts; service lists are merged."""
        if self.kind == "services" and other.kind == "services":
            merged = list(self.units) + [u for u in other.units if u not in self.units]
            return Interrupt.services(merged)
        return other if other.rank > self.rank else self


@dataclass(frozen=True)
class Change:
    """One host change a stage made, or (in ``plan``) would make."""

    kind: str
    """What changes: ``file``, ``sysctl``, ``kernel-module``, ``service``, ``command``..."""
    target: str
    """The thing itself: a path, key, module or unit name."""
    detail: str
    """One human line: ``"0 -> 1"``, ``"create, 12 bytes"``."""


@dataclass
class Outcome:
    """What a stage reports back when it succeeds."""

    changes: List[Change] = field(default_factory=list)
    interrupt: Interrupt = field(default_factory=Interrupt.none)
    message: Optional[str] = None

    @classmethod
    def converged(cls) -> "Outcome":
        """Nothing to do (or nothing done): the node is converged."""
        return cls()

    @classmethod
    def changed(cls, changes: Sequence[Change], interrupt: Interrupt | None = None) -> "Outcome":
        """Changes made (or planned) and the interrupt they need."""
        return cls(list(changes), interrupt or Interrupt.none())

    def with_message(self, message: str) -> "Outcome":
        """Adds a human summary."""
        self.message = message
        return self

    @property
    def is_converged(self) -> bool:
        """Whether nothing changes."""
        return not self.changes and self.interrupt.kind == "none"


class StepError(Exception):
    """Why a stage failed. Raise a subclass; anything else is reported as a package failure."""


class InvalidConfig(StepError):
    """The configuration given to the package is unusable (name the key in the message)."""


class PackageFailed(StepError):
    """The package itself failed."""


class CapabilityError(StepError):
    """A capability call failed. Re-raising it (or letting it propagate) lets the host blame
    the grant (denied) or the host (failed) instead of the package."""

    def __init__(self, message: str, raw: object = None) -> None:
        super().__init__(message)
        self.raw = raw
        """The host's error value, passed back unchanged so the host recognises it."""


class Denied(CapabilityError):
    """The package was not granted this call. The message names the grant to add."""

    def __init__(self, capability: str, operation: str, target: str, message: str, raw: object = None) -> None:
        super().__init__(message, raw)
        self.capability = capability
        self.operation = operation
        self.target = target


class WrongStage(CapabilityError):
    """The call is not allowed in this stage (writes in ``plan``, reboot outside ``interrupt``)."""


class NotFound(CapabilityError):
    """The path, unit, module or key does not exist."""


class HostFailed(CapabilityError):
    """The call was allowed but the host failed to perform it."""


class CapabilityNotDeclared(StepError):
    """The plugin used a capability its manifest does not declare, so the component does
    not import it. Add it to ``[tool.nodewright] capabilities`` and rebuild."""


def describe_file_change(current: Optional[bytes], wanted: bytes) -> Optional[str]:
    """How a file would change, for plan output: ``None`` when ``current`` already equals
    ``wanted``; otherwise ``"create, N bytes"`` or ``"+A -R lines"`` (the Rust SDK's wording)."""
    if current is None:
        return f"create, {len(wanted)} bytes"
    if current == wanted:
        return None
    old = current.split(b"\n")
    new = wanted.split(b"\n")
    added = sum(1 for line in new if line not in old)
    removed = sum(1 for line in old if line not in new)
    return f"+{added} -{removed} lines"
