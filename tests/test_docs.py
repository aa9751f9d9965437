"""Every fenced ```python block of README.md and docs/*.md runs, so a page cannot drift from the code.

The blocks of one page run in order in one namespace (a page may build on its own earlier blocks), in a
fresh temporary directory, so what a block writes never lands in the repository. A block that needs the
network, a runtime this machine may lack, or a long run is marked by an HTML comment on the line before its
fence, and then only its imports run:

    <!-- doc-test: imports-only (why) -->

A block that shows a function's signature is written as a ``def`` with a body of ``...`` and marked

    <!-- doc-test: signature of package.module.function -->

and then its parameters (names, kinds, order, defaults) must equal the function's own.

A failure names the page and the line of the block's fence, and the traceback points at the line of the
page itself (each block is compiled under the page's name, at its own line numbers).

Beside the blocks, what pages name must exist: every repository file named in backticks or linked (README,
docs/, CONTRIBUTING, the benchmark index), every ``onnx_compat.x.y``; the README lists every docs page and
every CLI verb, and CONTRIBUTING describes every test file.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import re
import textwrap
import traceback
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
# pages whose file names and links must exist too (the benchmark index is generated from the scripts)
NAMING_PAGES = PAGES + [ROOT / "CONTRIBUTING.md", ROOT / "benchmarks" / "README.md"]
NAMED_PATH = re.compile(r"`((?:onnx_compat|tests|benchmarks|docs|deploy|constraints|\.ci)/[\w./-]*\w)(?:::[\w\[\], -]+)?`")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
BUILT = ("deploy/cpp/build/",)  # made by `make native`, named by the docs before it exists
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w+-]*)\s*$")
MARK = re.compile(r"<!--\s*doc-test:\s*(?P<mode>[\w-]+)(?:\s+of\s+(?P<target>[\w.]+))?(?P<why>.*?)-->")
MODES = ("run", "imports-only", "signature")


@dataclass
class Block:
    page: Path
    line: int          # 1-based line of the opening fence
    source: str        # dedented body
    mode: str          # one of MODES
    target: str = ""   # signature mode: the dotted name of the function shown

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def python_blocks(page: Path) -> list[Block]:
    """The page's ```python blocks in order, each with its mode (from a doc-test comment just above it)."""
    lines = page.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        end = next((j for j in range(i + 1, len(lines)) if FENCE.match(lines[j])
                    and FENCE.match(lines[j])["lang"] == ""), None)
        if end is None:
            raise AssertionError(f"{page.relative_to(ROOT)}:{i + 1}: fence never closed")
        if opening["lang"] == "python":
            mark = MARK.search(_line_above(lines, i))
            mode = mark["mode"] if mark else "run"
            if mode not in MODES:
                raise AssertionError(f"{page.relative_to(ROOT)}:{i}: unknown doc-test mode {mode!r}, "
                                     f"expected one of {MODES}")
            blocks.append(Block(page, i + 1, textwrap.dedent("\n".join(lines[i + 1:end])), mode,
                                (mark["target"] or "") if mark else ""))
        i = end + 1
    return blocks


def _line_above(lines: list[str], i: int) -> str:
    j = i - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    return lines[j] if j >= 0 else ""


def imports_of(source: str) -> str:
    """Only the import statements of a block (at any depth), each on its own line, keeping line numbers."""
    tree = ast.parse(source)
    kept = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    out = [""] * len(source.splitlines())
    for node in kept:
        out[node.lineno - 1] = ast.unparse(node)
    return "\n".join(out)


def run_block(block: Block, namespace: dict) -> None:
    failure = None
    try:
        if block.mode == "signature":
            failure = signature_mismatch(block)
        else:
            name = str(block.page.relative_to(ROOT))
            whole = compile("\n" * block.line + block.source, name, "exec")   # the whole block must parse
            if block.mode == "run":
                exec(whole, namespace)
            else:
                exec(compile("\n" * block.line + imports_of(block.source), name, "exec"), namespace)
                failure = missing_module_attributes(block, namespace)
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # noqa: BLE001 - reported with the page and line, then failed
        failure = f"{type(error).__name__}: {error}\n{traceback.format_exc()}"
    if failure is not None:
        pytest.fail(f"{block.where}: the ```python block ({block.mode}) failed: {failure}", pytrace=False)


def missing_module_attributes(block: Block, namespace: dict) -> str | None:
    """In a block whose imports alone run: every `module.name` it uses on an imported module must exist."""
    missing = []
    for node in ast.walk(ast.parse(block.source)):
        if not isinstance(node, ast.Attribute):
            continue
        chain, base = [node.attr], node.value
        while isinstance(base, ast.Attribute):
            chain.insert(0, base.attr)
            base = base.value
        value = namespace.get(base.id) if isinstance(base, ast.Name) else None
        for attr in chain:
            if not isinstance(value, types.ModuleType):
                break
            if not hasattr(value, attr):
                missing.append(f"{value.__name__}.{attr} (line {block.line + node.lineno})")
                break
            value = getattr(value, attr)
    return f"the block uses names its modules lack: {', '.join(sorted(set(missing)))}" if missing else None


def signature_mismatch(block: Block) -> str | None:
    """None when the block's ``def`` has the parameters of the function it names, else what differs."""
    if not block.target:
        return "a signature block must name its function: <!-- doc-test: signature of pkg.mod.func -->"
    module_name, _, name = block.target.rpartition(".")
    actual = inspect.signature(getattr(importlib.import_module(module_name), name))
    shown = next((n for n in ast.parse(block.source).body if isinstance(n, ast.FunctionDef)), None)
    if shown is None or shown.name != name:
        return f"the block holds no `def {name}(...)`"
    exec(compile(ast.Module([_stub(shown)], []), block.where, "exec"), ns := {})
    expected = [(p.name, p.kind, p.default) for p in inspect.signature(ns[name]).parameters.values()]
    real = [(p.name, p.kind, p.default) for p in actual.parameters.values()]
    if expected != real:
        shown_names, real_names = [p[0] for p in expected], [p[0] for p in real]
        differ = [f"only in the code: {[n for n in real_names if n not in shown_names]}",
                  f"only on the page: {[n for n in shown_names if n not in real_names]}",
                  f"kind or default differs: {[a[0] for a, b in zip(expected, real) if a[0] == b[0] and a != b]}"]
        return (f"{'; '.join(differ)}\nthe page shows\n  {inspect.signature(ns[name])}\nbut {block.target} is\n"
                f"  {actual}")
    return None


def _stub(shown: ast.FunctionDef) -> ast.FunctionDef:
    """The shown def without annotations, so its defaults are evaluated and nothing else."""
    args = shown.args
    for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
        if arg is not None:
            arg.annotation = None
    shown.returns, shown.decorator_list, shown.body = None, [], [ast.Expr(ast.Constant(...))]
    return ast.fix_missing_locations(shown)


PAGES_WITH_BLOCKS = [page for page in PAGES if python_blocks(page)]


@pytest.mark.parametrize("page", PAGES_WITH_BLOCKS, ids=lambda p: str(p.relative_to(ROOT)))
def test_page_blocks_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__doc_test__"}
    for block in python_blocks(page):
        run_block(block, namespace)


def test_marks_are_on_python_blocks():
    """A doc-test comment must sit right above a ```python fence; elsewhere it would silently do nothing."""
    for page in PAGES:
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            if not MARK.search(line):
                continue
            following = next((lines[j] for j in range(i + 1, len(lines)) if lines[j].strip()), "")
            fence = FENCE.match(following)
            assert fence and fence["lang"] == "python", \
                f"{page.relative_to(ROOT)}:{i + 1}: doc-test comment not followed by a ```python block"


@pytest.mark.parametrize("page", NAMING_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_files_and_links_exist(page):
    """A file a page names in backticks (`onnx_compat/...`, `tests/...`, `benchmarks/...`, ...) or links to is
    there: a renamed or deleted file cannot stay in the docs."""
    missing = []
    for number, line in enumerate(page.read_text().splitlines(), start=1):
        named = [ROOT / m for m in NAMED_PATH.findall(line) if not m.startswith(BUILT)]
        linked = [page.parent / m for m in LINK.findall(line) if not re.match(r"[a-z]+:", m)]
        missing += [f"{page.relative_to(ROOT)}:{number}: {p.resolve().relative_to(ROOT)}"
                    for p in named + linked if not p.exists()]
    assert not missing, "named but not there:\n" + "\n".join(missing)


DOTTED = re.compile(r"`(onnx_compat(?:\.[A-Za-z_]\w*)+)")


def _resolves(dotted: str) -> bool:
    """``onnx_compat.a.b``: an attribute chain from the package, importing a submodule only where no attribute
    of that name exists (so an old path's shim is never imported over a public function)."""
    obj = importlib.import_module("onnx_compat")
    for part in dotted.split(".")[1:]:
        if hasattr(obj, part):
            obj = getattr(obj, part)
        elif isinstance(obj, types.ModuleType):
            try:
                obj = importlib.import_module(f"{obj.__name__}.{part}")
            except ImportError:
                return False
        else:
            return False
    return True


@pytest.mark.parametrize("page", NAMING_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_named_onnx_compat_names_exist(page):
    """Every `onnx_compat.x.y` a page names in backticks is a module, class, function or attribute that exists."""
    missing = [f"{page.relative_to(ROOT)}:{number}: {name}"
               for number, line in enumerate(page.read_text().splitlines(), start=1)
               for name in DOTTED.findall(line) if not _resolves(name)]
    assert not missing, "named but not in the package:\n" + "\n".join(missing)


def test_contributing_names_every_test_file():
    """CONTRIBUTING's table of test files has a row for each, so a new area is described where people look."""
    text = (ROOT / "CONTRIBUTING.md").read_text()
    unnamed = [p.name for p in sorted((ROOT / "tests").glob("test_*.py")) if f"`{p.name}`" not in text]
    assert not unnamed, f"CONTRIBUTING.md's 'What each test file covers' lacks {unnamed}"


def test_readme_lists_every_page_of_docs():
    """The README's Documentation list (between its docs:begin/docs:end markers) links every page of docs/."""
    text = (ROOT / "README.md").read_text()
    listed = set(re.findall(r"\]\((docs/[\w.-]+\.md)", text[text.index("<!-- docs:begin"):text.index("<!-- docs:end")]))
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages <= listed, f"README.md's Documentation list lacks {sorted(pages - listed)}"


def test_readme_names_every_cli_verb():
    """The README's one-line list of verbs is the CLI's verb table."""
    from onnx_compat.cli import VERBS
    text = " ".join((ROOT / "README.md").read_text().split())
    listed = re.search(r"`onnx-compat ((?:[\w-]+ \| )+[\w-]+)`", text)
    assert listed, "README.md lists no `onnx-compat a | b | ...` verbs"
    assert listed.group(1).split(" | ") == list(VERBS), f"README lists {listed.group(1)}; the CLI has {list(VERBS)}"


def test_parser_finds_indented_blocks_and_marks(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("text\n\n<!-- doc-test: imports-only (network) -->\n```python\nimport os\nos.urandom(1)\n"
                    "```\n\n1. item\n   ```python\n   x = 1\n   ```\n```\nnot python\n```\n")
    blocks = [(b.line, b.mode, b.source) for b in python_blocks(page)]
    assert blocks == [(4, "imports-only", "import os\nos.urandom(1)"), (10, "run", "x = 1")]
    assert imports_of("import os\nx = os.getpid()\nfrom math import pi") == "import os\n\nfrom math import pi"


def test_failure_names_page_and_line(tmp_path):
    page = ROOT / "docs" / "x.md"
    block = Block(page, 7, "a = 1\nraise RuntimeError('boom')", "run")
    with pytest.raises(pytest.fail.Exception) as failed:
        run_block(block, {})
    message = str(failed.value)
    assert "docs/x.md:7" in message and "RuntimeError: boom" in message
    assert 'File "docs/x.md", line 9' in message   # the page's own line of the raise


def test_signature_blocks_are_compared(tmp_path):
    shown = "def dumps(obj, *, skipkeys=False, ensure_ascii=True, check_circular=True, allow_nan=True, cls=None,\n" \
            "          indent=None, separators=None, default=None, sort_keys=False, **kw): ..."
    assert signature_mismatch(Block(ROOT / "x.md", 1, shown, "signature", "json.dumps")) is None
    wrong = shown.replace("indent=None", "indent=2")
    assert "but json.dumps is" in signature_mismatch(Block(ROOT / "x.md", 1, wrong, "signature", "json.dumps"))


def test_imports_only_blocks_are_parsed_and_their_module_names_checked():
    ok = Block(ROOT / "x.md", 1, "import json\njson.dumps(network_call())", "imports-only")
    run_block(ok, {})
    for source, expected in (("import json\njson.no_such_function(1)", "json.no_such_function"),
                             ("import json\njson.dumps(", "SyntaxError")):
        with pytest.raises(pytest.fail.Exception, match=expected):
            run_block(Block(ROOT / "x.md", 1, source, "imports-only"), {})


def test_a_dotted_name_that_is_gone_is_found():
    assert _resolves("onnx_compat.errors.OnnxCompatError") and _resolves("onnx_compat.export")
    # the import docs/quantize.md once showed: onnx_compat.quantize is the function, not a module
    assert not _resolves("onnx_compat.quantize.QuantizationError") and not _resolves("onnx_compat.no_such")
