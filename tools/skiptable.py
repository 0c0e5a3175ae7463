#!/usr/bin/env python3
"""skiptable.py - every skipped test of ./build.sh test, visible and owned.

  go test -json ... 2>&1 | tools/skiptable.py filter build/test-PASS.MODULE.json
      Keeps every event in the file and prints what a plain `go test`
      prints: the package lines, and the whole output of each failing test
      (of every test still running when a package fails: a panic, a
      timeout). Exits 1 when a test, a package or a build failed, or when
      no event came at all.

  tools/skiptable.py report build/test-*.json build/ctest-*.log
      Prints a table of every skipped test: Go tests from the JSON (with
      the skip message), C test programs from their logs (lines saying
      SKIPPED, or ending in "skipped"), and the Go tests that log that they
      left a peer out. Exits 1 when any skip is not on ALLOWED below.

The file names carry the pass: build.sh writes build/test-PASS.MODULE.json
(PASS: default, notlsrec, openssl, openssl-notlsrec, race, openssl-race) and
build/ctest-PASS.log (default, openssl). Python 3.11 stdlib only.
"""
import json
import os
import re
import sys

# The skips CI accepts. A skip matching no rule fails ./build.sh test: a
# skipped interop peer (Python websockets, Node ws, openssl s_server) or
# a test the CI machine (Debian 12, 2 vCPUs, root, IPv6 loopback) can run
# must not pass quietly. Each rule: the passes it holds in (regex on
# PASS.MODULE, "c:PASS" for the C programs), the test (regex, full name),
# the skip message (regex, searched), the reason, and whether it is
# printed loudly (allowed, but coverage the machine could not give).
TLS_ONLY = r"^(openssl|notlsrec|openssl-notlsrec|openssl-race)\."
NO_TLSREC = r"^(notlsrec|openssl-notlsrec)\."
ALLOWED = [
    dict(passes=TLS_ONLY, test=r".", msg=r"ws:// half: ran in the default backend's pass",
         reason="TLS-only pass: the ws:// half of the test ran in the default pass (same code, no TLS)"),
    dict(passes=NO_TLSREC, test=r".", msg=r"tests the own TLS record layer: off in this pass",
         reason="pass without the own TLS record layer: tests of that layer have nothing to test"),
    dict(passes=r"^openssl-notlsrec\.", test=r"^TestTLSRecordCraftedBad/inner-over-2\^14\+1$",
         msg=r"OpenSSL 3's SSL_read takes a TLS 1\.3 record",
         reason="OpenSSL 3's SSL_read is lenient with that record (the own layer, tested elsewhere, is not)"),
    dict(passes=r"^(openssl-)?race\.", test=r"^TestTLSResumptionTiming$", msg=r"^timing$",
         reason="-short (race pass): a timing measurement; the default passes run it"),
    dict(passes=r"^race\.", test=r"^TestReassemblyBufferGivenBack$", msg=r"RSS under the race detector",
         reason="race pass: RSS holds the race detector's shadow memory; the default passes run it"),
    dict(passes=r"^race\.", test=r"^TestFrameMaskedAllocs$", msg=r"allocation counts differ under the race detector",
         reason="race pass: the race detector allocates; the default passes run it"),
    dict(passes=r".", test=r"^TestRustAnchorPerThread$", msg=r"Rust talaris client not built \(",
         reason="the Rust bench client is built by ./build.sh bench (cargo), not by ./build.sh test"),
    dict(passes=r".", test=r"^TestDialEveryAddress$", msg=r"127\.0\.0\.1:\d+ is taken",
         reason="chance: another process holds on 127.0.0.1 the port the kernel gave [::1]"),
    dict(passes=r".", test=r".", msg=r"ChaCha20 negotiated: our record layer does not run", loud=True,
         reason="CPU without AES-NI: the TLS library picks ChaCha20, which the own record layer leaves to SSL_read"),
    dict(passes=r"^c:", test=r"^test_gcm_", msg=r"SKIPPED \(CPU lacks VAES\)", loud=True,
         reason="CPU lacks VAES: the native AES-GCM build cannot run (the emulated build covers its code)"),
    dict(passes=r"^c:", test=r"^test_gcm_", msg=r"SKIPPED \(CPU lacks AVX2/AES-NI/PCLMULQDQ\)", loud=True,
         reason="CPU lacks AVX2/AES-NI/PCLMULQDQ: the emulated AES-GCM build cannot run"),
    dict(passes=r".", test=r"^TestPeerResetLostRecv/probe=", msg=r"^kernel lost no recv completion", loud=True,
         reason="the kernel did not lose a multishot recv completion in the run (the bug the probe defends against is rare, or fixed on this kernel)"),
    dict(passes=r"^c:", test=r"^test_bundle_kernel$", msg=r"kernel without recv bundles, skipped", loud=True,
         reason="kernel before 6.10 (Debian 12 ships 6.1): io_uring has no recv bundles to test"),
]

# A Go test that goes on without a peer and only logs it (not a t.Skip):
# counted as a skip of that peer.
PARTIAL = re.compile(r"not installed: skipping the .* peer\s*$")
# A C program's skip line.
C_SKIP = re.compile(r"\bSKIPPED\b|\bskipped\s*$")
# The start of a t.Log/t.Skip entry in test output: "    close_test.go:12: ".
LOG_ENTRY = re.compile(r"^\s*([\w.-]+\.go:\d+): ?(.*)$")


def out(s=""):
    sys.stdout.write(s + "\n")
    sys.stdout.flush()


# ---- filter ----

def filter_stream(path):
    """Copies go test -json from stdin to path; prints a plain go test's output."""
    failed = False
    events = 0
    running = {}  # (package, test) -> output lines, until the test ends
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for line in sys.stdin.buffer:
            text = line.decode("utf-8", "replace")
            ev = None
            if text.startswith("{"):
                try:
                    ev = json.loads(text)
                except ValueError:
                    ev = None
            if not isinstance(ev, dict) or "Action" not in ev:
                sys.stdout.write(text)  # the go command's own stderr
                sys.stdout.flush()
                continue
            events += 1
            f.write(text if text.endswith("\n") else text + "\n")
            f.flush()
            act, pkg, test = ev["Action"], ev.get("Package", ""), ev.get("Test")
            o = ev.get("Output", "")
            if act == "build-output":
                sys.stdout.write(o)
            elif act == "build-fail":
                failed = True
            elif test is None:
                if act == "fail" or (act == "output" and o.startswith("FAIL")):
                    # a panic or a timeout ended the binary: first what was running
                    for key in [k for k in running if k[0] == pkg]:
                        sys.stdout.write("".join(l for l in running.pop(key) if not l.startswith("=== ")))
                if act == "output" and o.strip() != "PASS":  # (a plain go test prints ok, not PASS)
                    sys.stdout.write(o)
                elif act == "fail":
                    failed = True
            elif act == "output":
                running.setdefault((pkg, test), []).append(o)
            elif act in ("pass", "skip"):
                running.pop((pkg, test), None)
            elif act == "fail":
                failed = True
                sys.stdout.write("".join(l for l in running.pop((pkg, test), []) if not l.startswith("=== ")))
            sys.stdout.flush()
    if events == 0:
        out("skiptable: no go test -json event on stdin (written to %s)" % path)
        return 1
    return 1 if failed else 0


# ---- report ----

def skip_message(lines):
    """The last log entry of a skipped test's output: its t.Skip message."""
    entries = []
    for l in lines:
        s = l.rstrip("\n")
        if not s.strip() or s.lstrip().startswith(("=== ", "--- SKIP", "--- PASS", "--- FAIL")):
            continue
        m = LOG_ENTRY.match(s)
        if m:
            entries.append([m.group(1), m.group(2)])
        elif entries:
            entries[-1][1] += " " + s.strip()
    if not entries:
        return "", "(no message)"
    return entries[-1][0], entries[-1][1]


def pass_name(path, prefix, suffix):
    b = os.path.basename(path)
    if b.startswith(prefix) and b.endswith(suffix):
        return b[len(prefix):len(b) - len(suffix)]
    return b


def go_skips(path):
    lane = pass_name(path, "test-", ".json")
    logs = {}
    skips = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            test = ev.get("Test")
            if not test:
                continue
            key = (ev.get("Package", ""), test)
            act = ev.get("Action")
            if act == "output":
                o = ev.get("Output", "")
                logs.setdefault(key, []).append(o)
                e = LOG_ENTRY.match(o.rstrip("\n"))
                if e and PARTIAL.search(e.group(2)):
                    skips.append(dict(lane=lane, pkg=key[0], test=test, where=e.group(1),
                                      msg=e.group(2).strip() + " (logged, not t.Skip)"))
            elif act == "skip":
                where, msg = skip_message(logs.pop(key, []))
                skips.append(dict(lane=lane, pkg=key[0], test=test, where=where, msg=msg))
            elif act in ("pass", "fail"):
                logs.pop(key, None)
    return skips


def c_skips(path):
    lane = "c:" + pass_name(path, "ctest-", ".log")
    skips = []
    prog = ""
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            s = line.rstrip("\n")
            if s.startswith("== ") and "/test/" in s:  # cgo.mk's "== build/test/test_x" header
                prog = os.path.basename(s[3:].strip())
                continue
            if re.match(r"all \d+ C test programs passed", s):
                break  # the summary after it repeats lines the programs printed
            if C_SKIP.search(s):
                head = s.split(":", 1)[0].strip()
                test = head if re.fullmatch(r"test_\w+", head) else prog
                skips.append(dict(lane=lane, pkg="", test=test, where="", msg=s.strip()))
    return skips


def rule_for(sk):
    for r in ALLOWED:
        if (re.search(r["passes"], sk["lane"]) and re.search(r["test"], sk["test"])
                and re.search(r["msg"], sk["msg"])):
            return r
    return None


def clip(s, n):
    return s if len(s) <= n else s[:n - 3] + "..."


def report(paths):
    skips = []
    if not any(os.path.exists(p) for p in paths):
        out("skiptable: no result file among %s: nothing ran?" % " ".join(paths))
        return 1
    for p in paths:
        if not os.path.exists(p):
            continue  # an unmatched glob
        skips += go_skips(p) if p.endswith(".json") else c_skips(p)
    groups = {}  # rule index (len(ALLOWED) = not allowed) -> skips
    for sk in skips:
        r = rule_for(sk)
        groups.setdefault(ALLOWED.index(r) if r else len(ALLOWED), []).append(sk)
    bad = groups.get(len(ALLOWED), [])
    loud = sum(len(v) for k, v in groups.items() if k < len(ALLOWED) and ALLOWED[k].get("loud"))
    out()
    out("== skip table: %d skipped in %d result files: %d allowed (%d of them loud), %d NOT allowed"
        % (len(skips), len([p for p in paths if os.path.exists(p)]), len(skips) - len(bad), loud, len(bad)))
    if not skips:
        out("(no test skipped)")
    tw = min(max([len(s["test"]) for s in skips] + [4]), 60)
    lw = max([len(s["lane"]) for s in skips] + [4])
    # Quiet allowed rules first, the loud ones next, the failures last: what
    # matters is nearest the end of the log.
    order = sorted(groups, key=lambda k: (k == len(ALLOWED), k < len(ALLOWED) and bool(ALLOWED[k].get("loud")), k))
    for k in order:
        rows = sorted(groups[k], key=lambda s: (s["lane"], s["test"]))
        if k == len(ALLOWED):
            out()
            out("!!! NOT ALLOWED (%d): a skip CI does not accept; install what it needs or fix the test" % len(rows))
        elif ALLOWED[k].get("loud"):
            out()
            out("!!! ALLOWED, LOUD (%d): %s" % (len(rows), ALLOWED[k]["reason"]))
        else:
            out()
            out("-- allowed (%d): %s" % (len(rows), ALLOWED[k]["reason"]))
        width = 400 if k == len(ALLOWED) or ALLOWED[k].get("loud") else 110
        for s in rows:
            msg = (s["where"] + ": " if s["where"] else "") + s["msg"]
            out("   %-*s  %-*s  %s" % (lw, s["lane"], tw, clip(s["test"], 60), clip(msg, width)))
    out()
    if bad:
        out("skiptable: %d skip(s) not on the allowed list (tools/skiptable.py ALLOWED): FAIL" % len(bad))
        return 1
    out("skiptable: every skip is on the allowed list")
    return 0


def main(argv):
    if len(argv) == 3 and argv[1] == "filter":
        return filter_stream(argv[2])
    if len(argv) >= 2 and argv[1] == "report":
        return report(argv[2:])
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
