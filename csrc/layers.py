#!/usr/bin/env python3
"""layers.py - checks the layering of the C core (run by `make -f cgo.mk layers`).

It reads csrc/*.c and csrc/*.h, finds which file defines each tl_* function
(a header's inlines belong to the module of the same name), and builds the
graph of calls between modules (comments ignored). It fails when:
  - the graph has a cycle;
  - a module below the loop (anything but loop, cmdq, decoder) includes
    loop.h (those include state.h: they cannot name the loop's functions).
With -v it prints the graph (the one docs/ARCHITECTURE.md draws)."""
import collections
import glob
import os
import re
import sys

TOP = {"loop", "cmdq", "decoder"}
here = os.path.dirname(os.path.abspath(__file__))
files = sorted(f for f in glob.glob(os.path.join(here, "*.[ch]")) + glob.glob(os.path.join(here, "*", "*.[ch]"))
               if os.path.basename(os.path.dirname(f)) not in ("test", "fuzz", "bench"))
mod = lambda f: os.path.basename(f).rsplit(".", 1)[0]
defn = re.compile(r"^(?:static\s+)?(?:inline\s+)?(?:__attribute__\(\(\w+\)\)\s+)?[a-z_0-9 ]+?[\s*]+(tl_\w+)\([^;{]*\)\s*\{", re.M)
src = {f: re.sub(r"/\*.*?\*/", "", open(f).read(), flags=re.S) for f in files}
defs = {}
for f, s in src.items():
    for m in defn.finditer(s):
        defs.setdefault(m.group(1), mod(f))
graph = collections.defaultdict(set)
bad = []
for f, s in src.items():
    body = "\n".join(l for l in s.split("\n") if l[:1] in ("\t", " "))  # calls, not prototypes
    for m in re.finditer(r"\b(tl_\w+)\(", body):
        d = defs.get(m.group(1))
        if d and d != mod(f):
            graph[mod(f)].add(d)
    if os.path.basename(os.path.dirname(f)) != "loop" and mod(f) not in TOP and re.search(r'#include "loop/loop\.h"', s):
        bad.append("%s includes loop.h" % os.path.basename(f))
cycles = set()
def walk(n, stack):
    for m in sorted(graph.get(n, ())):
        if m in stack:
            cycles.add(" -> ".join(stack[stack.index(m):] + [m]))
        else:
            walk(m, stack + [m])
for n in sorted(graph):
    walk(n, [n])
if "-v" in sys.argv:
    for n in sorted(graph):
        print("%-10s -> %s" % (n, " ".join(sorted(graph[n]))))
for c in sorted(cycles):
    bad.append("call cycle: " + c)
for b in bad:
    print("layers:", b, file=sys.stderr)
sys.exit(1 if bad else 0)
