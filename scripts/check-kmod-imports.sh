#!/usr/bin/env bash
# Holds the layering of kmod/: prints which modules each file imports, and
# fails when those imports form a cycle, when a file outside the wrapper
# files (the ones that stand in for abstractions 7.3's kernel crate lacks)
# reaches the raw C API (`bindings::`, `extern "C"`), or when an unsafe fn
# has no `# Safety` section (clippy checks that only for exported fns; the
# SAFETY comments of unsafe blocks are clippy's, in the CLIPPY=1 build).
#   scripts/check-kmod-imports.sh [DIR]   check DIR (default: kmod/)
#   scripts/check-kmod-imports.sh --self-test
#                                         show that each of those is caught
source "$(dirname "$0")/common.sh"

# The wrapper files: each is one small safe wrapper over raw bindings for one
# missing 7.3 abstraction (see the file's own header comment). Every other
# file is driver logic and uses only the kernel crate and these wrappers.
WRAPPERS="aer bar_regions capability delayed_work dma_buffer pci_function pci_info poll text_param user_mapping"

check() {
    WRAPPERS="$WRAPPERS" SCRIPTS="$(dirname "${BASH_SOURCE[0]}")" python3 - "$1" <<'PY'
import os, re, sys
sys.path.insert(0, os.environ["SCRIPTS"])
from import_cycles import cycles

src = sys.argv[1]
wrappers = set(os.environ["WRAPPERS"].split())
files = sorted(f for f in os.listdir(src) if f.endswith(".rs"))
modules = {f[:-3] for f in files}

def code(text):
    """The text without comments (doc comments included)."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"//[^\n]*", "", text)

def use_groups(text):
    """First path segment of every item of each `use crate::{...}` group."""
    out = []
    for m in re.finditer(r"\buse\s+crate::\{", text):
        depth, i, start = 1, m.end(), m.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        body, depth, item = text[start:i - 1], 0, ""
        for c in body + ",":
            if c == "," and depth == 0:
                name = re.match(r"\s*(\w+)", item)
                if name:
                    out.append(name.group(1))
                item = ""
                continue
            depth += {"{": 1, "}": -1}.get(c, 0)
            item += c
    return out

texts = {f[:-3]: code(open(os.path.join(src, f)).read()) for f in files}
# The crate root is the file that declares the other files as modules.
roots = [m for m, t in texts.items() if re.search(r"^\s*mod\s+\w+\s*;", t, re.M)]
if len(roots) != 1:
    sys.exit(f"{src}: expected one crate root (the file with `mod x;` lines), found {roots}")
root = roots[0]

graph, failures = {}, []
for module, text in texts.items():
    if module == root:
        names = re.findall(r"(?<![\w:])(\w+)::", text)
    else:
        names = re.findall(r"\b(?:crate|super)::(\w+)", text) + use_groups(text)
    deps = set()
    for name in names:
        if module == root:
            if name in modules and name != root:
                deps.add(name)
        elif name == "self":
            continue
        else:
            # `crate::ITEM` for an item of the root is an import of the root.
            deps.add(name if name in modules else root)
    deps.discard(module)
    graph[module] = sorted(deps)
    if module not in wrappers and module != root and re.search(r"\bbindings::|extern\s+\"C\"", text):
        failures.append(f"{module}.rs: raw `bindings::`/`extern \"C\"` outside the wrapper files ({' '.join(sorted(wrappers))})")

# Every unsafe fn documents its contract, except methods of a trait impl
# (the trait's documentation holds it).
for f in files:
    lines = open(os.path.join(src, f)).read().split("\n")
    impl = ""
    for i, line in enumerate(lines):
        if re.match(r"(unsafe\s+)?impl\b", line):
            impl = line
        elif re.match(r"\S", line) and not line.startswith(("}", "#", "//")):
            impl = ""
        if not re.search(r"\bunsafe\s+(extern\s+\"C\"\s+)?fn\b", code(line)):
            continue
        if line.startswith(" ") and re.search(r"\sfor\s", impl):
            continue
        doc, j = [], i - 1
        while j >= 0 and lines[j].strip().startswith(("///", "#[")):
            doc.append(lines[j])
            j -= 1
        if not any("# Safety" in d for d in doc):
            failures.append(f"{f}:{i + 1}: unsafe fn without a `# Safety` section")

for module in sorted(graph):
    print(f"{module}: {' '.join(graph[module]) or '-'}")

for cycle in cycles(graph):
    failures.append("import cycle: " + " -> ".join(cycle))

for f in failures:
    print(f"error: {f}", file=sys.stderr)
sys.exit(1 if failures else 0)
PY
}

self_test() {
    # Global and removed on EXIT: a failing check exits from inside this function.
    dir="$(mktemp -d)"
    trap 'rm -rf "$dir"' EXIT
    mkdir "$dir/good" "$dir/cycle" "$dir/raw"
    # A root, a wrapper with raw calls, a logic file over it.
    printf 'mod a;\nmod capability;\nfn f() { a::g(); }\n' >"$dir/good/main.rs"
    printf 'use crate::capability::{self, check};\nuse crate::{capability};\n// crate::main would be a cycle, but this is a comment\n' >"$dir/good/a.rs"
    printf 'fn c() { unsafe { kernel::bindings::capable(21) }; }\n' >"$dir/good/capability.rs"
    cp "$dir/good/"*.rs "$dir/cycle/"
    cp "$dir/good/"*.rs "$dir/raw/"
    printf 'use crate::a;\nfn c() { unsafe { kernel::bindings::capable(21) }; }\n' >"$dir/cycle/capability.rs"
    printf 'extern "C" { fn helper(); }\n' >>"$dir/raw/a.rs"
    mkdir "$dir/safety"
    cp "$dir/good/"*.rs "$dir/safety/"
    printf '/// # Safety\n///\n/// None.\nunsafe fn ok() {}\nunsafe impl T for U {\n    unsafe fn m() {}\n}\n/// Undocumented.\npub(crate) unsafe fn f() {}\n' >>"$dir/safety/a.rs"
    check "$dir/good" >/dev/null || die "self-test: an acyclic tree was refused"
    check "$dir/cycle" >/dev/null 2>"$dir/err" && die "self-test: a cycle was not detected"
    grep -q 'import cycle: a -> capability -> a' "$dir/err" || die "self-test: wrong cycle report: $(cat "$dir/err")"
    check "$dir/raw" >/dev/null 2>"$dir/err" && die "self-test: extern \"C\" in a logic file was not detected"
    grep -q '^error: a.rs: raw' "$dir/err" || die "self-test: wrong raw-call report: $(cat "$dir/err")"
    check "$dir/safety" >/dev/null 2>"$dir/err" && die "self-test: an unsafe fn without # Safety was not detected"
    [ "$(cat "$dir/err")" = "error: a.rs:12: unsafe fn without a \`# Safety\` section" ] ||
        die "self-test: wrong # Safety report: $(cat "$dir/err")"
    log "check-kmod-imports self-test: a cycle, a raw call outside the wrappers and an undocumented unsafe fn are refused"
}

if [ "${1:-}" = "--self-test" ]; then
    self_test
else
    check "${1:-$REPO_ROOT/kmod}"
fi
