#!/usr/bin/env bash
# Installs the programs the tests start, from Debian's packages, when missing:
# redis-server (internal/redistest), etcd-server (internal/etcdtest: the etcd
# lock back end), postgresql and mariadb-server (internal/sqltest: the fence
# package's tests run on real servers), prometheus with promtool (internal/deploytest checks the
# alert rules and runs the dashboard queries) and chromium (cmd/lockstep
# opens the operator's page in headless Chromium). Jaeger (internal/jaegertest:
# the traces of the real binaries) has no Debian package: it is built from
# source once per machine, below.
set -euo pipefail

go="${GO:-go}"
jaeger_version=v1.75.0
jaeger_bin="${XDG_CACHE_HOME:-$HOME/.cache}/lockstep/jaeger-$jaeger_version/jaeger"
logs="$(mktemp -d)"

# Jaeger, cached in the user's cache directory (where internal/jaegertest's
# BinaryPath looks; keep the version equal to jaegertest.Version). `go install
# ...@version` is refused because Jaeger's go.mod has replace directives, so a
# scratch module requires it as a tool and builds it: about 5 minutes on 2
# cores, once; a 121 MB binary. It is built under a temporary name and renamed,
# so an interrupted build leaves no binary that looks whole.
build_jaeger() {
	mkdir -p "$(dirname "$jaeger_bin")"
	scratch="$(mktemp -d)"
	trap 'rm -rf "$scratch" "$jaeger_bin.tmp.$$" "$jaeger_bin.building"' EXIT
	(
		cd "$scratch"
		"$go" mod init lockstep.invalid/jaeger-build >/dev/null 2>&1
		"$go" get -tool "github.com/jaegertracing/jaeger/cmd/jaeger@$jaeger_version"
		"$go" build -o "$jaeger_bin.tmp.$$" github.com/jaegertracing/jaeger/cmd/jaeger
	)
	mv -f "$jaeger_bin.tmp.$$" "$jaeger_bin"
}

# What needs the network or the CPU runs side by side on a fresh machine: the
# Jaeger build, the modules of this repository and of examples/ (go mod
# download) and the oldest Go toolchain that go.mod declares (make test
# builds the library packages with it) start in the background while apt
# installs the servers, and the script waits for all of them.
pids=()
names=()
trap 'kill "${pids[@]}" 2>/dev/null || true; rm -rf "$logs"' EXIT
bg() {
	local name=$1
	shift
	"$@" >"$logs/$name.log" 2>&1 &
	pids+=($!)
	names+=("$name")
}
# Jaeger builds at the lowest priority and is not waited for: the tests that
# need it (internal/jaegertest's Start) wait while its pid is in
# $jaeger_bin.building, and the others run meanwhile, the build taking only
# the CPU they leave idle. JAEGER_WAIT=1 waits for it here.
if [ ! -x "$jaeger_bin" ]; then
	building=""
	[ -s "$jaeger_bin.building" ] && kill -0 "$(cat "$jaeger_bin.building")" 2>/dev/null && building=1
	if [ -n "$building" ]; then
		echo "deps: jaeger $jaeger_version is being built (pid $(cat "$jaeger_bin.building"))"
	else
		echo "deps: building jaeger $jaeger_version into $jaeger_bin in the background at nice 19 (once per machine, about 5 minutes of 2 cores; log: $jaeger_bin.build.log)"
		mkdir -p "$(dirname "$jaeger_bin")"
		export go jaeger_bin jaeger_version
		setsid nohup nice -n 19 bash -c "set -euo pipefail; $(declare -f build_jaeger); build_jaeger" \
			>"$jaeger_bin.build.log" 2>&1 </dev/null &
		echo $! >"$jaeger_bin.building"
	fi
	if [ "${JAEGER_WAIT:-}" = 1 ]; then
		while kill -0 "$(cat "$jaeger_bin.building" 2>/dev/null || echo 0)" 2>/dev/null; do sleep 2; done
		[ -x "$jaeger_bin" ] || { echo "deps: the jaeger build failed:"; tail -n 40 "$jaeger_bin.build.log"; exit 1; }
	fi
fi
bg modules "$go" mod download
for m in examples/*/go.mod; do
	[ -e "$m" ] || continue
	bg "modules-$(basename "$(dirname "$m")")" sh -c "cd '$(dirname "$m")' && '$go' mod download"
done
go_min="$(awk '$1 == "go" { print $2; exit }' go.mod)"
bg toolchain env GOTOOLCHAIN="go$go_min" "$go" version

need=()
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
command -v etcd >/dev/null 2>&1 || need+=(etcd-server)
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
	need+=(prometheus)
fi
command -v chromium >/dev/null 2>&1 || need+=(chromium)
# Debian keeps PostgreSQL's server programs off PATH, under its version.
if ! command -v initdb >/dev/null 2>&1 && ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then
	need+=(postgresql)
fi
if ! command -v mariadbd >/dev/null 2>&1 && [ ! -x /usr/sbin/mariadbd ]; then
	need+=(mariadb-server)
fi

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
	# Likewise PostgreSQL on :5432 and MariaDB on :3306 (a cluster the
	# package creates and starts): internal/sqltest starts private servers.
	for svc in postgresql mariadb; do
		pkg=$svc
		[ "$svc" = mariadb ] && pkg=mariadb-server
		[[ " ${need[*]} " == *" $pkg "* ]] || continue
		if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet "$svc" 2>/dev/null; then
			echo "deps: stopping and disabling the $svc service the package started"
			$sudo systemctl disable --now "$svc" >/dev/null 2>&1 || true
		elif command -v service >/dev/null 2>&1 && service "$svc" status >/dev/null 2>&1; then
			# Without systemd (a container) the package starts it through its init script.
			echo "deps: stopping the $svc service the package started"
			$sudo service "$svc" stop >/dev/null 2>&1 || true
		fi
	done
fi


failed=0
for i in "${!pids[@]}"; do
	if ! wait "${pids[$i]}"; then
		echo "deps: ${names[$i]} failed:"
		tail -n 40 "$logs/${names[$i]}.log"
		failed=1
	fi
done
[ "$failed" -eq 0 ] || exit 1

redis-server --version
# sed, not head: head exits after one line, and the version command's next
# write then dies of SIGPIPE, which pipefail turns into a failed make test.
etcd --version 2>&1 | sed -n 1p
promtool --version 2>&1 | sed -n 1p
chromium --version 2>/dev/null || true
pg_bin="$(command -v postgres 2>/dev/null || ls -d /usr/lib/postgresql/*/bin/postgres 2>/dev/null | sort -V | tail -n 1)"
"$pg_bin" --version
"$(command -v mariadbd 2>/dev/null || echo /usr/sbin/mariadbd)" --version
# `jaeger version` is empty without Jaeger's own release flags: the module
# version comes from the binary's build information instead.
if [ -x "$jaeger_bin" ]; then
	"$go" version -m "$jaeger_bin" | awk -v bin="$jaeger_bin" '($1 == "mod" || $1 == "dep") && $2 == "github.com/jaegertracing/jaeger" { print "jaeger " $3 " (" bin ")" }'
else
	echo "jaeger $jaeger_version: building in the background ($jaeger_bin.build.log)"
fi
