#!/usr/bin/env python3
"""Import cycles among the files of the workspace's crates.

Each file is a module (src/a/b.rs and src/a/b/mod.rs are `a::b`). A file
imports another when it names a path into it: `crate::a::b::Item`,
`super::Item`, `self::x::Item`, in a `use` or inline, groups included. A
path is resolved to the file that defines the item: through the longest
prefix that is a file, then through that file's re-exports (`pub use`,
`pub(crate) use`, `pub(super) use`), so a module that only re-exports a
child's items (a facade) is not where they come from. `mod x;` lines are
declarations, not imports. Prints each file's imports and every cycle, and
exits 1 when there is one.

    scripts/check-rust-imports.py CRATE-SRC-DIR...
    scripts/check-rust-imports.py --self-test
"""

import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from import_cycles import cycles  # noqa: E402


def code(text):
    """The text without comments, string literals or char literals."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'r#+"(?:.|\n)*?"#+', '""', text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    text = re.sub(r"'(?:\\.|[^'\\])'", "''", text)
    return re.sub(r"//[^\n]*", "", text)


def modules_of(src):
    """{module path (tuple): file} of a crate's src directory."""
    found = {}
    for directory, _, files in os.walk(src):
        for name in files:
            if not name.endswith(".rs"):
                continue
            path = os.path.join(directory, name)
            parts = os.path.relpath(path, src)[:-3].split(os.sep)
            if parts[-1] in ("mod", "lib", "main") and (parts[-1] == "mod" or len(parts) == 1):
                parts = parts[:-1]
            # A binary's other roots (src/bin/x.rs) are crates of their own.
            if parts and parts[0] == "bin":
                continue
            found[tuple(parts)] = path
    return found


def expand(tree):
    """The paths a `use` tree names: `a::{b, c::{d, e}}` -> a::b, a::c::d, a::c::e."""
    tree = tree.strip()
    brace = tree.find("{")
    if brace < 0:
        return [tree] if tree else []
    prefix, body = tree[:brace], tree[brace + 1:tree.rfind("}")]
    items, depth, item = [], 0, ""
    for c in body + ",":
        if c == "," and depth == 0:
            items.append(item)
            item = ""
            continue
        depth += {"{": 1, "}": -1}.get(c, 0)
        item += c
    out = []
    for item in items:
        for path in expand(item):
            out.append(prefix + path if path != "self" else prefix.rstrip(":"))
    return out


def uses(text):
    """(visibility, path, name it is known by) of every `use` in the text,
    groups expanded (`a::b as c` is known as c)."""
    out = []
    for m in re.finditer(r"(pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", text):
        for path in expand(m.group(2)):
            alias = re.match(r"(.*?)\s+as\s+(\w+)$", path.strip())
            path = re.sub(r"\s+", "", alias.group(1) if alias else path)
            out.append((bool(m.group(1)), path, alias.group(2) if alias else path.split("::")[-1]))
    return out


def absolute(module, path):
    """`path` as seen from `module`, as a tuple from the crate root, or None
    for a path outside the crate."""
    parts = path.split("::")
    if parts[0] == "crate":
        return tuple(parts[1:])
    if parts[0] in ("self", "super"):
        base = list(module)
        while parts and parts[0] in ("self", "super"):
            if parts.pop(0) == "super":
                if not base:
                    return None
                base.pop()
        return tuple(base + parts)
    return None


def segments(module, text):
    """(module path, text) of a file's top level and of each inline `mod x {
    ... }` in it (a test module's `super` is the file), innermost apart."""
    out, top, at = [], "", 0
    for m in re.finditer(r"\bmod\s+(\w+)\s*\{", text):
        if m.start() < at:
            continue
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        top += text[at:m.start()]
        out += segments(module + (m.group(1),), text[m.end():i - 1])
        at = i
    return [(module, top + text[at:])] + out


class Crate:
    def __init__(self, src):
        self.files = modules_of(src)
        self.texts = {m: code(open(f).read()) for m, f in self.files.items()}
        # Each module's re-exports: {item name: absolute path it names}.
        self.reexports = {}
        self.local = {}
        for module, text in self.texts.items():
            exported, local = {}, {}
            for public, path, known_as in uses(segments(module, text)[0][1]):
                target = absolute(module, path)
                if target is None:
                    # `use child::Item` inside a module: relative to it.
                    first = path.split("::")[0]
                    if module + (first,) in self.files:
                        target = module + tuple(path.split("::"))
                    else:
                        continue
                (exported if public else local)[known_as] = target
            self.reexports[module] = exported
            self.local[module] = local

    def resolve(self, path, seen=()):
        """The file module that defines what `path` (absolute) names."""
        for cut in range(len(path), -1, -1):
            if path[:cut] in self.files:
                module, rest = path[:cut], path[cut:]
                break
        else:
            return None
        if rest and rest[0] in self.reexports.get(module, {}) and module not in seen:
            return self.resolve(self.reexports[module][rest[0]] + rest[1:], seen + (module,))
        return module

    def imports(self, module):
        paths = []
        for scope, text in segments(module, self.texts[module]):
            paths += [absolute(scope, p) for _, p, _ in uses(text)]
            # Paths in code; a `use` group's prefix (`a::b::{...}`) is the
            # use's, expanded above.
            def inline(pattern):
                for m in re.finditer(pattern + r"(?:::\w+)+", text):
                    if text[m.end():m.end() + 3] not in ("::{", "::*"):
                        yield m
            paths += [absolute(scope, m.group(0)) for m in inline(r"\b(?:crate|super|self)")]
            # Inline paths through a child module: `child::item(...)`.
            for m in inline(r"(?<![\w:])(\w+)"):
                first = m.group(1)
                if module + (first,) in self.files:
                    paths.append(module + tuple(m.group(0).split("::")))
                elif first in self.local[module]:
                    target = self.local[module][first]
                    paths.append(target + tuple(m.group(0).split("::")[1:]))
        deps = set()
        for path in paths:
            if path is None:
                continue
            target = self.resolve(path)
            if target is not None and target != module:
                deps.add(target)
        return deps


def name(module):
    return "::".join(module) or "(root)"


def check(sources):
    failures = []
    for src in sources:
        crate = Crate(src)
        graph = {m: sorted(crate.imports(m)) for m in crate.files}
        for module in sorted(graph):
            print(f"{src}: {name(module)}: {' '.join(map(name, graph[module])) or '-'}")
        for cycle in cycles(graph):
            failures.append(f"{src}: import cycle: " + " -> ".join(map(name, cycle)))
    for failure in failures:
        print(f"error: {failure}", file=sys.stderr)
    return not failures


def self_test():
    cases = {
        "facade": ({
            "lib.rs": "mod engine;\npub use engine::Thing;\n",
            "engine/mod.rs": "mod comm;\nmod error;\npub use comm::Comm;\npub use error::Error;\n",
            "engine/comm.rs": "use crate::engine::Error;\npub struct Comm;\n",
            "engine/error.rs": "pub struct Error;\n",
        }, None),
        "cycle": ({
            "lib.rs": "mod a;\nmod b;\n",
            "a.rs": "use crate::b::B;\npub struct A;\n",
            "b.rs": "pub struct B;\nfn f() { let _ = super::a::A; }\n",
        }, "a -> b -> a"),
        "group": ({
            "lib.rs": "mod a;\nmod b;\n",
            "a.rs": "use crate::{b::{B, C as D}};\npub struct A;\n",
            "b.rs": "// crate::a in a comment is no import\nuse super::{a::A};\npub struct B;\n",
        }, "a -> b -> a"),
        "test module": ({
            "lib.rs": "mod a;\nmod b;\npub use a::A;\n",
            "a.rs": "use crate::b::B;\npub struct A;\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n",
            "b.rs": "pub struct B;\n",
        }, None),
        "alias": ({
            "lib.rs": "mod a;\nmod b;\npub(crate) use a::f as g;\n",
            "a.rs": "pub fn f() {}\n",
            "b.rs": "use crate::g;\nfn h() { g(); }\n",
        }, None),
        "comment": ({
            "lib.rs": "mod a;\nmod b;\n",
            "a.rs": "use crate::b::B;\n",
            "b.rs": "// use crate::a::A;\nconst S: &str = \"crate::a::A\";\npub struct B;\n",
        }, None),
    }
    for label, (files, expected) in cases.items():
        with tempfile.TemporaryDirectory() as src:
            for path, text in files.items():
                os.makedirs(os.path.dirname(os.path.join(src, path)), exist_ok=True)
                open(os.path.join(src, path), "w").write(text)
            import io
            import contextlib
            err = io.StringIO()
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                ok = check([src])
            if expected is None and not ok:
                sys.exit(f"self-test {label}: refused an acyclic crate: {err.getvalue()}")
            if expected is not None and (ok or expected not in err.getvalue()):
                sys.exit(f"self-test {label}: expected the cycle {expected}, got: {err.getvalue()!r}")
    print("check-rust-imports self-test: cycles through use groups and inline paths are caught; "
          "facades, comments and strings are not cycles")


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        self_test()
    else:
        sys.exit(0 if check(sys.argv[1:]) else 1)
