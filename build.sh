#!/usr/bin/env bash
# build.sh - the one entry point: installs what is missing, builds, tests,
# runs the demo and the benchmarks.
#
#   ./build.sh demo     embedded local feed + a Pool receiving from it
#   ./build.sh test     everything CI runs (both TLS backends, own TLS record layer on and off, race, C sanitizers, fuzz smoke)
#   ./build.sh bench    the side-by-side benchmark; rewrites docs/BENCH.md and the plots
#   ./build.sh fuzz     the C fuzzers for FUZZ_SECONDS each (default 600)
#   ./build.sh build    go build ./... of every module and the CLI into build/talaris
#   ./build.sh vectors  fetch the pinned AES-GCM test vectors (cached; the C tests need them)
#
# Go modules: the library (.) requires only golang.org/x/sys; the test peers
# (internal/wstest), the CLI (cmd/talaris) and the test suite (tests) are
# modules of their own with a replace to the root, so a service importing
# the library never sees their dependencies.
set -euo pipefail
cd "$(dirname "$0")"

DEB_PKGS=(liburing-dev android-libboringssl-dev libssl-dev openssl clang libclang-rt-14-dev make gcc pkg-config python3-venv)

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

# install_node_ws installs Node (Debian's nodejs and npm, when node or npm
# is missing: a Node already there, say NodeSource's, which conflicts with
# Debian's npm, is kept) and Node's ws module into build/node for the
# interop tests (tests/peers_test.go looks there). Any failure fails the
# build: a missing peer would only make its tests skip (tools/skiptable.py
# fails those too, later).
install_node_ws() {
	if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
		echo "== apt-get install nodejs npm (the Node interop peer)"
		if ! { as_root apt-get update -qq && DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq nodejs npm >/dev/null; }; then
			echo "build.sh: cannot install nodejs and npm from Debian: the Node interop tests cannot run" >&2
			return 1
		fi
	fi
	if ! NODE_PATH=build/node/node_modules node -e 'require("ws")' >/dev/null 2>&1; then
		echo "== npm install ws@8 into build/node (the Node interop peer)"
		mkdir -p build/node
		if ! (cd build/node && npm install --no-audit --no-fund --silent ws@8) >build/node/npm.log 2>&1; then
			cat build/node/npm.log >&2
			echo "build.sh: npm install ws@8 failed (log above): the Node interop tests cannot run" >&2
			return 1
		fi
		if ! NODE_PATH=build/node/node_modules node -e 'require("ws")'; then
			echo "build.sh: npm installed ws@8 but node cannot require it from build/node/node_modules" >&2
			return 1
		fi
	fi
}

# install_python_websockets makes build/venv, a venv with Python's websockets
# from PyPI, for the interop tests (Debian's python3 is externally managed:
# no pip install into it). The Go tests run with build/venv/bin first on
# PATH (go_test), so their python3 is the venv's. Any failure fails the
# build.
PY_WEBSOCKETS='websockets>=13,<18'
install_python_websockets() {
	local py=build/venv/bin/python3
	if [ -x "$py" ] && "$py" -c 'import websockets' >/dev/null 2>&1; then
		return 0
	fi
	echo "== python3 -m venv build/venv; pip install $PY_WEBSOCKETS (the Python interop peer)"
	rm -rf build/venv
	mkdir -p build
	if ! python3 -m venv build/venv; then
		echo "build.sh: python3 -m venv build/venv failed (Debian: python3-venv): the Python interop tests cannot run" >&2
		return 1
	fi
	if ! "$py" -m pip install -q --disable-pip-version-check "$PY_WEBSOCKETS"; then
		echo "build.sh: pip install $PY_WEBSOCKETS into build/venv failed (PyPI unreachable?): the Python interop tests cannot run" >&2
		return 1
	fi
	if ! "$py" -c 'import websockets'; then
		echo "build.sh: build/venv has no importable websockets after pip install" >&2
		return 1
	fi
}

# go_test PASS MODULE [VAR=value...] ARGS... runs go test -json ARGS in
# MODULE with build/venv/bin first on PATH (the Python peer) and the VARs
# set. tools/skiptable.py keeps every event in build/test-PASS.MODULE.json
# (for the skip table at the end) and prints what a plain go test prints:
# package lines and failing tests' output. Fails as go test fails.
go_test() {
	local pass=$1 m=$2 vars=() name
	shift 2
	while [ $# -gt 0 ] && [[ $1 == [A-Z_]*=* ]]; do
		vars+=("$1")
		shift
	done
	name=${m//\//-}
	[ "$name" != . ] || name=root
	env PATH="$PWD/build/venv/bin:$PATH" "${vars[@]}" go -C "$m" test -json "$@" 2>&1 |
		python3 tools/skiptable.py filter "build/test-$pass.$name.json"
}

# each_module_test PASS ARGS... runs go_test PASS in every module.
each_module_test() {
	local m pass=$1
	shift
	for m in "${MODULES[@]}"; do
		step go_test "$pass" "$m" "$@"
	done
}

# c_test PASS [make variables...] runs the C tests (cgo.mk), keeping their
# output in build/ctest-PASS.log for the skip table.
c_test() {
	local pass=$1
	shift
	mkdir -p build
	make -s -f cgo.mk test "$@" 2>&1 | tee "build/ctest-$pass.log"
}

# step runs a command under a "== command" header and reports how long it
# took (where CI's time goes: "== 12 s").
step() {
	local t0=$SECONDS
	echo
	echo "== $*"
	"$@"
	echo "== $((SECONDS - t0)) s"
}

MODULES=(. internal/wstest cmd/talaris tests prom)

# each_module runs a go subcommand in every module: each_module vet ./...
each_module() {
	local m
	for m in "${MODULES[@]}"; do
		step go -C "$m" "$@"
	done
}

# build_cli builds the CLI from its own module into build/talaris.
build_cli() { go -C cmd/talaris build -o ../../build/talaris .; }

# check_graph builds a throw-away module that imports the library through a
# replace and fails unless its module graph holds golang.org/x/sys only.
check_graph() {
	local d extra root=$PWD
	d=$(mktemp -d)
	(
		cd "$d"
		go mod init example.com/graphcheck >/dev/null 2>&1
		printf 'package main\n\nimport "github.com/talaris-go/talaris"\n\nfunc main() { _, _ = talaris.NewPool(talaris.Config{}) }\n' >main.go
		go mod edit -require github.com/talaris-go/talaris@v0.0.0 -replace "github.com/talaris-go/talaris=$root"
		go mod tidy
		go mod graph
	) >"$d/graph" || { rm -rf "$d"; return 1; }
	cat "$d/graph"
	extra=$(awk '{print $2}' "$d/graph" | grep -v -e '^github.com/talaris-go/talaris@' -e '^golang.org/x/sys@' -e '^go@' -e '^toolchain@' || true)
	rm -rf "$d"
	if [ -n "$extra" ]; then
		echo "the library pulls in more than golang.org/x/sys: $extra" >&2
		return 1
	fi
}

# check_reach builds the library as a user does and runs it: a throw-away
# module outside the repository (a replace to this clone) builds
# testdata/reach with plain go build and runs it (a standard-library echo
# server on 127.0.0.1; one message over ws:// and one over wss://, then the
# close handshake; TLSBackend() must name the library meant), once per way
# to pick the TLS library (README, "Requirements"):
#   - default: BoringSSL from the #cgo lines' Debian paths;
#   - talaris_openssl with CGO_CFLAGS and CGO_LDFLAGS empty, so pkg-config
#     is the only source of flags: go env must show no -I or -L in them
#     (a go env -w setting would outlive the clearing), go list that the
#     #cgo lines name no directory but csrc/ and ask pkg-config for
#     liburing libssl libcrypto, go build -x that it called pkg-config,
#     and ldd that the binary loads OpenSSL's libssl, not android/'s;
#   - talaris_boringssl_custom: the same BoringSSL, located by CGO_CFLAGS
#     and CGO_LDFLAGS alone, as the README tells a user with their own;
#     without them the build must stop at csrc/tls_lib.h's message.
check_reach() {
	local d rc=0
	d=$(mktemp -d)
	reach_in "$d" || rc=$?
	rm -rf "$d"
	return "$rc"
}

# reach_in DIR: check_reach's body in the scratch module DIR (every command
# checked: check_reach calls it in a list, where errexit is off).
reach_in() {
	local d=$1 root=$PWD multiarch prefix flags pcs
	cp testdata/reach/main.go "$d/" || return 1
	(cd "$d" && go mod init example.com/reach >/dev/null 2>&1) || return 1
	go -C "$d" mod edit -require github.com/talaris-go/talaris@v0.0.0 -replace "github.com/talaris-go/talaris=$root" || return 1
	go -C "$d" mod tidy || return 1
	go -C "$d" vet . || return 1

	echo "-- default (BoringSSL, the #cgo lines' Debian paths): go build"
	go -C "$d" build -o reach-default . || return 1
	reach_libs "$d/reach-default" || return 1
	"$d/reach-default" -backend boringssl || return 1

	echo "-- talaris_openssl, flags from pkg-config only: CGO_CFLAGS= CGO_LDFLAGS= go build -x -tags talaris_openssl"
	if env CGO_CFLAGS= CGO_LDFLAGS= go -C "$d" env CGO_CPPFLAGS CGO_CFLAGS CGO_LDFLAGS | tr '\n' ' ' | grep -E -- '(^| )-[IL]'; then
		echo "check_reach: with CGO_CFLAGS and CGO_LDFLAGS cleared, go env still names a directory (above; go env -w?)" >&2
		return 1
	fi
	# What the #cgo lines give under the tag: pkg-config's packages, and no
	# include or library directory but the package's own csrc/.
	flags=$(go -C "$d" list -tags talaris_openssl -f '{{join .CgoCFLAGS " "}} {{join .CgoLDFLAGS " "}}' github.com/talaris-go/talaris) || return 1
	pcs=$(go -C "$d" list -tags talaris_openssl -f '{{join .CgoPkgConfig " "}}' github.com/talaris-go/talaris) || return 1
	echo "   #cgo pkg-config: $pcs"
	echo "   #cgo CFLAGS, LDFLAGS: $flags"
	if [ "$pcs" != "liburing libssl libcrypto" ] || tr ' ' '\n' <<<"$flags" | grep -E '^-[IL]' | grep -v "^-I$root/csrc\$"; then
		echo "check_reach: under talaris_openssl the #cgo lines must ask pkg-config for liburing libssl libcrypto and name no directory but csrc/" >&2
		return 1
	fi
	# A cached package runs no pkg-config for -x to show: CGO_CPPFLAGS holds
	# only a -D with this run's number, so the package is compiled again.
	if ! env CGO_CFLAGS= CGO_LDFLAGS= CGO_CPPFLAGS="-DTL_REACH_RUN=$(date +%s%N)" \
		go -C "$d" build -x -tags talaris_openssl -o reach-openssl . 2>"$d/x.log"; then
		tail -n 40 "$d/x.log" >&2
		return 1
	fi
	grep -E '^pkg-config ' "$d/x.log" | sed 's/^/   go build -x: /'
	grep -Eq '^pkg-config --cflags -- liburing libssl libcrypto$' "$d/x.log" &&
		grep -Eq '^pkg-config --libs -- liburing libssl libcrypto$' "$d/x.log" || {
		echo "check_reach: go build -x -tags talaris_openssl did not ask pkg-config for liburing, libssl and libcrypto" >&2
		return 1
	}
	reach_libs "$d/reach-openssl" || return 1
	if ldd "$d/reach-openssl" | grep -E '/android/'; then
		echo "check_reach: the talaris_openssl build loads Debian's BoringSSL (above), not OpenSSL 3" >&2
		return 1
	fi
	"$d/reach-openssl" -backend openssl || return 1

	# Without CGO_CFLAGS the custom build finds OpenSSL's headers (libssl-dev
	# is installed): csrc/tls_lib.h must stop it, saying so.
	echo "-- talaris_boringssl_custom without CGO_CFLAGS: must stop at csrc/tls_lib.h"
	if go -C "$d" build -tags talaris_boringssl_custom -o /dev/null . >"$d/custom.log" 2>&1 ||
		! grep -F "talaris: the <openssl/ssl.h> found is not BoringSSL's" "$d/custom.log" | head -n 1 | sed 's/^/   /' | grep .; then
		cat "$d/custom.log" >&2
		echo "check_reach: the custom build without CGO_CFLAGS did not stop at csrc/tls_lib.h's #error" >&2
		return 1
	fi
	multiarch=$(gcc -print-multiarch)
	prefix=/usr/lib/$multiarch/android
	echo "-- talaris_boringssl_custom: CGO_CFLAGS='-O2 -g -I/usr/include/android' CGO_LDFLAGS='-L$prefix -Wl,-rpath,$prefix -lssl -lcrypto' go build -tags talaris_boringssl_custom"
	env CGO_CFLAGS="-O2 -g -I/usr/include/android" CGO_LDFLAGS="-L$prefix -Wl,-rpath,$prefix -lssl -lcrypto" \
		go -C "$d" build -tags talaris_boringssl_custom -o reach-custom . || return 1
	reach_libs "$d/reach-custom" || return 1
	"$d/reach-custom" -backend boringssl || return 1
}

# reach_libs BIN prints where BIN's TLS library and liburing load from.
reach_libs() {
	ldd "$1" | grep -E 'lib(ssl|crypto|uring)\.' | sed 's/ (0x[0-9a-f]*)$//; s/^[[:space:]]*/   /'
}

# go_fuzz_one fuzzes one target for GO_FUZZTIME. A finding is written to
# testdata/fuzz/NAME and fails the step. A failure that wrote no input is
# the fuzz coordinator losing a worker on a loaded machine ("context
# deadline exceeded", seen in a full run at load 8-14; the same smoke
# passed alone): that one is run again, once.
go_fuzz_one() {
	local mod=$1 rel=$2 name=$3 corpus
	corpus="$mod/$rel/testdata/fuzz/$name"
	local before
	before=$({ ls "$corpus" 2>/dev/null || true; } | wc -l) # (none yet: 0)
	go -C "$mod" test "./$rel" -run '^$' -fuzz "^${name}\$" -fuzztime "${GO_FUZZTIME:-10s}" && return 0
	if [ "$({ ls "$corpus" 2>/dev/null || true; } | wc -l)" != "$before" ]; then
		echo "fuzz: $name wrote a failing input to $corpus" >&2
		return 1
	fi
	echo "fuzz: $name failed without a failing input (the coordinator, not a finding): once more" >&2
	go -C "$mod" test "./$rel" -run '^$' -fuzz "^${name}\$" -fuzztime "${GO_FUZZTIME:-10s}"
}

# go_fuzz runs every Go fuzz target (FUZZ functions in any module) for
# GO_FUZZTIME each, from the module that holds it. A target that executed
# no input fails, as a C fuzzer does (cgo.mk): go test -fuzz passes with
# "no fuzz tests to fuzz" when the name matches nothing built (a build
# tag), so its last "execs: N" must be there and N > 0.
go_fuzz() {
	local f dir mod rel name log
	mkdir -p build
	for f in $(grep -rl --include='*_test.go' '^func Fuzz' . | grep -v '^./build/' || true); do
		dir=$(dirname "$f")
		mod=$dir
		while [ ! -f "$mod/go.mod" ]; do mod=$(dirname "$mod"); done
		rel=${dir#"$mod"}
		rel=${rel#/}
		for name in $(grep -o '^func Fuzz[A-Za-z0-9_]*' "$f" | sed 's/^func //'); do
			log=build/gofuzz-$name.log
			step go_fuzz_one "$mod" "$rel" "$name" 2>&1 | tee "$log"
			if ! grep -o 'execs: [0-9]*' "$log" | tail -n 1 | grep -q 'execs: [1-9]'; then
				echo "fuzz: $name executed no input (no \"execs: N\" with N > 0 in $log)" >&2
				return 1
			fi
		done
	done
}

# Published AES-GCM vectors for csrc/test/test_gcm_vectors.c, pinned:
# NIST's CAVS decryption files as the PyPI package cryptography-vectors
# ships them, and Wycheproof's aes_gcm_test.json from the Go module proxy.
VECTORS_PYPI=cryptography-vectors==44.0.0
VECTORS_PYPI_SHA256=458ed682dbfa7144da156039c764ac707eb48b80e1d17ffe99e1de2edc91d5d7
VECTORS_WYCHEPROOF=github.com/google/wycheproof@v0.0.0-20191219022705-2196000605e4
VECTORS_FILES=(gcmDecrypt128.rsp gcmDecrypt256.rsp aes_gcm_test.json)

# fetch_vectors puts the pinned vectors in TL_VECTORS_DIR (default
# $XDG_CACHE_HOME/talaris/vectors, else build/vectors). Once there (the
# stamp names the pins) it is a no-op and needs no network. Not committed.
fetch_vectors() {
	local d=${TL_VECTORS_DIR:-${XDG_CACHE_HOME:+$XDG_CACHE_HOME/talaris/vectors}}
	d=${d:-build/vectors}
	local stamp="$VECTORS_PYPI $VECTORS_WYCHEPROOF" f ok=1 tmp whl dir
	for f in "${VECTORS_FILES[@]}"; do [ -s "$d/$f" ] || ok=0; done
	if [ $ok = 1 ] && [ "$(cat "$d/.pins" 2>/dev/null)" = "$stamp" ]; then
		return 0
	fi
	echo "== fetch_vectors: $VECTORS_PYPI, $VECTORS_WYCHEPROOF into $d"
	mkdir -p "$d"
	tmp=$(mktemp -d)
	if ! python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "$VECTORS_PYPI" >"$tmp/log" 2>&1; then
		cat "$tmp/log" >&2
		echo "fetch_vectors: cannot download $VECTORS_PYPI from PyPI (offline?); put ${VECTORS_FILES[*]} in $d by hand" >&2
		rm -rf "$tmp"
		return 1
	fi
	whl=$(ls "$tmp"/cryptography_vectors-*.whl)
	if [ "$(sha256sum "$whl" | cut -d' ' -f1)" != "$VECTORS_PYPI_SHA256" ]; then
		echo "fetch_vectors: $whl does not have the pinned sha256 $VECTORS_PYPI_SHA256" >&2
		rm -rf "$tmp"
		return 1
	fi
	python3 - "$whl" "$d" <<'PY'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
for n in ("gcmDecrypt128.rsp", "gcmDecrypt256.rsp"):
    open(sys.argv[2] + "/" + n, "wb").write(z.read("cryptography_vectors/ciphers/AES/GCM/" + n))
PY
	# Outside any module (the go.mod here stays as it is); the go command
	# checks the module against the checksum database.
	if ! dir=$(cd "$tmp" && GOFLAGS=-mod=mod go mod download -json "$VECTORS_WYCHEPROOF" 2>"$tmp/log" |
		python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])'); then
		cat "$tmp/log" >&2
		echo "fetch_vectors: cannot download $VECTORS_WYCHEPROOF from the Go module proxy (offline?)" >&2
		rm -rf "$tmp"
		return 1
	fi
	cp "$dir/testvectors/aes_gcm_test.json" "$d/aes_gcm_test.json"
	chmod u+w "$d/aes_gcm_test.json"
	echo "$stamp" >"$d/.pins"
	rm -rf "$tmp"
}

# The go command caches cgo builds by the package directory's files only;
# the csrc/ sources arrive by #include, so their fingerprint lives in csrc_hash.go.
# (Not for vectors: cgo.mk's test calls that, and it builds no Go.)
[ "${1:-}" = vectors ] || go run ./internal/cgohash/gen

# lane2 is the test lane that runs beside the default pass, the C tests and
# the fuzz smoke: the second TLS backend, then the race detector on both
# backends. The second TLS backend's passes (own record layer on, then
# off, then under -race -short) run what can reach TLS only: the backends
# differ in the TLS library linked and nothing else, so the default passes
# run the rest on the same code. The tests module picks its TLS tests from
# its source (tests/tlsonly_test.go: whatever names TLS, directly or
# through a helper) and skips the ws:// halves of forEachTransport, of
# TestPoolCloseRace and of the conformance run.
lane2() {
	TALARIS_TEST_TLS_ONLY=1 each_module_test openssl -count=1 -timeout 30m -tags talaris_openssl ./...
	step go_test openssl-notlsrec tests TALARIS_TEST_NO_TLSREC=1 TALARIS_TEST_TLS_ONLY=1 -count=1 -timeout 30m -tags talaris_openssl .
	each_module_test race -count=1 -timeout 30m -race -short ./...
	# The race matrix's other half: OpenSSL under -race (the tests module:
	# the only one whose tests reach TLS; about 200 s on 2 cores).
	step go_test openssl-race tests TALARIS_TEST_TLS_ONLY=1 -count=1 -timeout 30m -race -short -tags talaris_openssl ./...
}

# lane_start LOG FUNC runs FUNC in the background (errexit on, output to
# LOG); lane_wait waits for it, prints LOG and fails as it failed.
lane_start() {
	LANE_LOG=$1
	mkdir -p "$(dirname "$LANE_LOG")"
	set -m # its own process group: a failing lane 1 ends it whole (trap below)
	(
		set -e
		"$2"
	) >"$LANE_LOG" 2>&1 &
	LANE_PID=$!
	set +m
	trap 'if [ -n "${LANE_PID:-}" ]; then kill -- -"$LANE_PID" 2>/dev/null || true; fi' EXIT
	echo; echo "== $2 started in the background (log: $LANE_LOG)"
}
lane_wait() {
	local rc=0 t0=$SECONDS
	wait "$LANE_PID" || rc=$?
	LANE_PID=
	echo; echo "== background lane's log (waited $((SECONDS - t0)) s for it, rc=$rc):"
	cat "$LANE_LOG"
	return "$rc"
}

cmd="${1:-build}"
shift || true
case "$cmd" in
build)
	install_packages
	each_module build -o /dev/null ./...
	step build_cli
	;;
demo)
	install_packages
	build_cli
	exec ./build/talaris demo "$@"
	;;
test)
	install_packages
	install_node_ws
	install_python_websockets
	rm -f build/test-*.json build/ctest-*.log # this run's results only (the skip table)
	each_module vet ./...
	# Only the root module has talaris_openssl code (talaris_linux.go's #cgo
	# lines); the other modules' vet would check the same Go again.
	step go vet -tags talaris_openssl ./...
	step env GOOS=darwin go vet ./...
	step env CGO_ENABLED=0 go build ./...
	step check_graph
	step check_reach
	step python3 tools/checkrefs.py
	# Two lanes at once: one pass of the Go tests keeps about one of the
	# two vCPUs busy (the rest is waiting on peers, timers and wake-ups),
	# so a second lane runs beside it and prints its log when done.
	lane_start build/lane2.log lane2
	each_module_test default -count=1 -timeout 30m ./...
	# The TLS tests again with the library's SSL_read only (no own record
	# layer or AES-GCM: tests/tlsonly_test.go), the read path a user gets
	# with Config.Tuning.NoTLSRecordLayer or a ChaCha20 or TLS 1.2 server.
	step go_test notlsrec tests TALARIS_TEST_NO_TLSREC=1 TALARIS_TEST_TLS_ONLY=1 -count=1 -timeout 30m .
	step fetch_vectors
	step c_test default
	step c_test openssl TLS=openssl BUILD=build/openssl
	step make -s -f cgo.mk fuzz FUZZ_SECONDS="${FUZZ_SECONDS:-12}"
	# The fuzzers built against OpenSSL (tlsrec and gcm_diff check against
	# the TLS library): a shorter smoke. Each fuzzer must report executed
	# inputs (cgo.mk's fuzz fails otherwise).
	step make -s -f cgo.mk fuzz TLS=openssl BUILD=build/openssl FUZZ_SECONDS="${FUZZ_SECONDS_OPENSSL:-5}"
	go_fuzz
	# Everything compiled is run: the C micro-benchmarks and every Go
	# benchmark, once each (a check that they build and run, not a
	# measurement: ./build.sh bench measures).
	step make -s -f cgo.mk bench
	each_module test -run '^$' -bench . -benchtime 1x ./...
	lane_wait
	# Every skipped Go test and C program of this run, with its message;
	# fails on a skip not on the list of allowed ones in the script.
	step python3 tools/skiptable.py report build/test-*.json build/ctest-*.log
	echo; echo "== all tests passed"
	;;
bench)
	install_packages
	build_cli
	if command -v cargo >/dev/null 2>&1; then
		echo "== cargo build (the Rust talaris crate's bench client)"
		CARGO_TARGET_DIR=build/rust-talaris cargo build -q --release --locked --manifest-path bench/rust-talaris/Cargo.toml ||
			echo "cargo build failed: the Rust column will be missing"
	fi
	./build/talaris bench --md docs/BENCH.md --plots docs --json docs/bench.json "$@"
	# The README's headline table, picked from docs/BENCH.md, between its markers.
	python3 tools/readme_bench.py docs/BENCH.md README.md
	;;
vectors)
	fetch_vectors
	;;
fuzz)
	install_packages
	make -f cgo.mk fuzz FUZZ_SECONDS="${FUZZ_SECONDS:-600}"
	;;
*)
	echo "usage: $0 {build|demo|test|bench|fuzz|vectors}" >&2
	exit 2
	;;
esac
