"""Lines of Python in a folder at one or more commits: all lines, and code lines alone.

::

    python benchmarks/count_lines.py trainer trainer/config --revs bb9b340 984a471 HEAD

Code lines leave out blank lines, comment lines and docstring lines, so a change that only documents
more does not count as code. The counts are read from git (``git show REV:path``), so no checkout of an
older commit is needed. Run it from the repository root.
"""

from __future__ import annotations

import argparse
import ast
import io
import subprocess
import tokenize

_NOT_CODE = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
}


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout


def docstring_lines(source: str) -> set[int]:
    """The 1-based line numbers of the module's, classes' and functions' docstrings."""
    lines: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            is_text = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
            if is_text and isinstance(first.value.value, str):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def count(source: str) -> tuple[int, int]:
    """``(all lines, code lines)`` of one Python source."""
    docstrings = docstring_lines(source)
    code: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in _NOT_CODE:
            code.update(line for line in range(token.start[0], token.end[0] + 1) if line not in docstrings)
    return len(source.splitlines()), len(code)


def count_folder(rev: str, folder: str) -> tuple[int, int, int]:
    """``(files, all lines, code lines)`` of the ``.py`` files under ``folder`` at ``rev``."""
    paths = [p for p in _git("ls-tree", "-r", "--name-only", rev, folder).split() if p.endswith(".py")]
    totals = [count(_git("show", f"{rev}:{path}")) for path in paths]
    return len(paths), sum(t[0] for t in totals), sum(t[1] for t in totals)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+")
    parser.add_argument("--revs", nargs="+", default=["HEAD"])
    args = parser.parse_args()
    print(f"{'folder':<20} {'rev':<10} {'files':>5} {'lines':>6} {'code':>6}")
    for folder in args.folders:
        for rev in args.revs:
            files, lines, code = count_folder(rev, folder)
            print(f"{folder:<20} {rev:<10} {files:>5} {lines:>6} {code:>6}")


if __name__ == "__main__":
    main()
