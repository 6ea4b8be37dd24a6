// Types of the nodewright JavaScript SDK (index.js). `nodewright plugin build` writes a
// copy to build/sdk/js/; the template's jsconfig.json points editors at it.

/** The lifecycle stage being run (for `check`, the stage being verified). */
export type StageName =
  | 'plan' | 'apply' | 'config' | 'interrupt' | 'post-interrupt' | 'upgrade' | 'uninstall';

export declare const Stage: Readonly<{
  PLAN: 'plan'; APPLY: 'apply'; CONFIG: 'config'; INTERRUPT: 'interrupt';
  POST_INTERRUPT: 'post-interrupt'; UPGRADE: 'upgrade'; UNINSTALL: 'uninstall';
}>;

/** The disruption a change needs before it takes effect, weakest first. */
export declare class Interrupt {
  readonly kind: 'none' | 'services' | 'restart-all-services' | 'reboot';
  /** The units of a `services` interrupt. */
  readonly units: readonly string[];
  /** Nothing: the change is live. */
  static none(): Interrupt;
  /** Restart these systemd units. */
  static services(units: string[]): Interrupt;
  /** Restart every service the operator is configured to restart. */
  static restartAllServices(): Interrupt;
  /** Reboot the node. */
  static reboot(): Interrupt;
  /** none < services < restart-all-services < reboot. */
  readonly rank: number;
  /** The stronger of two interrupts; service lists are merged. */
  max(other: Interrupt): Interrupt;
}

/** One host change a stage made, or (in `plan`) would make. */
export declare class Change {
  constructor(kind: string, target: string, detail: string);
  /** `file`, `sysctl`, `kernel-module`, `service`, `command`... */
  kind: string;
  /** A path, key, module or unit name. */
  target: string;
  /** One human line: `"0 -> 1"`, `"create, 12 bytes"`. */
  detail: string;
}

/** What a stage reports back when it succeeds. */
export declare class Outcome {
  constructor(changes?: Change[], interrupt?: Interrupt, message?: string);
  changes: Change[];
  interrupt: Interrupt;
  message?: string;
  /** Nothing to do (or nothing done): the node is converged. */
  static converged(): Outcome;
  /** Changes made (or planned) and the interrupt they need. */
  static changed(changes: Change[], interrupt?: Interrupt): Outcome;
  /** Adds a human summary. */
  withMessage(message: string): Outcome;
  readonly isConverged: boolean;
}

/** Why a stage failed. Throw a subclass; anything else is reported as a package failure. */
export declare class StepError extends Error {}
/** The configuration is unusable (name the key in the message). */
export declare class InvalidConfig extends StepError {}
/** The package itself failed. */
export declare class PackageFailed extends StepError {}
/** A capability the plugin uses is not in package.json's `nodewright.capabilities`. */
export declare class CapabilityNotDeclared extends StepError {}
/** A capability call failed; rethrow it so the host blames the grant or the host, not the package. */
export declare class CapabilityError extends StepError {
  /** The host's error value, passed back unchanged. */
  readonly raw: unknown;
}
/** The call is outside the grant; the message names the grant to add. */
export declare class Denied extends CapabilityError {
  readonly capability: string;
  readonly operation: string;
  readonly target: string;
}
/** Not allowed in this stage (writes in `plan`, reboot outside `interrupt`). */
export declare class WrongStage extends CapabilityError {}
/** The path, unit, module or key does not exist. */
export declare class NotFound extends CapabilityError {}
/** Allowed, but the host failed to perform it. */
export declare class HostFailed extends CapabilityError {}

export interface FileStat {
  kind: 'file' | 'directory' | 'symlink' | 'other';
  size: bigint;
  /** Permission bits, e.g. 0o644. */
  mode: number;
  uid: number;
  gid: number;
}

/** Host files under `capabilities.files`. Paths are absolute host paths. */
export declare class Files {
  read(path: string): Uint8Array;
  /** `undefined` when the file does not exist. */
  readOpt(path: string): Uint8Array | undefined;
  readText(path: string): string | undefined;
  /** Atomic whole-file write, creating parents; `mode` defaults to the existing mode or 0o644. */
  write(path: string, contents: Uint8Array | string, mode?: number): void;
  /** `lstat`; `undefined` when missing. */
  stat(path: string): FileStat | undefined;
  listDir(path: string): string[];
  createDir(path: string): void;
  /** Removes a file or empty directory; a missing path is fine. */
  remove(path: string): void;
  setOwner(path: string, uid: number, gid: number): void;
  setMode(path: string, mode: number): void;
  /** Installs payload file `source` (`/payload/NAME/...`) at `path`, copied by the host
   * (never through the plugin), renamed into place and checked; `mode` defaults to 0o644,
   * or 0o755 for an executable payload file. */
  install(source: string, path: string, mode?: number): void;
}

/** Kernel modules under `capabilities.kernelModules`. */
export declare class Kmod {
  load(name: string, params?: string[]): void;
  unload(name: string): void;
  isLoaded(name: string): boolean;
  /** `depmod -a RELEASE`, after installing a module under `/lib/modules/RELEASE`. */
  depmod(release: string): void;
}

/** systemd units under `capabilities.services`. */
export declare class Services {
  control(verb: 'start' | 'stop' | 'restart' | 'reload' | 'enable' | 'disable', unit: string): void;
  status(unit: string): { activeState: string; enabled: boolean };
  daemonReload(): void;
}

/** Kernel parameters under `capabilities.sysctl` (dotted keys). */
export declare class Sysctl {
  get(key: string): string;
  set(key: string, value: string): void;
}

/** Host commands under `capabilities.commands`. */
export declare class Exec {
  /** Runs a granted command: a host binary, or `payload:<name>/<file>`; an argument whose
   * grant pattern starts with `payload:` names a payload file the command then reads. */
  run(path: string, args?: string[]): { status?: number; stdout: Uint8Array; stderr: Uint8Array };
  /** Runs file `file` of the package's payload `payload`, as granted by
   * `commands: [{path: "payload:<payload>/<file>"}]`: from the payload's read-only tree. */
  runPayload(payload: string, file: string, args?: string[]): { status?: number; stdout: Uint8Array; stderr: Uint8Array };
}

/** Reboot requests (interrupt stage of a `reboot` package only). */
export declare class Power {
  requestReboot(reason: string): void;
}

export interface NodeInfo {
  name: string;
  labels: Map<string, string>;
  kernelRelease: string;
  osRelease: Map<string, string>;
  bootId: string;
  architecture: string;
}

/** Why a stage is running, plus handles to the host capabilities. */
export declare class Context {
  readonly node: string;
  readonly package: string;
  readonly version: string;
  readonly previousVersion?: string;
  readonly stage: StageName;
  /** Configuration from the spec and its ConfigMap, in key order. */
  readonly config: Map<string, string>;
  /** Keys changed since the last successful `config` (empty on first install). */
  readonly changedKeys: string[];
  readonly files: Files;
  readonly kmod: Kmod;
  readonly services: Services;
  readonly sysctl: Sysctl;
  readonly exec: Exec;
  readonly power: Power;
  value(key: string): string | undefined;
  /** A required value, or `InvalidConfig` naming the key. */
  require(key: string): string;
  /** Whether `key` changed since the last successful `config` (true on first install). */
  changed(key: string): boolean;
  nodeInfo(): NodeInfo;
}

/** A nodewright package: implement `plan` and `apply`; the other stages have defaults. */
export declare class Package {
  /** Read-only: what apply would change, and the interrupt needed. */
  plan(ctx: Context): Outcome;
  /** Installs the package. */
  apply(ctx: Context): Outcome;
  /** Default: `apply` again. */
  config(ctx: Context): Outcome;
  /** Default: nothing (the host performs reboots and restarts). */
  interrupt(ctx: Context): Outcome;
  /** Default: nothing. */
  postInterrupt(ctx: Context): Outcome;
  /** Default: `apply`. */
  upgrade(ctx: Context): Outcome;
  /** Default: nothing. */
  uninstall(ctx: Context): Outcome;
  /** Default: after an install stage, `plan` must be converged. */
  check(ctx: Context): Outcome;
}

/** Registers the plugin's package class. Call it exactly once. */
export declare function exportPackage<T extends new () => Package>(cls: T): T;

/** Structured logs, captured by the host and shown in the stage result. */
export declare const log: Readonly<{
  trace(message: string): void;
  debug(message: string): void;
  info(message: string): void;
  warn(message: string): void;
  error(message: string): void;
}>;

/** How a file would change: `undefined` when equal, else `"create, N bytes"` or `"+A -R lines"`. */
export declare function describeFileChange(
  current: Uint8Array | string | undefined,
  wanted: Uint8Array | string,
): string | undefined;
