"""Test-only: attacks chosen by the `attack` config key. The sandbox must end each with a
typed error (the deadline, the memory limit), never let it take the host down."""

import nodewright
from nodewright import Context, Outcome


@nodewright.export
class Hostile(nodewright.Package):
    def plan(self, ctx: Context) -> Outcome:
        return Outcome.converged()

    def apply(self, ctx: Context) -> Outcome:
        attack = ctx.require("attack")
        if attack == "spin":
            while True:
                pass
        if attack == "memory":
            hoard = []
            while True:
                hoard.append(bytearray(8 << 20))
        if attack == "undeclared":
            # Uses a capability the manifest does not declare (so the world does not import it).
            ctx.sysctl.get("kernel.panic")
        raise nodewright.InvalidConfig(f"unknown attack {attack!r}")
