// Write nodewright package plugins in JavaScript.
//
// A plugin is a WebAssembly component the nodewright agent runs on a node, one stage at a
// time, in a wasmtime sandbox. Extend `Package`, implement the stages you need, pass the
// class to `exportPackage`, list the capabilities it uses in package.json
// (`"nodewright": {"capabilities": ["files"]}`) and build with `nodewright plugin build`.
// A call outside the grant throws `Denied`, naming the grant to add. Types: index.d.ts.
//
// `nodewright plugin build` bundles this file with the plugin (esbuild) and generates the
// component's entry module, which hands the declared WIT interfaces to `bindInterfaces`
// and exports `stages`.

let interfaces = {};
let registered = null;

/** @internal Called by the generated entry module with the imported WIT interfaces. */
export function bindInterfaces(bound) {
  interfaces = bound;
}

function iface(name) {
  if (!interfaces.log) {
    throw new Error(
      `the '${name}' capability exists only inside a component built by \`nodewright plugin build\`; ` +
        'outside one (a native unit test), test the logic that does not call the host, or run the ' +
        'component with `nodewright plugin run`',
    );
  }
  const m = interfaces[name];
  if (!m) {
    throw new CapabilityNotDeclared(
      `the plugin uses the '${name}' capability but does not declare it: add "${name}" to ` +
        '"nodewright": {"capabilities": [...]} in package.json and rebuild',
    );
  }
  return m;
}

// ---- values ---------------------------------------------------------------------------

export const Stage = Object.freeze({
  PLAN: 'plan',
  APPLY: 'apply',
  CONFIG: 'config',
  INTERRUPT: 'interrupt',
  POST_INTERRUPT: 'post-interrupt',
  UPGRADE: 'upgrade',
  UNINSTALL: 'uninstall',
});

const RANK = { none: 0, services: 1, 'restart-all-services': 2, reboot: 3 };

export class Interrupt {
  constructor(kind = 'none', units = []) {
    this.kind = kind;
    this.units = [...units];
    Object.freeze(this);
  }
  static none() { return new Interrupt('none'); }
  static services(units) { return new Interrupt('services', units); }
  static restartAllServices() { return new Interrupt('restart-all-services'); }
  static reboot() { return new Interrupt('reboot'); }
  get rank() { return RANK[this.kind]; }
  max(other) {
    if (this.kind === 'services' && other.kind === 'services') {
      return Interrupt.services([...this.units, ...other.units.filter((u) => !this.units.includes(u))]);
    }
    return other.rank > this.rank ? other : this;
  }
}

export class Change {
  constructor(kind, target, detail) {
    this.kind = kind;
    this.target = target;
    this.detail = detail;
  }
}

export class Outcome {
  constructor(changes = [], interrupt = Interrupt.none(), message = undefined) {
    this.changes = changes;
    this.interrupt = interrupt;
    this.message = message;
  }
  static converged() { return new Outcome(); }
  static changed(changes, interrupt = Interrupt.none()) { return new Outcome([...changes], interrupt); }
  withMessage(message) { this.message = message; return this; }
  get isConverged() { return this.changes.length === 0 && this.interrupt.kind === 'none'; }
}

// ---- errors ---------------------------------------------------------------------------

export class StepError extends Error {
  constructor(message) { super(message); this.name = new.target.name; }
}
export class InvalidConfig extends StepError {}
export class PackageFailed extends StepError {}
export class CapabilityNotDeclared extends StepError {}
export class CapabilityError extends StepError {
  constructor(message, raw) { super(message); this.raw = raw; }
}
export class Denied extends CapabilityError {
  constructor(denial, raw) {
    super(denial.message, raw);
    this.capability = denial.capability;
    this.operation = denial.operation;
    this.target = denial.target;
  }
}
export class WrongStage extends CapabilityError {}
export class NotFound extends CapabilityError {}
export class HostFailed extends CapabilityError {}

/** The typed error for a host `cap-error` value (kept as `raw`). */
export function capError(raw) {
  switch (raw.tag) {
    case 'denied': return new Denied(raw.val, raw);
    case 'wrong-stage': return new WrongStage(raw.val, raw);
    case 'not-found': return new NotFound(raw.val, raw);
    default: return new HostFailed(String(raw.val), raw);
  }
}

function call(fn, ...args) {
  try {
    return fn(...args);
  } catch (e) {
    if (e && typeof e === 'object' && 'payload' in e) throw capError(e.payload);
    throw e;
  }
}

// ---- capabilities ---------------------------------------------------------------------

export class Files {
  read(path) { return call(iface('files').read, path); }
  readOpt(path) {
    try { return this.read(path); } catch (e) { if (e instanceof NotFound) return undefined; throw e; }
  }
  readText(path) {
    const data = this.readOpt(path);
    return data === undefined ? undefined : new TextDecoder().decode(data);
  }
  write(path, contents, mode) {
    const data = typeof contents === 'string' ? new TextEncoder().encode(contents) : contents;
    call(iface('files').write, path, data, mode);
  }
  stat(path) {
    const st = call(iface('files').stat, path);
    return st === undefined || st === null ? undefined : { ...st };
  }
  listDir(path) { return call(iface('files').listDir, path); }
  createDir(path) { call(iface('files').createDir, path); }
  remove(path) { call(iface('files').remove, path); }
  setOwner(path, uid, gid) { call(iface('files').setOwner, path, uid, gid); }
  setMode(path, mode) { call(iface('files').setMode, path, mode); }
  install(source, path, mode) { call(iface('files').install, source, path, mode); }
}

export class Kmod {
  load(name, params = []) { call(iface('kmod').load, name, params); }
  unload(name) { call(iface('kmod').unload, name); }
  isLoaded(name) { return call(iface('kmod').isLoaded, name); }
  depmod(release) { call(iface('kmod').depmod, release); }
}

const VERBS = ['start', 'stop', 'restart', 'reload', 'enable', 'disable'];

export class Services {
  control(verb, unit) {
    if (!VERBS.includes(verb)) throw new InvalidConfig(`unknown service verb '${verb}': one of ${VERBS.join(', ')}`);
    call(iface('services').control, verb, unit);
  }
  status(unit) { return { ...call(iface('services').status, unit) }; }
  daemonReload() { call(iface('services').daemonReload); }
}

export class Sysctl {
  get(key) { return call(iface('sysctl').get, key); }
  set(key, value) { call(iface('sysctl').set, key, value); }
}

export class Exec {
  run(path, args = []) { return { ...call(iface('exec').run, path, args) }; }
  runPayload(payload, file, args = []) { return this.run(`payload:${payload}/${file}`, args); }
}

export class Power {
  requestReboot(reason) { call(iface('power').requestReboot, reason); }
}

export class Context {
  constructor({ node, package: pkg, version, previousVersion, stage, config, changedKeys = [] }) {
    this.node = node;
    this.package = pkg;
    this.version = version;
    this.previousVersion = previousVersion;
    this.stage = stage;
    this.config = config instanceof Map ? config : new Map(config);
    this.changedKeys = [...changedKeys];
    this.files = new Files();
    this.kmod = new Kmod();
    this.services = new Services();
    this.sysctl = new Sysctl();
    this.exec = new Exec();
    this.power = new Power();
  }
  value(key) { return this.config.get(key); }
  require(key) {
    if (!this.config.has(key)) throw new InvalidConfig(`config key '${key}' is required`);
    return this.config.get(key);
  }
  changed(key) { return this.changedKeys.length === 0 || this.changedKeys.includes(key); }
  nodeInfo() {
    const i = iface('node').info();
    return { ...i, labels: new Map(i.labels), osRelease: new Map(i.osRelease) };
  }
}

// ---- logs -----------------------------------------------------------------------------

function emit(level, message) {
  if (interfaces.log) interfaces.log.log(level, String(message));
  else console.error(`${level} ${message}`);
}
export const log = Object.freeze({
  trace: (m) => emit('trace', m),
  debug: (m) => emit('debug', m),
  info: (m) => emit('info', m),
  warn: (m) => emit('warn', m),
  error: (m) => emit('error', m),
});

// ---- the package and its export -------------------------------------------------------

export class Package {
  plan(_ctx) { throw new PackageFailed(`${this.constructor.name} does not implement plan`); }
  apply(_ctx) { throw new PackageFailed(`${this.constructor.name} does not implement apply`); }
  config(ctx) { return this.apply(ctx); }
  interrupt(_ctx) { return Outcome.converged(); }
  postInterrupt(_ctx) { return Outcome.converged(); }
  upgrade(ctx) { return this.apply(ctx); }
  uninstall(_ctx) { return Outcome.converged(); }
  check(ctx) {
    if (![Stage.APPLY, Stage.CONFIG, Stage.UPGRADE].includes(ctx.stage)) return Outcome.converged();
    const plan = this.plan(ctx);
    if (plan.isConverged) return plan;
    const pending = plan.changes.map((c) => `${c.kind} ${c.target}`).join(', ');
    throw new PackageFailed(`${ctx.stage} did not converge: still pending ${pending}`);
  }
}

/** Registers the plugin's package class. Call it exactly once. */
export function exportPackage(cls) {
  if (typeof cls !== 'function' || !(cls.prototype instanceof Package)) {
    throw new TypeError('exportPackage takes a class that extends Package');
  }
  if (registered && registered !== cls) {
    throw new TypeError(`exportPackage called twice (${registered.name} and ${cls.name}): a plugin exports one package`);
  }
  registered = cls;
  return cls;
}

/** @internal The generated entry calls this at build time: no package is a build error. */
export function requireExported() {
  if (!registered) throw new TypeError('no package exported: call exportPackage(YourPackage) once');
}

function toWitOutcome(out) {
  if (!(out instanceof Outcome)) {
    throw new PackageFailed(`a stage returned ${out === null ? 'null' : typeof out}, not an Outcome`);
  }
  const i = out.interrupt;
  const interrupt = i.kind === 'services' ? { tag: 'services', val: [...i.units] } : { tag: i.kind };
  return {
    changes: out.changes.map((c) => ({ kind: c.kind, target: c.target, detail: c.detail })),
    interrupt,
    message: out.message,
  };
}

function toStepError(e) {
  if (e instanceof CapabilityError && e.raw) return { tag: 'capability', val: e.raw };
  if (e instanceof InvalidConfig) return { tag: 'invalid-config', val: e.message };
  if (e instanceof StepError) return { tag: 'failed', val: e.message };
  const name = e && e.name ? e.name : 'Error';
  return { tag: 'failed', val: `${name}: ${e && e.message !== undefined ? e.message : String(e)}` };
}

/** The error a stage export throws: componentize-js lowers `payload` as the result's error. */
class StageFailure extends Error {
  constructor(payload) { super('stage failed'); this.payload = payload; }
}

function run(method, raw) {
  if (!registered) throw new StageFailure({ tag: 'failed', val: 'no package exported: call exportPackage(YourPackage)' });
  try {
    const ctx = new Context(raw);
    return toWitOutcome(new registered()[method](ctx));
  } catch (e) {
    throw new StageFailure(toStepError(e));
  }
}

/** The `nodewright:plugin/stages` export (re-exported by the generated entry module). */
export const stages = {
  plan: (ctx) => run('plan', ctx),
  apply: (ctx) => run('apply', ctx),
  config: (ctx) => run('config', ctx),
  interrupt: (ctx) => run('interrupt', ctx),
  postInterrupt: (ctx) => run('postInterrupt', ctx),
  upgrade: (ctx) => run('upgrade', ctx),
  uninstall: (ctx) => run('uninstall', ctx),
  check: (ctx) => run('check', ctx),
};

/** How a file would change, for plan output (the Rust SDK's wording). */
export function describeFileChange(current, wanted) {
  const enc = new TextEncoder();
  const w = typeof wanted === 'string' ? enc.encode(wanted) : wanted;
  if (current === undefined || current === null) return `create, ${w.length} bytes`;
  const c = typeof current === 'string' ? enc.encode(current) : current;
  if (c.length === w.length && c.every((b, i) => b === w[i])) return undefined;
  const lines = (bytes) => {
    const out = [];
    let start = 0;
    for (let i = 0; i <= bytes.length; i++) {
      if (i === bytes.length || bytes[i] === 10) {
        out.push(Array.prototype.join.call(bytes.subarray(start, i), ','));
        start = i + 1;
      }
    }
    return out;
  };
  const oldLines = lines(c);
  const newLines = lines(w);
  const added = newLines.filter((l) => !oldLines.includes(l)).length;
  const removed = oldLines.filter((l) => !newLines.includes(l)).length;
  return `+${added} -${removed} lines`;
}
