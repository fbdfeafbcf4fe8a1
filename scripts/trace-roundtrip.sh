#!/usr/bin/env bash
# Where a round trip's microseconds go: runs the latency section of the gateway benchmark
# (benches/gateway.rs, SQLite) and, one second into it, records the system calls of every thread
# on the machine for one second with perf (its own excluded), then splits each of the gateway's and
# the bare relay's round trips into its steps (scripts/roundtrip_trace.py). Needs root and perf.
# The tracing slows every path alike (a system call costs a few µs more): read the steps against
# each other and against the relay's, not against the benchmark's own figures.
# Usage: bash scripts/trace-roundtrip.sh        (build first: cargo bench --bench gateway --no-run)
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/trace
mkdir -p "$out"
bin=$(ls -t target/release/deps/gateway-* 2>/dev/null | grep -v '\.d$' | head -1)
[ -n "$bin" ] || { echo "no benchmark binary in target/release/deps: cargo bench --bench gateway --no-run" >&2; exit 1; }
BENCH_ONLY=latency BENCH_ROUNDS=${BENCH_ROUNDS:-10} "$bin" --bench >"$out/bench.txt" 2>&1 &
bench=$!
trap 'kill $bench 2>/dev/null || true' EXIT
sleep "${TRACE_AFTER:-4}"  # the gateway and the peers started, the warm-up done: the timed blocks run
ls -l "/proc/$bench/fd" >"$out/fds.txt"
events=""
for s in read write sendto recvfrom pwrite64 epoll_wait futex; do
  events="$events -e syscalls:sys_enter_$s --filter common_pid!=\$\$ -e syscalls:sys_exit_$s --filter common_pid!=\$\$"
done
sh -c "exec perf record -q -a $events -o $out/perf.data -- sleep 1" 2>/dev/null
wait $bench
trap - EXIT
grep -E '^(direct|relay|gateway|websocketd) ' "$out/bench.txt" || true
perf script -i "$out/perf.data" -F comm,tid,time,event,trace 2>/dev/null >"$out/script.txt"
python3 scripts/roundtrip_trace.py "$out/fds.txt" "$out/script.txt"
