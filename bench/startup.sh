#!/usr/bin/env bash
# Job start-up and footprint, courier run against Open MPI's mpirun in one run (see
# startup.py). Installs Open MPI's compiler wrapper (libopenmpi-dev) if missing, builds
# bench/job_scale.c and bench/mpi_barrier.c, measures into results/startup.jsonl.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(dirname "$here")"
cd "$root"
bash scripts/launchers.sh
if ! command -v mpicc.openmpi >/dev/null || [ ! -e /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h ]; then
  echo "startup: installing libopenmpi-dev (mpicc)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends libopenmpi-dev >/dev/null
fi
cargo build --release -p courier-cli -p courier-capi
mkdir -p target/bench
cc -O2 -std=c11 -D_DEFAULT_SOURCE -Icrates/courier-capi/include bench/job_scale.c -o target/bench/job_scale \
  -Ltarget/release -lcourier -Wl,-rpath,"$root/target/release"
mpicc.openmpi -O2 bench/mpi_barrier.c -o target/bench/mpi_barrier
python3 "$here/startup.py" measure --out "$here/results/startup.jsonl" "$@"
python3 "$here/startup.py" render "$here/results/startup.jsonl" > "$root/target/bench/startup.md"
cat "$root/target/bench/startup.md"
# The job start-up section of bench/RESULTS.md (kept there across make bench).
python3 "$here/carry.py" splice "$here/RESULTS.md" startup "$root/target/bench/startup.md"
python3 "$here/startup.py" table "$here/results/startup.jsonl"
