"""`sysctl` in Python: the Rust plugin's behaviour, key for key.

Every config key is a dotted sysctl key and its value the wanted value:
``net.ipv4.ip_forward: "1"``. ``apply``/``config`` write them all to
``/etc/sysctl.d/60-nodewright-<package>.conf`` (so they survive a reboot) and set any live
value that differs. ``plan`` reports drift of the file and of each live value; no interrupt
is ever needed. ``uninstall`` removes the drop-in (live values stay until the next boot).

Grants: ``files: [{path: /etc/sysctl.d, access: readWrite}]``, ``sysctl: [<each key>]``.
"""

import nodewright
from nodewright import Change, Context, InvalidConfig, Outcome, describe_file_change


def dropin_path(package: str) -> str:
    """The drop-in path for a package."""
    return f"/etc/sysctl.d/60-nodewright-{package}.conf"


def render(settings: list[tuple[str, str]]) -> str:
    """The drop-in content for the settings (in key order)."""
    lines = ["# Managed by nodewright. Local edits are overwritten.\n"]
    lines += [f"{k} = {v}\n" for k, v in settings]
    return "".join(lines)


def settings(ctx: Context) -> list[tuple[str, str]]:
    if not ctx.config:
        raise InvalidConfig(
            "no sysctl keys configured: add `<key>: <value>` entries to the package config"
        )
    for key, value in ctx.config.items():
        if "/" in key or " " in key or key.startswith(".") or key.endswith("."):
            raise InvalidConfig(f"config key \"{key}\" is not a dotted sysctl key")
        if "\n" in value:
            raise InvalidConfig(f"value of \"{key}\" contains a newline")
    return sorted(ctx.config.items())


def same_value(live: str, wanted: str) -> bool:
    """Live values compare field by field (``"4096 87380"`` against tabs in /proc)."""
    return live.split() == wanted.split()


def drift(ctx: Context) -> tuple[list[Change], str]:
    wanted_settings = settings(ctx)
    path = dropin_path(ctx.package)
    wanted = render(wanted_settings)
    changes = []
    detail = describe_file_change(ctx.files.read_opt(path), wanted.encode())
    if detail is not None:
        changes.append(Change("file", path, detail))
    for key, value in wanted_settings:
        live = ctx.sysctl.get(key)
        if not same_value(live, value):
            changes.append(Change("sysctl", key, f"{live} -> {value}"))
    return changes, wanted


@nodewright.export
class Sysctl(nodewright.Package):
    def plan(self, ctx: Context) -> Outcome:
        changes, _ = drift(ctx)
        return Outcome.changed(changes)

    def apply(self, ctx: Context) -> Outcome:
        changes, wanted = drift(ctx)
        for change in changes:
            if change.kind == "file":
                ctx.files.write(change.target, wanted, 0o644)
            else:
                value = ctx.config.get(change.target, "")
                ctx.sysctl.set(change.target, value)
                nodewright.info(f"{change.target} = {value}")
        return Outcome.changed(changes)

    def uninstall(self, ctx: Context) -> Outcome:
        path = dropin_path(ctx.package)
        if ctx.files.stat(path) is None:
            return Outcome.converged()
        ctx.files.remove(path)
        return Outcome.changed([Change("file", path, "removed")])
