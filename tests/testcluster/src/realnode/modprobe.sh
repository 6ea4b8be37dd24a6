#!/bin/sh
# The test node's modprobe, for a kernel whose loaded modules are the node's /sys/module
# entries (the node's own directory, emptied of them at every boot): a loaded module has
# `initstate` (live), `refcnt` and `version`. Loads a module by the path `depmod` recorded
# in modules.dep, its version taken from the module file's modinfo as the kernel does;
# refuses to unload one in use. Each call is recorded in /var/log/nodewright-kmod.log.
echo "modprobe $*" >> /var/log/nodewright-kmod.log
remove=
if [ "$1" = -r ]; then remove=1; shift; fi
if [ "$1" = -- ]; then shift; fi
name="$1"
sys="/sys/module/$(echo "$name" | tr - _)"
release="$(uname -r)"
if [ -n "$remove" ]; then
  if [ ! -f "$sys/initstate" ]; then
    echo "modprobe: FATAL: Module $name is not in kernel." >&2
    exit 1
  fi
  if [ "$(cat "$sys/refcnt")" != 0 ]; then
    echo "modprobe: FATAL: Module $name is in use." >&2
    exit 1
  fi
  rm -r "$sys"
  exit 0
fi
[ -f "$sys/initstate" ] && exit 0
dep="/lib/modules/$release/modules.dep"
path="$(sed -n "s|^\(\(.*/\)\{0,1\}$name\.ko\):.*|\1|p" "$dep" 2>/dev/null | head -n 1)"
if [ -z "$path" ]; then
  echo "modprobe: FATAL: Module $name not found in directory /lib/modules/$release" >&2
  exit 1
fi
version="$(tr '\0' '\n' < "/lib/modules/$release/$path" | sed -n '/^version=/{s///p;q}')"
mkdir -p "$sys"
echo "$version" > "$sys/version"
echo 0 > "$sys/refcnt"
echo live > "$sys/initstate"
