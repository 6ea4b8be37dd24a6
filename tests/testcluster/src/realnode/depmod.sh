#!/bin/sh
# The test node's depmod: `depmod -a -- RELEASE` lists every module file under
# /lib/modules/RELEASE in its modules.dep (none depends on another here), as the node's
# modprobe reads it. Each call is recorded in /var/log/nodewright-kmod.log.
echo "depmod $*" >> /var/log/nodewright-kmod.log
for release; do :; done
cd "/lib/modules/$release" || exit 1
find . -name '*.ko' | sed 's|^\./||; s|$|:|' | sort > modules.dep
