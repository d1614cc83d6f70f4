"""Checks python/pcieipc/_native.pyi against the built module: every public
name, class, method and property of one is in the other, and every
signature's parameters match. Run by scripts/test-python.sh."""

import ast
import inspect
import sys
from pathlib import Path

import pcieipc._native as native

STUB = Path(__file__).resolve().parents[1] / "pcieipc" / "_native.pyi"


def stub_names():
    tree = ast.parse(STUB.read_text())
    names = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            members = {}
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    members[item.name] = [a.arg for a in item.args.args + item.args.kwonlyargs]
                elif isinstance(item, ast.AnnAssign):
                    members[item.target.id] = None
            names[node.name] = members
        elif isinstance(node, ast.AnnAssign):
            names[node.target.id] = None
    return names


def main() -> int:
    stub = stub_names()
    public = {name for name in dir(native) if not name.startswith("_")}
    problems = [f"{name}: in the module, not in the stub" for name in sorted(public - stub.keys())]
    problems += [f"{name}: in the stub, not in the module" for name in sorted(stub.keys() - public)]
    for name, members in stub.items():
        if members is None or name not in public:
            continue
        cls = getattr(native, name)
        if issubclass(cls, BaseException):
            continue
        own = {m for m in vars(cls) if not m.startswith("_")}
        for member in sorted(own - members.keys()):
            problems.append(f"{name}.{member}: in the module, not in the stub")
        for member, parameters in members.items():
            if member.startswith("__") and member != "__init__":
                continue
            if member == "__init__":
                target = cls
            elif not hasattr(cls, member):
                problems.append(f"{name}.{member}: in the stub, not in the module")
                continue
            else:
                target = getattr(cls, member)
            if parameters is None or isinstance(target, property) or not callable(target):
                continue
            try:
                signature = inspect.signature(target)
            except (TypeError, ValueError):
                continue
            actual = [p for p in signature.parameters if p not in ("self", "slf")]
            expected = [p for p in parameters if p != "self"]
            if actual != expected:
                problems.append(f"{name}.{member}: stub parameters {expected}, module {actual}")
    for name in ("PeerError", "MismatchError", "RendezvousError", "DeviceError"):
        if getattr(native, name).__bases__ != (native.Error,):
            problems.append(f"{name}: bases {getattr(native, name).__bases__}, stub says (Error,)")
    if native.InvalidArgument.__bases__ != (native.Error, ValueError):
        problems.append(f"InvalidArgument: bases {native.InvalidArgument.__bases__}")
    for problem in problems:
        print(f"stub mismatch: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
