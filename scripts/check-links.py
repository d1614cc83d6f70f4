#!/usr/bin/env python3
"""Every relative link in the README and docs/ resolves: the file it names
exists, and a `#anchor` names a heading there (GitHub's slugs). Prints each
broken link with its file and line, and exits 1 when there is one.

    scripts/check-links.py [FILE.md...]      (default: README.md docs/*.md)
    scripts/check-links.py --self-test
"""

import glob
import os
import re
import sys
import tempfile

LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading):
    """GitHub's anchor for a heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    with open(path) as f:
        text = re.sub(r"```.*?```", "", f.read(), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.*)$", text, re.M)}


def broken(files):
    found = []
    for path in files:
        with open(path) as f:
            lines = f.read().split("\n")
        fenced = False
        for number, line in enumerate(lines, 1):
            if line.startswith("```"):
                fenced = not fenced
            if fenced:
                continue
            for target in LINK.findall(line):
                if re.match(r"[a-z]+:", target):
                    continue
                file, _, anchor = target.partition("#")
                resolved = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
                if not os.path.exists(resolved):
                    found.append(f"{path}:{number}: {target}: no such file")
                elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
                    found.append(f"{path}:{number}: {target}: no such heading")
    return found


def self_test():
    with tempfile.TemporaryDirectory() as root:
        os.mkdir(os.path.join(root, "docs"))
        write = lambda name, text: open(os.path.join(root, name), "w").write(text)
        write("docs/a.md", "# A page\n\n## What `make` sets up\n")
        write("README.md", "[ok](docs/a.md) [ok](docs/a.md#what-make-sets-up) [web](https://x.org)\n"
                           "```\n[in code](nowhere.md)\n```\n")
        assert broken([os.path.join(root, "README.md")]) == [], "good links pass"
        write("README.md", "[file](docs/b.md)\n[anchor](docs/a.md#nothing)\n")
        problems = broken([os.path.join(root, "README.md")])
        assert len(problems) == 2 and "no such file" in problems[0] and "no such heading" in problems[1], problems
    print("check-links self-test: good links pass, a missing file and a missing heading are named")


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        self_test()
        sys.exit(0)
    files = sys.argv[1:] or ["README.md"] + sorted(glob.glob("docs/*.md"))
    problems = broken(files)
    for problem in problems:
        print(problem)
    sys.exit(1 if problems else 0)
