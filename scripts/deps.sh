#!/usr/bin/env bash
# Installs the programs the tests start, from Debian's packages, when missing:
# redis-server (internal/redistest), etcd-server (internal/etcdtest: the etcd
# lock back end), prometheus with promtool (internal/deploytest checks the
# alert rules and runs the dashboard queries) and chromium (cmd/lockstep
# opens the operator's page in headless Chromium).
set -euo pipefail

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
	need+=(prometheus)
fi
command -v chromium >/dev/null 2>&1 || need+=(chromium)

if [ ${#need[@]} -gt 0 ]; then
	sudo=""
	[ "$(id -u)" -eq 0 ] || sudo="sudo"
	echo "deps: installing ${need[*]}"
	$sudo apt-get update -qq
	# No recommends: prometheus would pull in prometheus-node-exporter.
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
	# The package starts a system Prometheus on :9090 where systemd runs; the
	# tests start their own, and :9090 is the worker's default metrics port.
	if [[ " ${need[*]} " == *" prometheus "* ]] && command -v systemctl >/dev/null 2>&1 &&
		systemctl is-active --quiet prometheus 2>/dev/null; then
		echo "deps: stopping and disabling the prometheus service the package started"
		$sudo systemctl disable --now prometheus >/dev/null 2>&1 || true
	fi
	# Likewise etcd on :2379: the tests start their own members on free ports.
	if [[ " ${need[*]} " == *" etcd-server "* ]] && command -v systemctl >/dev/null 2>&1 &&
		systemctl is-active --quiet etcd 2>/dev/null; then
		echo "deps: stopping and disabling the etcd service the package started"
		$sudo systemctl disable --now etcd >/dev/null 2>&1 || true
	fi
fi
redis-server --version
# sed, not head: head exits after one line, and the version command's next
# write then dies of SIGPIPE, which pipefail turns into a failed make test.
etcd --version 2>&1 | sed -n 1p
promtool --version 2>&1 | sed -n 1p
chromium --version 2>/dev/null || true
