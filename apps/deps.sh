#!/usr/bin/env bash
# What `make experiments` needs beyond Courier's own build: Open MPI's OSHMEM (oshcc,
# oshrun, the headers and libraries) for the comparison build of fadd.c, and mpirun and
# iproute2 for the runs across network-namespace hosts; from Debian's packages, only what
# is missing.
set -euo pipefail
need=()
command -v oshcc >/dev/null && command -v oshrun >/dev/null || need+=(openmpi-bin)
[ -e /usr/lib/x86_64-linux-gnu/openmpi/include/shmem.h ] || ls /usr/lib/*/openmpi/include/shmem.h >/dev/null 2>&1 || need+=(libopenmpi-dev)
command -v mpirun.openmpi >/dev/null || need+=(openmpi-bin)
command -v ip >/dev/null || need+=(iproute2)
if [ ${#need[@]} -gt 0 ]; then
  echo "apps/deps.sh: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
exit 0
