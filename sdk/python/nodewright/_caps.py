"""Typed handles to the host capabilities, and the stage context that hands them out.

A handle imports its WIT interface the first time it is used: the component imports only
the capabilities the plugin declares, so using an undeclared one raises
:class:`CapabilityNotDeclared` naming the manifest entry to add. Every call the grant
refuses raises :class:`Denied` naming the grant to add.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, TypeVar

from ._model import (
    CapabilityError,
    CapabilityNotDeclared,
    Denied,
    HostFailed,
    InvalidConfig,
    NotFound,
    Stage,
    WrongStage,
)

T = TypeVar("T")


def _interface(name: str):
    # The generated entry module imports the bindings before anything runs.
    if "wit_world" not in sys.modules:
        raise RuntimeError(
            f"the {name!r} capability exists only inside a component built by "
            "`nodewright plugin build`; outside one (a native unit test), test the logic "
            "that does not call the host, or run the component with `nodewright plugin run`"
        )
    try:
        return importlib.import_module(f"wit_world.imports.{name}")
    except ImportError:
        raise CapabilityNotDeclared(
            f"the plugin uses the {name!r} capability but does not declare it: add \"{name}\" "
            "to `capabilities` under [tool.nodewright] in pyproject.toml and rebuild"
        ) from None


def cap_error(raw: object) -> CapabilityError:
    """The typed exception for a host ``cap-error`` value (kept as ``raw``)."""
    kind = type(raw).__name__
    value = getattr(raw, "value", None)
    if kind == "CapError_Denied":
        return Denied(value.capability, value.operation, value.target, value.message, raw)
    if kind == "CapError_WrongStage":
        return WrongStage(value, raw)
    if kind == "CapError_NotFound":
        return NotFound(value, raw)
    return HostFailed(str(value), raw)


def _call(fn: Callable[..., T], *args) -> T:
    from componentize_py_types import Err

    try:
        return fn(*args)
    except Err as err:
        raise cap_error(err.value) from None


@dataclass(frozen=True)
class FileStat:
    """``lstat`` of a path: ``kind`` is ``file``, ``directory``, ``symlink`` or ``other``."""

    kind: str
    size: int
    mode: int
    uid: int
    gid: int


class Files:
    """Host files under ``capabilities.files``. Paths are absolute host paths."""

    def read(self, path: str) -> bytes:
        """Reads a whole file (:class:`NotFound` when missing)."""
        return _call(_interface("files").read, path)

    def read_opt(self, path: str) -> Optional[bytes]:
        """Reads a file, ``None`` when it does not exist."""
        try:
            return self.read(path)
        except NotFound:
            return None

    def read_text(self, path: str) -> Optional[str]:
        """Reads a UTF-8 file (undecodable bytes replaced), ``None`` when it does not exist."""
        data = self.read_opt(path)
        return None if data is None else data.decode("utf-8", "replace")

    def write(self, path: str, contents: bytes | str, mode: Optional[int] = None) -> None:
        """Writes a whole file atomically, creating parent directories. ``mode`` defaults to
        the existing file's mode, or 0o644."""
        data = contents.encode() if isinstance(contents, str) else bytes(contents)
        _call(_interface("files").write, path, data, mode)

    def stat(self, path: str) -> Optional[FileStat]:
        """``lstat``; ``None`` when missing."""
        st = _call(_interface("files").stat, path)
        if st is None:
            return None
        return FileStat(st.kind.name.lower(), st.size, st.mode, st.uid, st.gid)

    def list_dir(self, path: str) -> List[str]:
        """Sorted directory entries."""
        return list(_call(_interface("files").list_dir, path))

    def create_dir(self, path: str) -> None:
        """``mkdir -p``."""
        _call(_interface("files").create_dir, path)

    def remove(self, path: str) -> None:
        """Removes a file or an empty directory; a missing path is fine."""
        _call(_interface("files").remove, path)

    def set_owner(self, path: str, uid: int, gid: int) -> None:
        """``chown``."""
        _call(_interface("files").set_owner, path, uid, gid)

    def set_mode(self, path: str, mode: int) -> None:
        """``chmod``."""
        _call(_interface("files").set_mode, path, mode)

    def install(self, source: str, path: str, mode: Optional[int] = None) -> None:
        """Installs payload file ``source`` (``/payload/NAME/...``) at ``path``: the host
        copies it (the bytes never pass through the plugin), renames it into place and
        checks it; ``mode`` defaults to 0o644, or 0o755 for an executable payload file."""
        _call(_interface("files").install, source, path, mode)


class Kmod:
    """Kernel modules under ``capabilities.kernelModules``."""

    def load(self, name: str, params: Sequence[str] = ()) -> None:
        """``modprobe NAME PARAMS...``"""
        _call(_interface("kmod").load, name, list(params))

    def unload(self, name: str) -> None:
        """``modprobe -r NAME``"""
        _call(_interface("kmod").unload, name)

    def is_loaded(self, name: str) -> bool:
        """Whether NAME is loaded."""
        return _call(_interface("kmod").is_loaded, name)

    def depmod(self, release: str) -> None:
        """``depmod -a RELEASE``, after installing a module under ``/lib/modules/RELEASE``."""
        _call(_interface("kmod").depmod, release)


@dataclass(frozen=True)
class UnitStatus:
    """A systemd unit's ``ActiveState`` and whether it is enabled."""

    active_state: str
    enabled: bool


class Services:
    """systemd units under ``capabilities.services``."""

    VERBS = ("start", "stop", "restart", "reload", "enable", "disable")

    def control(self, verb: str, unit: str) -> None:
        """``systemctl VERB UNIT``; ``verb`` is one of :attr:`VERBS`."""
        if verb not in self.VERBS:
            raise InvalidConfig(f"unknown service verb {verb!r}: one of {', '.join(self.VERBS)}")
        verbs = _interface("services").Verb
        _call(_interface("services").control, verbs[verb.upper()], unit)

    def status(self, unit: str) -> UnitStatus:
        """The unit's state."""
        st = _call(_interface("services").status, unit)
        return UnitStatus(st.active_state, st.enabled)

    def daemon_reload(self) -> None:
        """``systemctl daemon-reload`` (allowed when any unit is granted)."""
        _call(_interface("services").daemon_reload)


class Sysctl:
    """Kernel parameters under ``capabilities.sysctl`` (dotted keys)."""

    def get(self, key: str) -> str:
        """Current value (trimmed)."""
        return _call(_interface("sysctl").get, key)

    def set(self, key: str, value: str) -> None:
        """Sets a value live."""
        _call(_interface("sysctl").set, key, value)


@dataclass(frozen=True)
class ExecOutput:
    """A command's exit code (``None`` when killed) and bounded output."""

    status: Optional[int]
    stdout: bytes
    stderr: bytes


class Exec:
    """Host commands under ``capabilities.commands``: the escape hatch."""

    def run(self, path: str, args: Sequence[str] = ()) -> ExecOutput:
        """Runs a granted command — a host binary, or ``payload:<name>/<file>`` — with output
        bounded by the host. An argument whose grant pattern starts with ``payload:`` names a
        payload file the command then reads."""
        out = _call(_interface("exec").run, path, list(args))
        return ExecOutput(out.status, bytes(out.stdout), bytes(out.stderr))

    def run_payload(self, payload: str, file: str, args: Sequence[str] = ()) -> ExecOutput:
        """Runs file ``file`` of the package's payload ``payload``, as granted by
        ``commands: [{path: "payload:<payload>/<file>"}]``: the host runs it from the
        payload's read-only tree, so what runs is exactly the signed file."""
        return self.run(f"payload:{payload}/{file}", args)


class Power:
    """Reboot requests (interrupt stage of a ``reboot`` package only)."""

    def request_reboot(self, reason: str) -> None:
        """Asks the host to reboot once the stage returns."""
        _call(_interface("power").request_reboot, reason)


@dataclass(frozen=True)
class NodeInfo:
    """Read-only facts about the node."""

    name: str
    labels: Dict[str, str]
    kernel_release: str
    os_release: Dict[str, str]
    boot_id: str
    architecture: str


class Context:
    """Why a stage is running, plus handles to the host capabilities."""

    files = Files()
    """Host files (``capabilities.files``)."""
    kmod = Kmod()
    """Kernel modules (``capabilities.kernelModules``)."""
    services = Services()
    """systemd units (``capabilities.services``)."""
    sysctl = Sysctl()
    """Kernel parameters (``capabilities.sysctl``)."""
    exec = Exec()
    """Host commands (``capabilities.commands``)."""
    power = Power()
    """Reboot requests (``interrupt.type: reboot``, interrupt stage only)."""

    def __init__(
        self,
        node: str,
        package: str,
        version: str,
        stage: Stage,
        config: Dict[str, str],
        changed_keys: Sequence[str] = (),
        previous_version: Optional[str] = None,
    ) -> None:
        self.node = node
        """Kubernetes node name."""
        self.package = package
        """Package name (the key under ``spec.packages``)."""
        self.version = version
        """Version being installed (or removed)."""
        self.previous_version = previous_version
        """Version installed before, for ``upgrade``."""
        self.stage = stage
        """Stage being run; for ``check``, the stage being verified."""
        self.config = dict(config)
        """Configuration from the spec and its ConfigMap, in key order."""
        self.changed_keys = list(changed_keys)
        """Keys changed since the last successful ``config`` (empty on first install)."""

    def value(self, key: str) -> Optional[str]:
        """A configuration value, ``None`` when unset."""
        return self.config.get(key)

    def require(self, key: str) -> str:
        """A required configuration value, or :class:`InvalidConfig` naming the key."""
        if key not in self.config:
            raise InvalidConfig(f"config key {key!r} is required")
        return self.config[key]

    def changed(self, key: str) -> bool:
        """Whether ``key`` changed since the last successful ``config`` (true on first install)."""
        return not self.changed_keys or key in self.changed_keys

    def node_info(self) -> NodeInfo:
        """Facts about the node (always available)."""
        info = _interface("node").info()
        return NodeInfo(
            info.name,
            dict(info.labels),
            info.kernel_release,
            dict(info.os_release),
            info.boot_id,
            info.architecture,
        )
