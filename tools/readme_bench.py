#!/usr/bin/env python3
"""readme_bench.py BENCH.md README.md: write the README's headline benchmark
table between its <!-- bench:start --> and <!-- bench:end --> markers.

The rows are picked from the full tables `talaris bench --md` wrote to
BENCH.md (decode, ingress, rtt): talaris, the best Go peer and the Rust crate
side by side, with the run's command, CPU, kernel and date lines above them
and the plots below. `./build.sh bench` runs it after the bench.
"""
import re
import sys
bench = open(sys.argv[1]).read()

def table(title):
    # the first markdown table after the "### <title>" heading, as dicts by column
    i = bench.index("\n### " + title) + 1
    rows = []
    for line in bench[i:].splitlines()[1:]:
        if line.startswith("### "):
            break
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break  # the table ended
    head, body = rows[0], rows[2:]
    return [dict(zip(head, r)) for r in body]

def num(s):
    m = re.match(r"[-0-9.]+", s or "")
    return float(m.group()) if m else None

GO = ("gorilla", "gobwas", "gws", "coder")
decode, ingress, rtt = table("decode"), table("ingress"), table("rtt")
out = ["| measure | talaris | best Go peer | Rust talaris crate |", "|---|---:|---:|---:|"]

def pick(rows, name):
    return next((r for r in rows if r.get("client") == name), None)

def best(rows, key, low):
    go = [r for r in rows if r.get("client") in GO and num(r.get(key)) is not None]
    return (min if low else max)(go, key=lambda r: num(r[key])) if go else None

def cell(r, key, fmt="{}", who=False):
    if not r:
        return "-"
    v = fmt.format(r[key])
    return v + " (" + r["client"] + ")" if who else v

t, dec, rs, g = pick(decode, "talaris"), pick(decode, "talaris-decoder"), pick(decode, "rust-talaris"), best(decode, "ns/msg", True)
out.append("| decode, ns/msg (Pool; synchronous decoder) | %s; %s | %s | %s |" % (cell(t, "ns/msg"), cell(dec, "ns/msg"), cell(g, "ns/msg", who=True), cell(rs, "ns/msg")))
for tr, frame, conns in (("ws", "64 B", "1"), ("ws", "64 B", "16"), ("wss", "256 B", "1"), ("wss", "256 B", "16")):
    rows = [r for r in ingress if (r["transport"], r["frame"], r["conns"]) == (tr, frame, conns)]
    if not rows:
        continue
    t, rs, g = pick(rows, "talaris/default"), pick(rows, "rust-talaris"), best(rows, "frames/s", False)
    out.append("| ingress %s %s x%s, frames/s | %s | %s | %s |" % (tr, frame, conns, cell(t, "frames/s"), cell(g, "frames/s", who=True), cell(rs, "frames/s")))
    cpu = "CPU s / M frames"
    gc = best(rows, cpu, True)
    out.append("| CPU per frame, %s x%s, us (whole client) | %s | %s | %s |" % (tr, conns, cell(t, cpu), cell(gc, cpu, who=True), cell(rs, cpu)))
t, rs = pick(rtt, "talaris/default"), pick(rtt, "rust-talaris")
g = best(rtt, "p50", True)
out.append("| round trip p50 / p99.9, us | %s | %s | %s |" % (
    cell(t, "p50") + " / " + cell(t, "p99.9") if t else "-",
    cell(g, "p50") + " / " + cell(g, "p99.9") + " (" + g["client"] + ")" if g else "-",
    cell(rs, "p50") + " / " + cell(rs, "p99.9") if rs else "-"))

head = "\n".join(l for l in bench.splitlines() if l.startswith(("- command", "- CPU", "- kernel", "- date", "- note: Rust anchor")))
readme = open(sys.argv[2]).read()
start, end = "<!-- bench:start -->", "<!-- bench:end -->"
i, j = readme.index(start) + len(start), readme.index(end)
plots = "![ingress ws](docs/bench-ingress-ws.png)\n![ingress wss](docs/bench-ingress-wss.png)\n![round trip CDF](docs/bench-rtt-cdf.png)\n![latency CDF](docs/bench-latency-cdf.png)\n"
readme = readme[:i] + "\n" + head + "\n\n" + "\n".join(out) + "\n\n" + plots + readme[j:]
open(sys.argv[2], "w").write(readme)
