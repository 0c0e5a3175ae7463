#!/usr/bin/env python3
"""layers.py - checks the layering of the C core (run by `make -f cgo.mk layers`).

The core lives in layer folders under csrc/ (each folder's README.md says
its job). A module is a file, named by its path without the extension, so
a header's inlines belong to the module of the same name (base/evq.h and
base/evq.c are the module base/evq); its layer is its folder. The C tests,
fuzzers and benchmarks (csrc/test, csrc/fuzz, csrc/bench) are not checked.

It finds which module defines each tl_* function and builds the graph of
calls between modules (comments ignored; a call is a tl_* name followed by
"(" on an indented line, so prototypes do not count). It fails when:
  - the module graph has a cycle;
  - a module calls into a folder of higher rank, or into another folder
    of the same rank (a folder may call its own modules and the folders
    ranked below it);
  - a file outside loop/ includes loop/loop.h (the layers below the loop
    include loop/state.h, the loop's data: they cannot name its functions);
  - a folder has no rank (a new folder must be added to RANK).
With -v it prints the folder graph (the one docs/ARCHITECTURE.md draws),
then the module graph."""
import collections
import glob
import os
import re
import sys

# Top may call down, never up (csrc/<folder>/README.md). The top-level
# headers (talaris.h, ring.h: the boundary with Go) hold no code.
RANK = {"loop": 5, "transport": 4, "ws": 3, "crypto": 2, "codec": 2, "base": 1}
SKIP = {"test", "fuzz", "bench"}

here = os.path.dirname(os.path.abspath(__file__))
files = sorted(f for f in glob.glob(os.path.join(here, "*.[ch]")) + glob.glob(os.path.join(here, "*", "*.[ch]"))
               if os.path.relpath(os.path.dirname(f), here) not in SKIP)
rel = lambda f: os.path.relpath(f, here).replace(os.sep, "/")
mod = lambda f: rel(f).rsplit(".", 1)[0]
folder = lambda m: m.split("/")[0] if "/" in m else "."
defn = re.compile(r"^(?:static\s+)?(?:inline\s+)?(?:__attribute__\(\([\w ,()]+\)\)\s+)?[a-z_0-9 ]+?[\s*]+(tl_\w+)\([^;{]*\)\s*\{", re.M)
src = {f: re.sub(r"/\*.*?\*/", "", open(f).read(), flags=re.S) for f in files}
defs = {}
bad = []
for f, s in src.items():
    for m in defn.finditer(s):
        if defs.setdefault(m.group(1), mod(f)) != mod(f):
            bad.append("%s defined in both %s and %s" % (m.group(1), defs[m.group(1)], mod(f)))
graph = collections.defaultdict(set)  # module -> modules it calls
calls = collections.defaultdict(set)  # (module, module) -> functions
for f, s in src.items():
    body = "\n".join(l for l in s.split("\n") if l[:1] in ("\t", " "))  # calls, not prototypes
    for m in re.finditer(r"\b(tl_\w+)\(", body):
        d = defs.get(m.group(1))
        if d and d != mod(f):
            graph[mod(f)].add(d)
            calls[(mod(f), d)].add(m.group(1))
    if folder(mod(f)) != "loop" and re.search(r'#include "loop/loop\.h"', s):
        bad.append("%s includes loop/loop.h" % rel(f))
for m in sorted({mod(f) for f in files}):
    if folder(m) != "." and folder(m) not in RANK:
        bad.append("%s: folder %s/ has no rank" % (m, folder(m)))
folders = collections.defaultdict(set)
for a in sorted(graph):
    for b in sorted(graph[a]):
        fa, fb = folder(a), folder(b)
        if fa == fb:
            continue
        folders[fa].add(fb)
        if fa in RANK and fb in RANK and RANK[fb] >= RANK[fa]:
            bad.append("%s calls %s (%s), a folder of %s rank: %s" % (
                a, b, fb + "/", "higher" if RANK[fb] > RANK[fa] else "the same",
                " ".join(sorted(calls[(a, b)]))))
cycles = set()
def walk(n, stack):
    for m in sorted(graph.get(n, ())):
        if m in stack:
            c = stack[stack.index(m):]
            k = c.index(min(c))  # one rotation per cycle
            cycles.add(" -> ".join(c[k:] + c[:k] + [min(c)]))
        else:
            walk(m, stack + [m])
for n in sorted(graph):
    walk(n, [n])
if "-v" in sys.argv:
    print("folders (rank):")
    for fo in sorted(RANK, key=lambda x: (-RANK[x], x)):
        print("  %-10s %d -> %s" % (fo + "/", RANK[fo], " ".join(sorted((x + "/" for x in folders.get(fo, ())),
                                                                        key=lambda x: -RANK.get(x[:-1], 0)))))
    print("modules:")
    for n in sorted(graph):
        print("  %-22s -> %s" % (n, " ".join(sorted(graph[n]))))
for c in sorted(cycles):
    bad.append("call cycle: " + c)
for b in bad:
    print("layers:", b, file=sys.stderr)
sys.exit(1 if bad else 0)
