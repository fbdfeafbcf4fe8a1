#!/bin/bash
# The image's HEALTHCHECK: GET /readyz over bash's /dev/tcp, so the image needs no curl or wget
# (bash is in every Debian base; one less tool for an agent's shell to reach the network with).
# Healthy (exit 0) only on a 200; otherwise exit 1 and print the status line and body, which
# `docker inspect` / `podman healthcheck run` show (the body names the failed check).
#
#   ACP_GATEWAY_HEALTHCHECK_PATH  /readyz (default) or /healthz (liveness only)
#   ACP_GATEWAY_HEALTHCHECK_ADDR  host:port to ask; default ACP_GATEWAY_LISTEN, a wildcard
#                                 address (0.0.0.0, [::]) asked on loopback
set -u
path=${ACP_GATEWAY_HEALTHCHECK_PATH:-/readyz}
addr=${ACP_GATEWAY_HEALTHCHECK_ADDR:-${ACP_GATEWAY_LISTEN:-127.0.0.1:8080}}
port=${addr##*:}
host=${addr%:*}
host=${host#[}
host=${host%]}
case $host in
  "" | 0.0.0.0) host=127.0.0.1 ;;
  :: | ::0) host=::1 ;;
esac
if ! exec 3<>"/dev/tcp/$host/$port"; then
  echo "cannot connect to $host:$port"
  exit 1
fi
printf 'GET %s HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n' "$path" >&3
status=
IFS= read -r -t 4 status <&3
status=${status%$'\r'}
case $status in
  "HTTP/1."?" 200 "*) exit 0 ;;
esac
rest=
IFS= read -r -t 2 -d '' rest <&3
echo "${status:-no answer from $host:$port$path}"
printf '%s\n' "${rest##*$'\r\n\r\n'}"
exit 1
