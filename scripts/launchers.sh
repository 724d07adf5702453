#!/usr/bin/env bash
# Install the launchers Courier's job tests run under, from Debian's packages: Open MPI's
# mpirun (with the PMIx client library it uses, libpmix2), MPICH's hydra mpiexec, and Slurm
# (slurmctld, slurmd, srun with its pmi2 and pmix plugins) with munge. Only what is missing
# is installed; services are not started (the tests start and stop their own).
set -euo pipefail
need=()
command -v mpirun.openmpi >/dev/null || need+=(openmpi-bin)
[ -e /usr/lib/x86_64-linux-gnu/libpmix.so.2 ] || ls /usr/lib/*/libpmix.so.2 >/dev/null 2>&1 || need+=(libpmix2)
# srun's pmix plugin opens pmix2/lib/libpmix.so, the unversioned name only libpmix-dev has.
ls /usr/lib/*/pmix2/lib/libpmix.so >/dev/null 2>&1 || need+=(libpmix-dev)
command -v mpiexec.hydra >/dev/null || need+=(mpich)
command -v srun >/dev/null || need+=(slurm-client)
command -v slurmctld >/dev/null || need+=(slurmctld)
command -v slurmd >/dev/null || need+=(slurmd)
command -v munged >/dev/null || need+=(munge)
ls /usr/lib/*/slurm-wlm/mpi_pmi2.so >/dev/null 2>&1 || need+=(slurm-wlm-basic-plugins)
command -v ip >/dev/null || need+=(iproute2)
if [ ${#need[@]} -gt 0 ]; then
  echo "launchers: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Installing slurmd, slurmctld or munge must not start them: a policy that refuses
  # service starts for this install only.
  policy=/usr/sbin/policy-rc.d
  made_policy=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && made_policy=1
  fi
  trap '[ "$made_policy" = 1 ] && rm -f "$policy"' EXIT
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
exit 0
