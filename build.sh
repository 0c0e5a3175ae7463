#!/usr/bin/env bash
# build.sh - the one entry point: installs what is missing, builds, tests,
# runs the demo and the benchmarks.
#
#   ./build.sh demo     embedded local feed + a Pool receiving from it
#   ./build.sh test     everything CI runs (both TLS backends, race, C sanitizers, fuzz smoke)
#   ./build.sh bench    the side-by-side benchmark; rewrites docs/BENCH.md and the plots
#   ./build.sh fuzz     the C fuzzers for FUZZ_SECONDS each (default 600)
#   ./build.sh build    go build ./... and the CLI into build/talaris
set -euo pipefail
cd "$(dirname "$0")"

DEB_PKGS=(liburing-dev android-libboringssl-dev libssl-dev openssl clang libclang-rt-14-dev make gcc)

as_root() {
	if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

# install_packages runs apt-get update and installs the Debian packages the
# C core, its tests and fuzzers need (a no-op install when present).
install_packages() {
	local missing=()
	for p in "${DEB_PKGS[@]}"; do
		dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
	done
	if [ "${1:-}" = always ] || [ ${#missing[@]} -gt 0 ]; then
		echo "== apt-get install ${DEB_PKGS[*]}"
		as_root apt-get update -qq
		DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${DEB_PKGS[@]}" >/dev/null
	fi
}

# install_node_ws puts Node's ws module in build/node for the interop tests.
install_node_ws() {
	if command -v npm >/dev/null 2>&1 && [ ! -d build/node/node_modules/ws ]; then
		echo "== npm install ws (interop peer)"
		mkdir -p build/node
		(cd build/node && npm install --no-audit --no-fund --silent ws@8 >/dev/null 2>&1) ||
			echo "npm install ws failed: the Node interop test will skip"
	fi
}

# install_python_websockets installs Python's websockets for interop tests.
install_python_websockets() {
	if command -v python3 >/dev/null 2>&1 && ! python3 -c 'import websockets' >/dev/null 2>&1; then
		python3 -m pip install -q websockets >/dev/null 2>&1 || echo "pip install websockets failed"
	fi
}

step() { echo; echo "== $*"; "$@"; }

# The go command caches cgo builds by the package directory's files only;
# csrc/*.c arrive by #include, so their fingerprint lives in csrc_hash.go.
go run ./internal/cgohash/gen

cmd="${1:-build}"
shift || true
case "$cmd" in
build)
	install_packages
	step go build ./...
	step go build -o build/talaris ./cmd/talaris
	;;
demo)
	install_packages
	go build -o build/talaris ./cmd/talaris
	exec ./build/talaris demo "$@"
	;;
test)
	install_packages always
	install_node_ws
	install_python_websockets
	step go vet ./...
	step go vet -tags talaris_openssl ./...
	step env GOOS=darwin go vet ./...
	step env CGO_ENABLED=0 go build ./...
	step go test -count=1 ./...
	step go test -count=1 -tags talaris_openssl ./...
	step go test -count=1 -race -short ./...
	step make -s -f cgo.mk test
	step make -s -f cgo.mk test TLS=openssl BUILD=build/openssl
	step make -s -f cgo.mk fuzz FUZZ_SECONDS="${FUZZ_SECONDS:-12}"
	for f in $(grep -l '^func Fuzz' ./*_test.go ws/*_test.go internal/*/*_test.go 2>/dev/null || true); do
		dir=$(dirname "$f")
		for name in $(grep -o '^func Fuzz[A-Za-z0-9_]*' "$f" | sed 's/^func //'); do
			step go test "./$dir" -run '^$' -fuzz "^${name}\$" -fuzztime "${GO_FUZZTIME:-10s}"
		done
	done
	echo; echo "== all tests passed"
	;;
bench)
	install_packages
	go build -o build/talaris ./cmd/talaris
	if command -v cargo >/dev/null 2>&1; then
		echo "== cargo build (the Rust talaris crate's bench client)"
		CARGO_TARGET_DIR=build/rust-talaris cargo build -q --release --manifest-path bench/rust-talaris/Cargo.toml ||
			echo "cargo build failed: the Rust column will be missing"
	fi
	./build/talaris bench --md docs/BENCH.md --plots docs --json docs/bench.json "$@"
	# Copy the generated tables into the README between its markers.
	python3 - <<'PY'
import re
bench = open("docs/BENCH.md").read()
body = bench[bench.index("### decode"):bench.index("### plots")].rstrip()
body = body.replace("### ", "#### ")
readme = open("README.md").read()
start, end = "<!-- bench:start -->", "<!-- bench:end -->"
i, j = readme.index(start) + len(start), readme.index(end)
head = "\n".join(l for l in bench.splitlines() if l.startswith(("- command", "- CPU", "- kernel", "- date", "- load")))
readme = readme[:i] + "\n" + head + "\n\n" + body + "\n\n![latency CDF](docs/bench-latency-cdf.png)\n" + readme[j:]
open("README.md", "w").write(readme)
PY
	;;
fuzz)
	install_packages
	make -f cgo.mk fuzz FUZZ_SECONDS="${FUZZ_SECONDS:-600}"
	;;
*)
	echo "usage: $0 {build|demo|test|bench|fuzz}" >&2
	exit 2
	;;
esac
