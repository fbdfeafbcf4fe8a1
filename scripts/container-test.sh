#!/usr/bin/env bash
# The container and Kubernetes test (docs/operations.md, "Containers and Kubernetes"):
#  1. deploy/kubernetes validated against the Kubernetes schemas (kubernetes-validate, offline);
#  2. the image built with podman from the Dockerfile, its runtime stage fed the host's
#     binary (no Rust compile in a container, no registry: the Debian base is made here with
#     debootstrap and cached);
#  3. run as an operator would (--init, host network, read-only root, no capabilities, the
#     demo agent as ACP_GATEWAY_AGENT): healthy by its own HEALTHCHECK, non-root, bubblewrap
#     working where the container allows it and `auto` falling back where it does not, a prompt
#     driven over a real WebSocket, SIGTERM during a stream drained within the grace period with
#     no process left, and the transcript on the data volume replayed by a new container.
# Run by scripts/test.sh; alone: `bash scripts/container-test.sh`. Needs root (or sudo) for
# podman. Where podman cannot be installed or cannot run, it says "skipped: <reason>" and exits 0
# (ACP_CONTAINER_TEST=require makes that a failure; ACP_CONTAINER_TEST=skip skips it all).
#
# Environment: ACP_CONTAINER_CACHE (default ~/.cache/acp-gateway/container: podman's storage,
# the base image, the validator's virtualenv), ACP_CONTAINER_STOP_TIMEOUT (podman stop -t, default
# 25: the gateway's drain_grace_secs and shutdown_grace_secs are 10 each), ACP_CONTAINER_PROFILE
# (dist, default: the binary the image ships, as the Dockerfile builds it; release: cargo's
# default codegen; debug: the one the other tests built, a full optimised build less on a fresh
# machine).
set -euo pipefail
cd "$(dirname "$0")/.."

started=$(date +%s.%N)
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
mode=${ACP_CONTAINER_TEST:-auto}
skip() {
  if [ "$mode" = require ]; then echo "container test: cannot run: $*" >&2; exit 1; fi
  echo "== container test skipped: $*"
  exit 0
}
[ "$mode" = skip ] && skip "ACP_CONTAINER_TEST=skip"

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi; }
apt_install() {
  command -v apt-get >/dev/null || return 1
  as_root apt-get update -qq >/dev/null || return 1
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

cache=${ACP_CONTAINER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/acp-gateway/container}
stop_timeout=${ACP_CONTAINER_STOP_TIMEOUT:-25}
mkdir -p "$cache"
work=$(mktemp -d)
containers=()
volumes=()
bg_pids=()
failed=1

pm() { as_root env CONTAINERS_CONF="$cache/containers.conf" CONTAINERS_STORAGE_CONF="$cache/storage.conf" podman "$@"; }

cleanup() {
  local rc=$?
  set +e
  for pid in "${bg_pids[@]}"; do kill "$pid" 2>/dev/null; done
  for c in "${containers[@]}"; do
    if [ "$failed" = 1 ] && [ "$rc" != 0 ]; then
      echo "--- logs of $c (last 30 lines)" >&2
      pm logs "$c" 2>&1 | tail -30 | sed 's/\x1b\[[0-9;]*m//g' >&2
    fi
    pm rm -f -t 0 -v "$c" >/dev/null 2>&1
  done
  for v in "${volumes[@]}"; do pm volume rm -f "$v" >/dev/null 2>&1; done
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
die() { echo "container test FAILED: $*" >&2; exit 1; }

# ---- 1. Kubernetes manifests (needs no podman)
echo "== Kubernetes manifests (kubernetes-validate)"
venv=$cache/venv
if ! "$venv/bin/python" -c 'import kubernetes_validate' 2>/dev/null; then
  rm -rf "$venv"
  python3 -m venv "$venv" || die "cannot make a virtualenv (python3-venv)"
  "$venv/bin/pip" install -q --disable-pip-version-check 'kubernetes-validate==1.37.0' || die "cannot install kubernetes-validate"
fi
"$venv/bin/python" deploy/kubernetes/validate.py > "$work/validate.log" 2>&1 || { cat "$work/validate.log"; die "manifests"; }
grep -c '^ok' "$work/validate.log" | xargs -I{} echo "{} checks passed, broken manifests rejected"

# ---- 2. podman
if ! command -v podman >/dev/null || ! command -v debootstrap >/dev/null || ! command -v runc >/dev/null; then
  [ "$(id -u)" = 0 ] || sudo -n true 2>/dev/null || skip "podman is not installed and there is no root or sudo to install it"
  echo "== installing podman, runc, debootstrap"
  apt_install podman runc catatonit debootstrap uidmap || skip "cannot install podman (apt-get install podman runc debootstrap failed)"
fi
[ "$(id -u)" = 0 ] || sudo -n true 2>/dev/null || skip "podman here needs root or passwordless sudo"
nofile=$(ulimit -Hn)
[ "$nofile" = unlimited ] && nofile=65536
[ "$nofile" -gt 65536 ] && nofile=65536
cat > "$cache/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=32768:32768"]
[engine]
runtime = "runc"
EOF
cat > "$cache/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$cache/storage"
runroot = "${XDG_RUNTIME_DIR:-/run}/acp-gateway-container-$(printf %s "$cache" | md5sum | cut -c1-8)"
EOF
pm info >/dev/null 2>"$work/podman-info.err" || skip "podman does not run here: $(tail -1 "$work/podman-info.err")"

# One run at a time per cache (they share podman's storage).
exec 9>"$cache/lock"
flock -w 900 9 || die "another container test holds $cache/lock"

# ---- 3. the Debian base image, made once with debootstrap (no registry here)
codename=$(sed -n 's/^VERSION_CODENAME=//p' /etc/os-release 2>/dev/null)
codename=${codename:-bookworm}
base=localhost/debian:$codename-slim
if pm image exists "$base"; then
  echo "== base image $base: reused"
  base_how="reused"
else
  echo "== base image $base: debootstrap (once)"
  t=$(date +%s.%N)
  sources=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null || true)
  mirror=$(printf '%s\n' "$sources" | grep -v security | sed -n -E 's/^(deb |URIs: )(\[[^]]*\] )?(https?:[^ ]+).*/\3/p' | head -1)
  security=$(printf '%s\n' "$sources" | grep security | sed -n -E 's/^(deb |URIs: )(\[[^]]*\] )?(https?:[^ ]+).*/\3/p' | head -1)
  mirror=${mirror:-http://deb.debian.org/debian}
  security=${security:-http://deb.debian.org/debian-security}
  rootfs=$cache/rootfs.tmp
  as_root rm -rf "$rootfs"
  timeout 900 env DEBIAN_FRONTEND=noninteractive debootstrap --variant=minbase "$codename" "$rootfs" "$mirror" \
    > "$work/debootstrap.log" 2>&1 || { tail -20 "$work/debootstrap.log"; skip "debootstrap $codename from $mirror failed"; }
  # Slim like the official debian:*-slim: no docs, man pages or locales, now or in later installs.
  as_root tee "$rootfs/etc/dpkg/dpkg.cfg.d/slim" >/dev/null <<'EOF'
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/lintian/*
path-exclude /usr/share/locale/*
EOF
  printf 'deb %s %s main\ndeb %s %s-updates main\ndeb %s %s-security main\n' \
    "$mirror" "$codename" "$mirror" "$codename" "$security" "$codename" | as_root tee "$rootfs/etc/apt/sources.list" >/dev/null
  as_root sh -c "cd '$rootfs' && rm -rf var/lib/apt/lists/* var/cache/apt/*.bin var/cache/apt/archives/*.deb var/log/*.log \
    usr/share/man/* usr/share/info/* usr/share/locale/* && find usr/share/doc -mindepth 2 ! -name copyright -delete 2>/dev/null; true"
  as_root tar -C "$rootfs" -c . | pm import - "$base" >/dev/null 2>&1
  as_root rm -rf "$rootfs"
  base_how="made in $(since "$t") s"
  echo "   $base_how"
fi
pm run --rm --no-healthcheck "$base" true 2>"$work/probe.err" || skip "podman cannot run a container here: $(grep -v systemd "$work/probe.err" | tail -1)"

# ---- 4. the image, from the host's binary
profile=${ACP_CONTAINER_PROFILE:-dist}
case $profile in
  dist) profile_flag=(--profile dist) ;;
  release) profile_flag=(--release) ;;
  debug) profile_flag=() ;;
  *) die "ACP_CONTAINER_PROFILE is dist, release or debug, not $profile" ;;
esac
echo "== cargo build (${profile})"
t=$(date +%s.%N)
cargo build "${profile_flag[@]}" --locked --quiet --bin acp-gateway
cargo_secs=$(since "$t")
mkdir -p "$work/prebuilt"
if command -v objcopy >/dev/null; then
  objcopy --strip-debug "target/$profile/acp-gateway" "$work/prebuilt/acp-gateway"
else
  cp "target/$profile/acp-gateway" "$work/prebuilt/acp-gateway"
fi
image=localhost/acp-gateway:container-test
old_image=$(pm image inspect --format '{{.Id}}' "$image" 2>/dev/null || true)
echo "== podman build (runtime stage, binary from the host)"
t=$(date +%s.%N)
as_root timeout 900 env CONTAINERS_CONF="$cache/containers.conf" CONTAINERS_STORAGE_CONF="$cache/storage.conf" \
  podman build --format docker --layers -t "$image" --target runtime-prebuilt \
  --build-arg DEBIAN_IMAGE="$base" \
  --build-context prebuilt="$work/prebuilt" . > "$work/build.log" 2>&1 || { tail -30 "$work/build.log"; die "podman build"; }
build_secs=$(since "$t")
new_image=$(pm image inspect --format '{{.Id}}' "$image")
if [ -n "$old_image" ] && [ "$old_image" != "$new_image" ]; then pm rmi "$old_image" >/dev/null 2>&1 || true; fi
pm image prune -f --filter until=168h >/dev/null 2>&1 || true
size=$(pm image inspect --format '{{.Size}}' "$image")
size_mb=$((size / 1000000))
user=$(pm image inspect --format '{{.Config.User}}' "$image")
health=$(pm image inspect --format '{{json .Config.Healthcheck}}' "$image")
vols=$(pm image inspect --format '{{json .Config.Volumes}}' "$image")
echo "   built in $build_secs s, $size_mb MB, user $user, volume $vols"
[[ "$user" =~ ^[1-9][0-9]*(:[0-9]+)?$ ]] || die "the image's USER is $user, expected a numeric non-root uid"
[[ "$health" == *acp-gateway-healthcheck* ]] || die "no HEALTHCHECK in the image: $health"
[[ "$vols" == *'/var/lib/acp-gateway/data'* ]] || die "no VOLUME for the data directory: $vols"

# ---- 5. run it
python=python3
$python -c 'import websockets' 2>/dev/null || $python -m pip install -q websockets
free_port() { $python -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
secret=$(head -c 32 /dev/urandom | base64)
agent="/usr/local/bin/acp-gateway demo-agent --chunks 5 --delay-us 2000"
# The Kubernetes manifests' own gateway.toml files: the base's (sandbox = "bwrap": the gateway
# refuses to start without it) and the single-tenant overlay's (sandbox = "none"); and the base's
# with the image's default, "auto", which without a working bubblewrap serves one user only.
"$venv/bin/python" - "$work" <<'EOF'
import sys, yaml
for name, path in [("bwrap", "deploy/kubernetes/configmap.yaml"), ("none", "deploy/kubernetes/single-tenant/configmap-patch.yaml")]:
    text = yaml.safe_load(open(path))["data"]["gateway.toml"]
    assert f'sandbox = "{name}"' in text, (path, text)
    open(f"{sys.argv[1]}/gateway-{name}.toml", "w").write(text)
    if name == "bwrap":
        open(f"{sys.argv[1]}/gateway-auto.toml", "w").write(text.replace('sandbox = "bwrap"', 'sandbox = "auto"'))
EOF
chmod 0644 "$work"/gateway-*.toml
chmod 0755 "$work"
suffix=$$-$RANDOM
data_volume=acpgw-test-data-$suffix
pm volume create "$data_volume" >/dev/null
volumes+=("$data_volume")

# run NAME PORT CONFIG [podman options]: a container as in production: read-only root, no
# capabilities, no privilege escalation, --init, host network.
run() {
  local name=$1 port=$2 config=$3
  shift 3
  containers+=("$name")
  pm run -d --name "$name" --init --network=host \
    --read-only --tmpfs /tmp --cap-drop ALL --security-opt no-new-privileges \
    -v "$work/gateway-$config.toml:/etc/acp-gateway/gateway.toml:ro" \
    -e ACP_GATEWAY_LISTEN="127.0.0.1:$port" -e ACP_GATEWAY_JWT_SECRET="$secret" -e ACP_GATEWAY_AGENT="$agent" \
    "$@" "$image" serve --config /etc/acp-gateway/gateway.toml > /dev/null 2>>"$work/podman-run.err" \
    || { grep -v systemd "$work/podman-run.err" >&2; die "podman run $name"; }
}
# wait_healthy NAME: polls the image's own HEALTHCHECK (no systemd here to run its timer).
wait_healthy() {
  local deadline=$((SECONDS + 60))
  until pm healthcheck run "$1" >/dev/null 2>&1; do
    [ "$(pm inspect --format '{{.State.Running}}' "$1")" = true ] || die "$1 exited: $(pm logs "$1" 2>&1 | tail -3)"
    [ $SECONDS -lt $deadline ] || die "$1 not healthy within 60 s"
    sleep 0.2
  done
  [ "$(pm inspect --format '{{.State.Health.Status}}' "$1")" = healthy ] || die "$1: podman does not record it healthy"
}
readyz() { $python -c 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode())' "http://127.0.0.1:$1/readyz"; }
# readyz_status PORT: /readyz's status code, or "down" when nothing answers.
readyz_status() {
  $python - "http://127.0.0.1:$1/readyz" <<'EOF'
import sys, urllib.error, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=2).status)
except urllib.error.HTTPError as e:
    print(e.code)
except OSError:
    print("down")
EOF
}

echo "== run: sandboxed (unmask=/proc/*, sandbox = \"bwrap\") and restricted (defaults, sandbox = \"auto\")"
port_a=$(free_port)
port_b=$(free_port)
main=acpgw-test-main-$suffix
restricted=acpgw-test-restricted-$suffix
t=$(date +%s.%N)
run "$main" "$port_a" bwrap -v "$data_volume:/var/lib/acp-gateway/data" --security-opt 'unmask=/proc/*'
run "$restricted" "$port_b" auto
wait_healthy "$main"
healthy_secs=$(since "$t")
wait_healthy "$restricted"
echo "   healthy (HEALTHCHECK) $healthy_secs s after podman run"
ready_a=$(readyz "$port_a")
ready_b=$(readyz "$port_b")
[[ "$ready_a" == *'"warnings":[]'* ]] || die "sandboxed container: /readyz warns: $ready_a"
[[ "$ready_a" == *'"sandbox":{"default":"bwrap"}'* ]] || die "sandboxed container: /readyz does not say bwrap: $ready_a"
[[ "$ready_b" == *'serves one user only'* && "$ready_b" == *'"default":"single-user'* ]] || die "restricted container: /readyz does not say it serves one user only: $ready_b"
echo "   the Kubernetes base's config runs sandboxed (/readyz: bwrap); sandbox \"auto\" without bubblewrap serves one user only, /readyz 200 with the warning"

echo "== run as most people first will: the image's defaults, only ACP_GATEWAY_WORKSPACE_ROOTS=/tmp and a port"
# Non-root, so the gateway cannot change /tmp (and must not try: it is not its own); a root it
# could not use would be named in /readyz, never a reason to fail.
first=acpgw-test-first-$suffix
port_c=$(free_port)
containers+=("$first")
pm run -d --name "$first" --init -p "127.0.0.1:$port_c:8080" -e ACP_GATEWAY_WORKSPACE_ROOTS=/tmp "$image" \
  > /dev/null 2>>"$work/podman-run.err" || { grep -v systemd "$work/podman-run.err" >&2; die "podman run $first"; }
t=$(date +%s.%N)
wait_healthy "$first"
ready_c=$(readyz "$port_c")
[[ "$ready_c" != *'workspace root'* ]] || die "first-run container: /tmp named as unusable: $ready_c"
[ "$(pm exec "$first" stat -c %a /tmp)" = 1777 ] || die "first-run container: /tmp's mode changed"
# Only the sandbox's fallback may warn (this container does not allow bubblewrap).
first_warnings=$(pm logs "$first" 2>&1 | grep ' WARN ' | grep -v 'bubblewrap does not work' || true)
[ -z "$first_warnings" ] || die "first-run container: a normal start logged a warning: $first_warnings"
echo "   healthy $(since "$t") s after podman run -p $port_c:8080 -e ACP_GATEWAY_WORKSPACE_ROOTS=/tmp; /tmp still 1777"
pm stop -t "$stop_timeout" "$first" > /dev/null 2>>"$work/podman-run.err"

uid=$(pm exec "$main" id -u)
[ "$uid" != 0 ] || die "the gateway runs as root"
token=$(pm exec "$main" acp-gateway token --sub alice)

echo "== prompt over WebSocket (demo agent, permission round trip)"
state=$work/state.json
client() { timeout 60 $python deploy/container/smoke_client.py "ws://127.0.0.1:$1/acp" "$token" "$2" "$state" > "$work/$2.out" 2>&1; }
client "$port_a" prompt || { cat "$work/prompt.out"; die "prompt"; }
sed 's/^/   /' "$work/prompt.out"

echo "== SIGTERM while streaming (podman stop -t $stop_timeout)"
mark=$work/streaming
timeout 120 $python deploy/container/smoke_client.py "ws://127.0.0.1:$port_a/acp" "$token" stream "$state" "$mark" \
  > "$work/stream.out" 2>&1 &
stream_pid=$!
bg_pids+=("$stream_pid")
deadline=$((SECONDS + 30))
until [ -e "$mark" ]; do
  kill -0 "$stream_pid" 2>/dev/null || { cat "$work/stream.out"; die "the streaming client ended early"; }
  [ $SECONDS -lt $deadline ] || die "the long prompt did not start streaming"
  sleep 0.1
done
# Every process of the container, by host PID, while an agent streams.
pm top "$main" huser hpid args > "$work/top.txt"
sed 's/^/   /' "$work/top.txt"
awk 'NR > 1 && ($1 == "0" || $1 == "root") { bad = 1 } END { exit bad }' "$work/top.txt" || die "a process runs as root"
grep -q 'acp-gateway serve' "$work/top.txt" || die "no gateway process in podman top"
if ! grep -q 'bwrap' "$work/top.txt" || ! grep -q 'demo-agent' "$work/top.txt"; then die "no sandboxed agent process in podman top"; fi
hpids=$(awk 'NR > 1 { print $2 }' "$work/top.txt")
t=$(date +%s.%N)
pm stop -t "$stop_timeout" "$main" > /dev/null 2>>"$work/podman-run.err" &
stop_pid=$!
bg_pids+=("$stop_pid")
# Draining, the gateway still answers: /readyz must say 503 so balancers stop sending.
draining_status=
while kill -0 "$stop_pid" 2>/dev/null; do
  draining_status=$(readyz_status "$port_a")
  [ "$draining_status" = 200 ] || break
  sleep 0.1
done
wait "$stop_pid" || die "podman stop $main failed"
drain_secs=$(since "$t")
[ "$draining_status" = 503 ] || die "/readyz answered $draining_status while draining, expected 503"
wait "$stream_pid" || { cat "$work/stream.out"; die "the streaming client"; }
sed 's/^/   /' "$work/stream.out"
exit_code=$(pm inspect --format '{{.State.ExitCode}}' "$main")
[ "$exit_code" = 0 ] || die "the gateway exited with $exit_code after SIGTERM (137: killed after the grace period)"
awk -v d="$drain_secs" -v g="$stop_timeout" 'BEGIN { exit !(d < g) }' || die "stop took $drain_secs s, the whole grace period"
for pid in $hpids; do
  if [ -e "/proc/$pid" ] && grep -qaE 'acp-gateway|bwrap|tini|podman-init|catatonit' "/proc/$pid/cmdline" 2>/dev/null; then
    die "process $pid ($(tr '\0' ' ' < "/proc/$pid/cmdline")) outlived the container"
  fi
done
logs=$(pm logs "$main" 2>&1 | sed 's/\x1b\[[0-9;]*m//g')
grep -q 'did not finish within the grace period\|could not flush' <<<"$logs" && die "the gateway did not drain in time: $(grep grace <<<"$logs")"
grep -q 'acp_gateway::app: stopped' <<<"$logs" || die "no 'stopped' in the gateway's log"
echo "   drained: /readyz 503 at once, exited 0 in $drain_secs s (stop timeout $stop_timeout s), none of its $(wc -w <<<"$hpids") processes left"
t=$(date +%s.%N)
pm stop -t "$stop_timeout" "$restricted" > /dev/null 2>>"$work/podman-run.err"
[ "$(pm inspect --format '{{.State.ExitCode}}' "$restricted")" = 0 ] || die "the restricted container exited non-zero"
echo "   restricted container: exited 0 in $(since "$t") s"

echo "== a new container on the same data volume replays the transcript"
again=acpgw-test-again-$suffix
t=$(date +%s.%N)
run "$again" "$port_a" bwrap -v "$data_volume:/var/lib/acp-gateway/data" --security-opt 'unmask=/proc/*'
wait_healthy "$again"
echo "   healthy in $(since "$t") s"
client "$port_a" load || { cat "$work/load.out"; die "load"; }
sed 's/^/   /' "$work/load.out"
pm stop -t "$stop_timeout" "$again" > /dev/null 2>>"$work/podman-run.err"
[ "$(pm inspect --format '{{.State.ExitCode}}' "$again")" = 0 ] || die "the second container exited non-zero"

failed=0
echo "== container test passed in $(since "$started") s: base image $base_how; cargo build ($profile) $cargo_secs s;" \
  "image build $build_secs s, $size_mb MB; healthy $healthy_secs s after run; drained in $drain_secs s"
