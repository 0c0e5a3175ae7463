#!/usr/bin/env python3
"""checkrefs.py - every file and section a comment or a doc names must exist.

Run from anywhere inside the repository (./build.sh test runs it):

    python3 tools/checkrefs.py

It reads the prose of every tracked file (git ls-files; go.sum, testdata/
and binary files skipped): the comments of Go, C, Rust, JavaScript,
Python, shell and make files (and Python docstrings), and the whole text
of Markdown files. In that prose it fails on:

  - a section of docs/ARCHITECTURE.md cited by name (`ARCHITECTURE.md,
    "Threads"`, `ARCHITECTURE.md ("TLS")`, `ARCHITECTURE.md (Invariants)`,
    `(ARCHITECTURE, Policies)`) that is not one of its headings;
  - a section of a note quoted beside the note's name (`notes/x.md,
    "Section"`, and every quoted name on a line of ARCHITECTURE's "Notes"
    list) that is not one of that note's headings;
  - a `docs/...` path, or the target of a Markdown link, that is no file or
    folder of the repository;
  - a source file name (`ws.c`, `evq.h`, `config.go`, `layers.py`) that is
    the name of no file of the repository, unless EXTERNAL lists it; a name
    with folders (`loop/tx.c`) must also resolve as a path (from the root,
    the citing file's folder or csrc/), except in the dated notes, which
    keep the paths of their day.

A cited name matches a heading equal to it or starting with it followed by
" (", ":" or "," ("Recv bundles" matches "Recv bundles (on by default, ...)").
The files of the repository are the tracked ones plus new ones not yet
added (not ignored), so a reference to a file about to be committed passes;
CI checks a clean clone. Exit status 1 lists each bad reference as
file:line: what is missing.
"""
import functools
import os
import re
import subprocess
import sys

# Names of files outside this repository that comments may mention
# (system headers appear in #include <...>, which is code, not prose).
EXTERNAL = {
    "liburing.h",  # liburing's header
    "ssl.h", "evp.h", "openssl/ssl.h",  # the TLS library's headers
    "linux/futex.h",  # the kernel's uapi header the futex constants come from
    "proc.go",  # the Go runtime's scheduler (src/runtime/proc.go)
}

ARCH = "docs/ARCHITECTURE.md"
NOTES = "docs/notes/"
HEADING = re.compile(r"^#+\s+(.*?)\s*#*$", re.M)
# A section cited after the architecture document's name (it may wrap lines):
ARCH_CITE = re.compile(r'ARCHITECTURE(?:\.md)?(?:'
                       r'(?:\s*,\s*|\s+)\(?\s*"([^"]+)"'  # , "S" / ("S") / "S"
                       r'|\s+\(([A-Z][^()"`]*?)\)'  # (S)
                       r'|\s*,\s*([A-Z][^()"`,]*?)\))')  # (its name, S)
NOTE_CITE = re.compile(r'notes/([\w.-]+\.md)(?:\]\([^)]*\))?(?:\s*,\s*|\s+)\(?"([^"]+)"')
NOTES_LIST = re.compile(r"^- \[notes/([\w.-]+\.md)\]\([^)]*\):(.*)$", re.M)
DOCS_PATH = re.compile(r"(?<![\w.\-/])((?:\.\./)*docs/[\w./-]*[\w/])")
MD_LINK = re.compile(r"\]\(([^)\s]+)\)")
SRC_NAME = re.compile(r"(?<![\w.\-/*<])((?:[\w-]+/)*[\w-]+(?:\.[\w-]+)*\.(?:c|h|go|py))\b(?![\w/-])")


def git_files(root, *args):
    out = subprocess.run(["git", "-C", root, "ls-files", "-z", *args], capture_output=True, check=True)
    return [p for p in out.stdout.decode().split("\0") if p and os.path.isfile(os.path.join(root, p))]


def blank_code(text, kind):
    """Return text with everything but comments (and, in Python, docstrings)
    blanked to spaces, comment markers included; newlines are kept, so
    offsets and line numbers stay those of the file. kind is "c" (// and
    /* */, strings skipped), "slash" (// only) or "hash" (# and \"\"\")."""
    out = [" " if c != "\n" else c for c in text]
    i, n = 0, len(text)
    line_comment = "#" if kind == "hash" else "//"
    while i < n:
        c = text[i]
        if text.startswith(line_comment, i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out[i + len(line_comment):j] = text[i + len(line_comment):j]
            i = j
        elif kind == "c" and text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j
            # the leading " * " of a block comment's lines is no prose
            body = re.sub(r"\n[ \t]*\*(?!/)", lambda m: "\n" + " " * (len(m.group()) - 1), text[i + 2:j])
            out[i + 2:j] = body
            i = j + 2
        elif kind == "hash" and text.startswith('"""', i):
            j = text.find('"""', i + 3)
            j = n if j < 0 else j
            out[i + 3:j] = text[i + 3:j]
            i = j + 3
        elif kind == "c" and c in "\"'`":  # a string, rune or raw string: skip it
            j = i + 1
            while j < n and text[j] != c and not (c != "`" and text[j] == "\n"):
                j += 2 if text[j] == "\\" and c != "`" else 1
            i = j + 1
        else:
            i += 1
    return "".join(out)


def prose(path, text):
    """The prose of the file at path (whose text is text), or None."""
    ext = os.path.basename(path).rpartition(".")[2]
    if ext == "md":
        return text
    kind = {"go": "c", "c": "c", "h": "c", "rs": "slash", "js": "slash",
            "py": "hash", "sh": "hash", "mk": "hash", "toml": "hash", "gitignore": "hash"}.get(ext)
    return blank_code(text, kind) if kind else None


def main():
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True,
                          check=True).stdout.strip()
    files = git_files(root)  # scanned: the tracked files
    exist = set(files) | set(git_files(root, "--others", "--exclude-standard"))
    paths = exist | {p[:i] for p in exist for i, c in enumerate(p) if c == "/"}  # and folders
    names = {os.path.basename(p) for p in exist}

    def read(p):
        with open(os.path.join(root, p), "rb") as f:
            return f.read()

    @functools.cache
    def headings(md):
        return [" ".join(h.replace("`", "").split()) for h in HEADING.findall(read(md).decode())]

    def has_section(md, name):
        name = " ".join(name.split())
        return any(h == name or h.startswith((name + " (", name + ":", name + ","))
                   for h in headings(md))

    def resolves(p, *bases):
        return any(os.path.normpath(os.path.join(b, p)) in paths for b in bases)

    bad = []
    for path in files:
        if path.endswith("go.sum") or "/testdata/" in "/" + path:
            continue
        raw = read(path)
        if b"\0" in raw[:8192]:
            continue
        try:
            text = prose(path, raw.decode())
        except UnicodeDecodeError:
            continue
        if text is None:
            continue
        here = os.path.dirname(path)

        def report(pos, msg):
            bad.append((path, text.count("\n", 0, pos) + 1, msg))

        for m in ARCH_CITE.finditer(text):
            name = " ".join(next(g for g in m.groups() if g).split())
            if not has_section(ARCH, name):
                report(m.start(), f'{ARCH} has no section "{name}"')
        cites = [(m.start(), m.group(1), m.group(2)) for m in NOTE_CITE.finditer(text)]
        if path == ARCH:  # its Notes list: every quoted name is a heading of its note
            cites += [(m.start(), m.group(1), q) for m in NOTES_LIST.finditer(text)
                      for q in re.findall(r'"([^"]+)"', m.group(2))]
        for pos, note, name in cites:
            if NOTES + note in paths and not has_section(NOTES + note, name):
                report(pos, f'{NOTES + note} has no section "{" ".join(name.split())}"')
        for m in DOCS_PATH.finditer(text):
            in_link = path.endswith(".md") and text[m.start() - 2:m.start()] == "]("  # checked below
            if not in_link and not resolves(m.group(1).rstrip("/."), "", here):
                report(m.start(), f"no file {m.group(1)}")
        if path.endswith(".md"):
            for m in MD_LINK.finditer(text):
                target = m.group(1).split("#")[0]
                if target and not re.match(r"[a-z]+:", target) and not resolves(target.rstrip("/"), here):
                    report(m.start(), f"link to a missing file {target}")
        for m in SRC_NAME.finditer(text):
            ref = m.group(1)
            base = os.path.basename(ref)
            if ref in EXTERNAL or base in EXTERNAL:
                continue
            if base not in names:
                report(m.start(), f"no file named {base}")
            elif "/" in ref and not path.startswith(NOTES) and not resolves(ref, "", here, "csrc"):
                report(m.start(), f"no file {ref}")
    for path, line, msg in sorted(bad):
        print(f"{path}:{line}: {msg}")
    if bad:
        print(f"checkrefs: {len(bad)} dangling reference(s)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
