#!/bin/bash
# Courier with CUDA device memory on a machine with an NVIDIA GPU: `courier perf` on device
# buffers, each row twice, and with OLD=<path of another courier binary> that binary
# beside it (old, new, old, new). Results in bench/GPU.md were taken with this script.
#   bash bench/gpu.sh [COURIER=target/release/courier] [OLD=...]
# Loopback rows run both sides in one process (-l); the 2proc rows start a server process.
set -u
cd "$(dirname "$0")/.."
COURIER=${COURIER:-target/release/courier}
bins=("$COURIER" "$COURIER")
[ -n "${OLD:-}" ] && bins=("$OLD" "$COURIER" "$OLD" "$COURIER")
nvidia-smi -L 2>/dev/null || echo "no nvidia-smi: the driver's device list follows from courier info"
"$COURIER" info -d | grep -A4 "Memory domain: cuda"
run() { # tls bin mem test size n w
    COURIER_TLS=$1 timeout 40 "$2" perf -l -t "$4" -m "$3" -s "$5" -n "$6" -w "$7" -f 2>&1 | tail -1
}
for tls in all tcp; do
    for m in cuda,cuda host,cuda cuda,host; do
        for ts in tag_lat:8:20000:1000 tag_bw:1048576:400:20 tag_bw:16777216:60:5 \
            ucp_put_bw:1048576:400:20 ucp_put_bw:16777216:60:5 ucp_get:16777216:60:5; do
            IFS=: read -r t s n w <<<"$ts"
            for b in "${bins[@]}"; do
                echo "$tls $m $t $s $b | $(run "$tls" "$b" "$m" "$t" "$s" "$n" "$w")"
            done
        done
    done
done
for ts in tag_lat:8:20000:1000 tag_bw:1048576:400:20 tag_bw:16777216:60:5; do
    IFS=: read -r t s n w <<<"$ts"
    echo "all host,host $t $s $COURIER | $(run all "$COURIER" host,host "$t" "$s" "$n" "$w")"
done
port=23456
for b in "${bins[@]}"; do
    for ts in ucp_put_bw:1048576 ucp_put_bw:16777216 ucp_get:16777216 tag_bw:1048576 tag_bw:16777216; do
        IFS=: read -r t s <<<"$ts"
        COURIER_TLS=all timeout 60 "$b" perf -p $port >/dev/null 2>&1 &
        sleep 0.5
        r=$(COURIER_TLS=all timeout 60 "$b" perf 127.0.0.1 -p $port -t "$t" -m cuda,cuda -s "$s" -n 400 -w 50 -f 2>&1 | tail -1)
        echo "2proc cuda,cuda $t $s $b | $r"
        wait
    done
done
