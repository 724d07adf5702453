#!/usr/bin/env bash
# `make experiments`: the seeds' experiments on Courier, then apps/report.py writes
# apps/RESULTS.md and apps/results/*.svg from the raw lines in apps/results/raw.jsonl.
#
#  1. NIC-memory seed, point to point: `courier perf -t ucp_fadd|ucp_add -m host,host|host,nic
#     -O 1|16`, on shm and tcp (both processes started here).
#  2. Signaling-put seed, microbenchmark: apps/syncput (put + quiet + flag, put + fence +
#     flag, put-with-signal, semaphore-signalling put) 1 B .. 64 KiB on 2 PEs, and
#     `courier perf -t tag_lat` at the same sizes as the message-passing baseline.
#  3. NIC-memory seed, contended fetch-add: apps/fadd on the heap, a global and the NIC hint,
#     N = 2 .. 8, built against Courier and against Open MPI's OSHMEM (when installed).
#  4. Signaling-put seed, applications: bcast, allreduce, spmv, cg in the three variants at
#     N = 2, 4, 8 on shm and tcp; against problem size at N = 4 on shm; and across two
#     network-namespace hosts (shm inside a host, tcp between) under Open MPI's mpirun,
#     when namespaces can be made here (root, iproute2, mpirun.openmpi).
#
# Every configuration runs REPS times; within a repetition the variants being compared run
# back to back, in an order that rotates between repetitions; the report takes medians.
# Environment: REPS (3), QUICK=1 (fewer iterations and sizes: a smoke run), NETNS=0 (skip
# the namespace hosts), OSHMEM=0 (skip the OSHMEM comparison).
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
bin="$root/target/apps"
oshrun="$root/target/release/oshrun"
courier="$root/target/release/courier"
out="$here/results"
REPS=${REPS:-3}
QUICK=${QUICK:-0}
mkdir -p "$out"
raw="$out/raw.jsonl"
log="$out/experiments.log"
: >"$raw"
: >"$log"
port=$((14100 + RANDOM % 2000))
started=$(date +%s)

note() { echo "[$(( $(date +%s) - started ))s] $*" | tee -a "$log" >&2; }
emit() { echo "$1" >>"$raw"; }
# A result line of a program ("KEY=V ..."), wrapped with where it ran.
emit_line() { # emit_line SECTION TLS REP LINE
  emit "{\"section\": \"$1\", \"tls\": \"$2\", \"rep\": $3, \"line\": \"$4\"}"
}

# Open MPI's OSHMEM for the comparison build, from Debian's packages (apps/deps.sh).
if [ "${OSHMEM:-1}" = 1 ]; then
  bash "$here/deps.sh" >>"$log" 2>&1 || note "apps/deps.sh failed: no OSHMEM comparison"
fi
have_oshmem=0
if [ "${OSHMEM:-1}" = 1 ] && command -v oshcc >/dev/null && command -v oshrun >/dev/null; then
  # Open MPI's wrapper, not Courier's (target/release/oshcc): by its absolute path.
  osh_cc=$(command -v oshcc); osh_run=$(command -v oshrun)
  if [ "$osh_cc" != "$root/target/release/oshcc" ] && "$osh_cc" -O2 -std=gnu11 "$here/fadd.c" -o "$bin/fadd-oshmem" >>"$log" 2>&1; then
    have_oshmem=1
  else
    note "building fadd against OSHMEM failed (see $log)"
  fi
fi

# The machine and the versions.
{
  echo "{\"section\": \"meta\", \"date\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\", \"host\": \"$(uname -srm)\","
  echo " \"cpu\": \"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')\", \"cores\": $(nproc),"
  echo " \"mem_gib\": $(awk '/MemTotal/ {printf "%d", $2 / 1048576}' /proc/meminfo), \"load\": \"$(cut -d' ' -f1-3 /proc/loadavg)\","
  echo " \"courier\": \"$("$courier" --version 2>/dev/null | head -1) ($(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown))\","
  echo " \"cc\": \"$(cc --version | head -1)\", \"oshmem\": \"$([ $have_oshmem = 1 ] && ompi_info --version 2>/dev/null | head -1 || echo none)\","
  echo " \"ucx\": \"$(dpkg-query -W -f='${Version}' libucx0 2>/dev/null || echo unknown)\", \"reps\": $REPS, \"quick\": $QUICK}"
} | tr -d '\n' >>"$raw"
echo >>"$raw"

perf() { # perf TLS ARGS...: the client's JSON line, both processes started here
  local tls=$1; shift
  local env=(-u COURIER_TLS)
  [ "$tls" = tcp ] && env=(COURIER_TLS=tcp)
  port=$((port + 1))
  env "${env[@]}" timeout 120 "$courier" perf -p "$port" >/dev/null 2>&1 &
  local srv=$!
  sleep 0.3
  env "${env[@]}" timeout 100 "$courier" perf 127.0.0.1 -p "$port" "$@" --json 2>>"$log" | tail -n 1
  wait "$srv" 2>/dev/null
}

tlsenv() { [ "$1" = tcp ] && echo COURIER_TLS=tcp || echo COURIER_TLS=all; }

# 1. Point-to-point atomics.
n_shm=200000; n_tcp=20000
[ "$QUICK" = 1 ] && { n_shm=20000; n_tcp=2000; }
note "1. courier perf ucp_fadd / ucp_add"
for rep in $(seq 1 "$REPS"); do
  for tls in shm tcp; do
    n=$n_shm; [ "$tls" = tcp ] && n=$n_tcp
    for t in ucp_fadd ucp_add; do
      for O in 1 16; do
        mems=(host,host host,nic); [ $((rep % 2)) = 0 ] && mems=(host,nic host,host)
        for mem in "${mems[@]}"; do
          j=$(perf "$tls" -t "$t" -m "$mem" -O "$O" -s 8 -n "$n")
          [ -n "$j" ] && emit "{\"section\": \"perf\", \"tls\": \"$tls\", \"rep\": $rep, \"test\": \"$t\", \"mem\": \"$mem\", \"window\": $O, \"json\": $j}"
        done
      done
    done
  done
done

# 2. Synchronizing put against payload size, and tag send/receive.
sizes=(1 2 4 8 16 32 64 128 256 512 1024 2048 4096 8192 16384 32768 65536)
sp_shm=2000; sp_tcp=500
[ "$QUICK" = 1 ] && { sp_shm=200; sp_tcp=50; sizes=(1 64 4096 65536); }
note "2. synchronizing put microbenchmark"
modes=(flag fenceflag signal sem)
for rep in $(seq 1 "$REPS"); do
  for tls in shm tcp; do
    it=$sp_shm; [ "$tls" = tcp ] && it=$sp_tcp
    k=$(( (rep - 1) % 4 ))
    for m in "${modes[@]:$k}" "${modes[@]:0:$k}"; do
      env "$(tlsenv "$tls")" timeout 600 "$oshrun" -np 2 "$bin/syncput" -m "$m" -s "${sizes[0]}" -S "${sizes[-1]}" -i "$it" 2>>"$log" |
        grep '^SYNCPUT' | while read -r line; do emit_line syncput "$tls" "$rep" "$line"; done
    done
    for s in "${sizes[@]}"; do
      j=$(perf "$tls" -t tag_lat -s "$s" -n $((it * 10)))
      [ -n "$j" ] && emit "{\"section\": \"tag\", \"tls\": \"$tls\", \"rep\": $rep, \"size\": $s, \"json\": $j}"
    done
  done
done

# 3. Contended fetch-add.
fa_it=100000; fa_slow=5000
[ "$QUICK" = 1 ] && { fa_it=10000; fa_slow=500; }
note "3. contended fetch-add (OSHMEM: $have_oshmem)"
for rep in $(seq 1 "$REPS"); do
  for np in 2 3 4 5 6 7 8; do
    for mem in heap global nic; do
      impls=(courier oshmem); [ $((rep % 2)) = 0 ] && impls=(oshmem courier)
      for impl in "${impls[@]}"; do
        if [ "$impl" = courier ]; then
          line=$(timeout 600 "$oshrun" -np "$np" "$bin/fadd" -m "$mem" -i "$fa_it" 2>>"$log" | grep '^FADD')
        else
          [ $have_oshmem = 1 ] || continue
          it=$fa_it; [ "$mem" = global ] && it=$fa_slow
          # OSHMEM's processes may crash in shmem_finalize after printing (see RESULTS.md):
          # the printed line, whose check passed, is the result.
          line=$(timeout 600 "$osh_run" --allow-run-as-root --oversubscribe -np "$np" "$bin/fadd-oshmem" -m "$mem" -i "$it" 2>>"$log" | grep '^FADD')
        fi
        [ -n "$line" ] && emit_line "fadd-$impl" shm "$rep" "$line"
      done
    done
  done
done

# 4. Applications.
declare -A size=([bcast]=8 [allreduce]=1 [spmv]=256 [cg]=128)
declare -A it_shm=([bcast]=2000 [allreduce]=2000 [spmv]=300 [cg]=100)
declare -A it_tcp=([bcast]=200 [allreduce]=200 [spmv]=100 [cg]=30)
if [ "$QUICK" = 1 ]; then
  it_shm=([bcast]=200 [allreduce]=200 [spmv]=30 [cg]=20)
  it_tcp=([bcast]=20 [allreduce]=20 [spmv]=10 [cg]=5)
fi
variants=(barrier flag signal)
app_run() { # app_run SECTION TLS REP NP APP VARIANT SIZE ITERS [launcher...]
  local section=$1 tls=$2 rep=$3 np=$4 app=$5 v=$6 sz=$7 it=$8; shift 8
  local line
  if [ $# -gt 0 ]; then
    line=$(timeout 600 "$@" "$bin/$app" -v "$v" -n "$sz" -i "$it" 2>>"$log" | grep '^RESULT')
    # Ranks that mpirun's agent started can outlive a launcher the time limit ended: end
    # them, by pid (only this command line of this build's binary: ours).
    local left
    left=$(pgrep -f "^$bin/$app -v $v -n $sz -i $it\$")
    if [ -n "$left" ]; then
      note "ending ranks left behind by a timed-out launcher: $left"
      for p in $left; do kill -KILL "$p" 2>/dev/null; done
    fi
  else
    line=$(env "$(tlsenv "$tls")" timeout 600 "$oshrun" -np "$np" "$bin/$app" -v "$v" -n "$sz" -i "$it" 2>>"$log" | grep '^RESULT')
  fi
  if [ -n "$line" ]; then emit_line "$section" "$tls" "$rep" "$line"
  else note "no result: $section $tls np=$np $app -v $v -n $sz"; fi
}
note "4a. applications against N"
for rep in $(seq 1 "$REPS"); do
  k=$(( (rep - 1) % 3 ))
  for tls in shm tcp; do
    for np in 2 4 8; do
      for app in bcast allreduce spmv cg; do
        it=${it_shm[$app]}; [ "$tls" = tcp ] && it=${it_tcp[$app]}
        for v in "${variants[@]:$k}" "${variants[@]:0:$k}"; do
          app_run apps-n "$tls" "$rep" "$np" "$app" "$v" "${size[$app]}" "$it"
        done
      done
    done
  done
done

note "4b. applications against problem size (N = 4, shm)"
declare -A sizes_of=([bcast]="8 512 8192 65536" [allreduce]="1 16 256 4096" [spmv]="128 256 512 1024" [cg]="64 128 256 512")
declare -A it_of=([bcast]=500 [allreduce]=500 [spmv]=50 [cg]=30)
[ "$QUICK" = 1 ] && it_of=([bcast]=50 [allreduce]=50 [spmv]=10 [cg]=5)
for rep in $(seq 1 "$REPS"); do
  k=$(( (rep - 1) % 3 ))
  for app in bcast allreduce spmv cg; do
    for sz in ${sizes_of[$app]}; do
      for v in "${variants[@]:$k}" "${variants[@]:0:$k}"; do
        app_run apps-size shm "$rep" 4 "$app" "$v" "$sz" "${it_of[$app]}"
      done
    done
  done
done

# 4c. Across two network-namespace hosts (as crates/courier-cli/tests/multihost.rs makes
# them): mpirun starts the PEs through an agent that enters the host's namespace.
netns_ok=0
if [ "${NETNS:-1}" = 1 ] && [ "$(id -u)" = 0 ] && command -v ip >/dev/null && command -v mpirun.openmpi >/dev/null; then
  id=$(( $$ % 200 + 20 ))
  sw="cjxs$id"; br="cjxb$id"; nsdir=$(mktemp -d)
  hostsfile="127.0.0.1 localhost"$'\n'
  cleanup_ns() {
    for i in 0 1; do ip netns del "cjxh${i}x$id" 2>/dev/null; rm -rf "/etc/netns/cjxh${i}x$id"; done
    ip netns del "$sw" 2>/dev/null; rm -rf "$nsdir"
  }
  trap cleanup_ns EXIT
  if ip netns add "$sw" && ip -n "$sw" link add "$br" type bridge && ip -n "$sw" link set "$br" up; then
    netns_ok=1
    for i in 0 1; do
      ns="cjxh${i}x$id"; hv="cj${id}xh$i"; sv="cj${id}xp$i"; addr="10.253.$id.$((i + 1))"
      ip netns add "$ns" && ip link add "$hv" type veth peer name "$sv" && ip link set "$hv" netns "$ns" &&
        ip link set "$sv" netns "$sw" && ip -n "$sw" link set "$sv" master "$br" && ip -n "$sw" link set "$sv" up &&
        ip -n "$ns" addr add "$addr/24" dev "$hv" && ip -n "$ns" link set "$hv" up && ip -n "$ns" link set lo up || netns_ok=0
      hostsfile+="$addr xh$i"$'\n'
    done
    for i in 0 1; do mkdir -p "/etc/netns/cjxh${i}x$id" && printf '%s' "$hostsfile" >"/etc/netns/cjxh${i}x$id/hosts"; done
    cat >"$nsdir/nsrsh" <<EOF
#!/bin/sh
# mpirun's remote-start agent for the namespace hosts.
while [ \$# -gt 0 ]; do case "\$1" in -*) shift ;; *) break ;; esac; done
host="\$1"; shift
case "\$host" in
  xh0) ns=cjxh0x$id ;;
  xh1) ns=cjxh1x$id ;;
  *) echo "agent: unknown host \$host" >&2; exit 255 ;;
esac
exec ip netns exec "\$ns" unshare --uts sh -c 'hostname "\$0" && exec sh -c "\$1"' "\$host" "\$*"
EOF
    chmod 755 "$nsdir/nsrsh"
  fi
  if [ $netns_ok = 1 ]; then
    note "4c. applications across two namespace hosts"
    for rep in $(seq 1 "$REPS"); do
      k=$(( (rep - 1) % 3 ))
      for np in 2 4 8; do
        per=$((np / 2))
        for app in bcast allreduce spmv cg; do
          for v in "${variants[@]:$k}" "${variants[@]:0:$k}"; do
            app_run apps-netns netns "$rep" "$np" "$app" "$v" "${size[$app]}" "${it_tcp[$app]}" \
              ip netns exec "cjxh0x$id" unshare --uts sh -c 'hostname xh0 && exec "$@"' sh \
              mpirun.openmpi --allow-run-as-root --oversubscribe -n "$np" --host "xh0:$per,xh1:$per" \
              --map-by slot --mca plm_rsh_agent "$nsdir/nsrsh"
          done
        done
      done
    done
  else
    note "4c. skipped: could not make the namespace hosts"
  fi
else
  note "4c. skipped: needs root, iproute2 and mpirun.openmpi (or NETNS=0)"
fi
emit "{\"section\": \"netns\", \"ran\": $netns_ok}"

note "done; writing apps/RESULTS.md"
python3 "$here/report.py" "$raw" "$here/RESULTS.md" "$out"
