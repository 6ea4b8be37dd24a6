// @ts-check
// `files` in JavaScript: the Rust plugin's behaviour, key for key.
//
// Config:
// - `file:<absolute path>`: the file's content;
// - `mode:<path>`: octal permissions (default `0644`);
// - `owner:<path>`: `uid:gid` (default: unchanged, root for new files);
// - `restart`: comma-separated units to restart when any file changed (reported as a
//   `services` interrupt, performed by the host, not by this plugin).
//
// `plan` shows, per file, whether it is created, how many lines differ, and mode/owner
// drift. `uninstall` removes the files.
//
// Grants: `files: [{path: <each file or its directory>, access: readWrite}]`.

import {
  Change, Interrupt, InvalidConfig, Outcome, Package, describeFileChange, exportPackage,
} from '@nodewright/sdk';

/**
 * The managed files, from `file:`, `mode:` and `owner:` keys.
 * @param {Map<string, string>} config
 */
export function managed(config) {
  const out = [];
  for (const [key, content] of config) {
    if (!key.startsWith('file:')) continue;
    const path = key.slice('file:'.length);
    if (!path.startsWith('/') || path.split('/').includes('..')) {
      throw new InvalidConfig(`"${key}": the path must be absolute, without '..'`);
    }
    let mode = 0o644;
    const m = config.get(`mode:${path}`);
    if (m !== undefined) {
      const digits = m.startsWith('0o') ? m.slice(2) : m;
      mode = /^\+?[0-7]+$/.test(digits) ? parseInt(digits, 8) : NaN;
      if (!(mode <= 0o7777)) throw new InvalidConfig(`mode:${path} = "${m}" is not an octal mode`);
    }
    let owner;
    const o = config.get(`owner:${path}`);
    if (o !== undefined) {
      const [u, g, ...rest] = o.split(':');
      const id = (s) => (s !== undefined && /^\+?\d+$/.test(s) && Number(s) <= 0xffffffff ? Number(s) : NaN);
      owner = [id(u), id(g)];
      if (rest.length > 0 || owner.some(Number.isNaN)) {
        throw new InvalidConfig(`owner:${path} = "${o}" is not uid:gid`);
      }
    }
    out.push({ path, content, mode, owner });
  }
  for (const key of config.keys()) {
    const prefix = ['mode:', 'owner:'].find((p) => key.startsWith(p));
    if (prefix && !config.has(`file:${key.slice(prefix.length)}`)) {
      throw new InvalidConfig(`"${key}" has no matching file:${key.slice(prefix.length)}`);
    }
  }
  if (out.length === 0) throw new InvalidConfig('no file:<path> keys configured');
  return out;
}

const octal = (n) => n.toString(8).padStart(4, '0');

function drift(ctx, files) {
  const changes = [];
  for (const f of files) {
    const current = ctx.files.readOpt(f.path);
    const details = [];
    const d = describeFileChange(current, f.content);
    if (d !== undefined) details.push(d);
    if (current !== undefined) {
      const st = ctx.files.stat(f.path);
      if (st) {
        if (st.mode !== f.mode) details.push(`mode ${octal(st.mode)} -> ${octal(f.mode)}`);
        if (f.owner && (st.uid !== f.owner[0] || st.gid !== f.owner[1])) {
          details.push(`owner ${st.uid}:${st.gid} -> ${f.owner[0]}:${f.owner[1]}`);
        }
      }
    }
    if (details.length > 0) changes.push(new Change('file', f.path, details.join(', ')));
  }
  return changes;
}

function interruptFor(ctx, changes) {
  const units = ctx.value('restart');
  if (units === undefined || changes.length === 0) return Interrupt.none();
  return Interrupt.services(units.split(',').map((u) => u.trim()).filter((u) => u !== ''));
}

class Files extends Package {
  plan(ctx) {
    const changes = drift(ctx, managed(ctx.config));
    return Outcome.changed(changes, interruptFor(ctx, changes));
  }

  apply(ctx) {
    const files = managed(ctx.config);
    const changes = drift(ctx, files);
    for (const f of files.filter((f) => changes.some((c) => c.target === f.path))) {
      ctx.files.write(f.path, f.content, f.mode);
      ctx.files.setMode(f.path, f.mode);
      if (f.owner) ctx.files.setOwner(f.path, f.owner[0], f.owner[1]);
    }
    return Outcome.changed(changes, interruptFor(ctx, changes));
  }

  uninstall(ctx) {
    const changes = [];
    for (const f of managed(ctx.config)) {
      if (ctx.files.stat(f.path)) {
        ctx.files.remove(f.path);
        changes.push(new Change('file', f.path, 'removed'));
      }
    }
    return Outcome.changed(changes);
  }
}

exportPackage(Files);
