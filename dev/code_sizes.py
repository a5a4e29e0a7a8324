"""Print the package's size figures: the largest modules, classes and functions (lines, branches).

Usage: ``python dev/code_sizes.py [--top N]``. Branches count if/for/while/try/with/match arms,
boolean operators and comprehension conditions, the usual cyclomatic reading.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "airflow_provider_pulsarstate"
SKIP = ("testing/pulsar_standalone",)


def _branches(node: ast.AST) -> int:
    count = 0
    for child in ast.walk(node):
        if isinstance(child, (ast.If, ast.For, ast.AsyncFor, ast.While, ast.IfExp, ast.ExceptHandler)):
            count += 1
        elif isinstance(child, ast.BoolOp):
            count += len(child.values) - 1
        elif isinstance(child, ast.comprehension):
            count += 1 + len(child.ifs)
        elif isinstance(child, ast.match_case):
            count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--top", type=int, default=10)
    top = parser.parse_args().top
    modules: list[tuple[int, str]] = []
    classes: list[tuple[int, str]] = []
    functions: list[tuple[int, int, str]] = []
    total = 0
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(SKIP):
            continue
        source = path.read_text()
        lines = len(source.splitlines())
        total += lines
        modules.append((lines, rel))
        for node in ast.walk(ast.parse(source)):
            size = (node.end_lineno or node.lineno) - node.lineno + 1 if hasattr(node, "lineno") else 0
            if isinstance(node, ast.ClassDef):
                classes.append((size, f"{rel}:{node.name}"))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions.append((size, _branches(node), f"{rel}:{node.name}"))
    print(f"package: {len(modules)} modules, {total:,} lines")
    print(f"modules over 500 lines: {sum(1 for n, _ in modules if n > 500)}")
    print(f"classes over 400 lines: {sum(1 for n, _ in classes if n > 400)}")
    print(f"functions over 60 lines or 15 branches: {sum(1 for n, b, _ in functions if n > 60 or b > 15)}")
    print("\n| largest modules | lines |\n|---|---|")
    for n, name in sorted(modules, reverse=True)[:top]:
        print(f"| {name} | {n} |")
    print("\n| largest classes | lines |\n|---|---|")
    for n, name in sorted(classes, reverse=True)[:top]:
        print(f"| {name} | {n} |")
    print("\n| longest functions | lines | branches |\n|---|---|---|")
    for n, b, name in sorted(functions, reverse=True)[:top]:
        print(f"| {name} | {n} | {b} |")


if __name__ == "__main__":
    main()
