// Test-only: attacks chosen by the `attack` config key. The sandbox must end each with a
// typed error (the deadline, the memory limit), never let it take the host down.
import { InvalidConfig, Outcome, Package, exportPackage } from '@nodewright/sdk';

class Hostile extends Package {
  plan() { return Outcome.converged(); }

  apply(ctx) {
    const attack = ctx.require('attack');
    if (attack === 'spin') for (;;) { /* burn the deadline */ }
    if (attack === 'memory') {
      const hoard = [];
      for (;;) hoard.push(new Uint8Array(8 << 20).fill(1));
    }
    if (attack === 'undeclared') ctx.sysctl.get('kernel.panic');
    throw new InvalidConfig(`unknown attack '${attack}'`);
  }
}

exportPackage(Hostile);
