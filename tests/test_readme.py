"""Everything README.md shows is checked against the code, so the README cannot drift from it.

- Shell blocks (```bash / sh / console): each ``speedkit ...`` (or ``python -m speedkit ...``) line is parsed by
  the real argparse parser, so a flag or command that does not exist fails; the cheap ones (``--version``,
  ``--help``, ``tasks``, ``recipes``, ``methods``, ``env``) really run and must return 0. ``make X`` must name a
  Makefile target, and ``pip install 'torch-speedkit[EXTRA]'`` an extra of pyproject.toml.
- Inline code spans in the README's prose that start with ``speedkit `` are parsed the same way.
- Python blocks are compiled, and every ``from speedkit... import name`` / ``import speedkit...`` must resolve.
  Then the README's Python blocks run, in order, in one namespace, in a temporary folder, as a reader pasting
  them into one notebook would. Only the budgets are shortened, by the substitutions in ``TINY`` (a duration
  becomes ``3ba``, Lightning's ``max_steps`` 3, a ``make_trainer`` call without a duration gets a 3-batch one,
  and evaluation sets shrink to 5%). A block preceded by ``<!-- readme-test: compile-only -->`` (it needs a GPU,
  several processes, a model the README does not build, or a notebook front end) is compiled, not run.
- Relative links and the repository paths the README names exist, and the headline figures in its first
  paragraph are the committed benchmark's (bench/results/summary.json).
- Measurements are data: the README's prose types no speed-up or timing outside the sections `make readme`
  generates, and no module of the package names a machine.

docs/guide.md and bench/README.md get the parse-level checks too (commands parsed, Python compiled and its
speedkit imports resolved); nothing in them is run.
"""
from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import json
import re
import shlex
import statistics
from dataclasses import dataclass
from pathlib import Path

import pytest
from prerequisites import import_or_missing, require

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
OTHER_DOCS = [ROOT / "docs" / "guide.md", ROOT / "bench" / "README.md"]
SHELL = {"bash", "sh", "console", "shell"}
MARKER = re.compile(r"<!--\s*readme-test:\s*([\w-]+)\s*-->")
FENCE = re.compile(r"^```([\w+-]*)[^\n]*\n(.*?)^```", re.S | re.M)
CHEAP = {"--version", "--help", "tasks", "recipes", "methods", "env"}  # commands that run in seconds
# How a README block is shortened before it runs (and nothing else is changed): pattern -> replacement.
TINY = [
    (re.compile(r'\b(max_duration|duration)="[^"]+"'), r'\1="3ba"'),
    (re.compile(r"\bmax_steps=\d+"), "max_steps=3"),
    (re.compile(r"\bmake_trainer\(((?:(?!duration=)[^()])*)\)"),
     r'make_trainer(\1, duration="3ba", eval_fraction=0.05)'),
    (re.compile(r"\brecipe_parts\(((?:(?!max_duration=)[^()])*)\)"), r'recipe_parts(\1, max_duration="3ba")'),
    (re.compile(r"\bfashion_mnist_loaders\(((?:(?!eval_fraction=)[^()])*)\)"),
     r"fashion_mnist_loaders(\1, eval_fraction=0.05)"),  # evaluate on 500 test images, not 10,000
]


@dataclass
class Block:
    lang: str
    text: str
    line: int  # of the opening fence, 1-based
    marker: str | None  # "compile-only", or None


def blocks(markdown: str) -> list[Block]:
    found = []
    for m in FENCE.finditer(markdown):
        line = markdown.count("\n", 0, m.start()) + 1
        before = markdown[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = MARKER.fullmatch(before.strip())
        found.append(Block(m.group(1).lower(), m.group(2), line, marker.group(1) if marker else None))
    return found


def shell_lines(text: str) -> list[str]:
    """The block's commands: continuation lines joined, comments and console prompts dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    lines = []
    for raw in joined.splitlines():
        line = raw.strip().removeprefix("$ ")
        words = shlex.split(line, comments=True) if line else []
        if words:
            lines.append(shlex.join(words))
    return lines


def speedkit_argv(command: str) -> list[str] | None:
    """speedkit's arguments in ``command`` (None: not a speedkit command); a ``taskset -c N`` or ``env VAR=...``
    in front is passed over."""
    words = shlex.split(command)
    while words and (words[0] == "env" or re.fullmatch(r"\w+=\S*", words[0]) or words[0] == "taskset"):
        words = words[3:] if words[0] == "taskset" else words[1:]
    if words[:1] == ["speedkit"]:
        return words[1:]
    if words[:3] in (["python", "-m", "speedkit"], ["python3", "-m", "speedkit"]):
        return words[3:]
    return None


def parse_problem(argv: list[str]) -> str | None:
    """What the real parser says about ``speedkit ARGV`` (None: it parses)."""
    from speedkit.cli.main import _parser

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            _parser().parse_args(argv)
    except SystemExit as exit:
        if exit.code not in (0, None):  # --help and --version exit 0
            return err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {exit.code}"
    return None


def makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([A-Za-z][\w.-]*)\s*:(?!=)", text, re.M)}


def extras() -> set[str]:
    text = (ROOT / "pyproject.toml").read_text()
    try:
        import tomllib  # Python 3.11+
    except ImportError:  # 3.10: the section's keys, one per line
        section = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
        return set(re.findall(r"^([A-Za-z][\w-]*)\s*=", section, re.M))
    return set(tomllib.loads(text)["project"]["optional-dependencies"])


def command_problems(markdown: str, inline: bool = False) -> list[str]:
    """Every shell command in ``markdown`` (and, with ``inline``, every `speedkit ...` code span) that names a
    flag, command, make target or extra that does not exist."""
    commands = [(b.line, c) for b in blocks(markdown) if b.lang in SHELL for c in shell_lines(b.text)]
    if inline:
        prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), markdown)
        commands += [(prose.count("\n", 0, m.start()) + 1, m.group(1))
                     for m in re.finditer(r"`(speedkit [^`]+)`", prose)]
    problems, targets, known_extras = [], makefile_targets(), extras()
    for line, command in commands:
        words = shlex.split(command)
        if (argv := speedkit_argv(command)) is not None:
            if (problem := parse_problem(argv)) is not None:
                problems.append(f"line {line}: `{command}`: {problem}")
        elif words[0] == "make":
            for target in (w for w in words[1:] if "=" not in w and not w.startswith("-")):
                if target not in targets:
                    problems.append(f"line {line}: `{command}`: no Makefile target {target!r}")
        elif words[:2] == ["pip", "install"]:
            for spec in (w for w in words[2:] if not w.startswith("-")):
                name, _, rest = spec.partition("[")
                if name != "torch-speedkit":
                    problems.append(f"line {line}: `{command}`: installs {name!r}, not torch-speedkit")
                for extra in filter(None, rest.rstrip("]").split(",")):
                    if extra not in known_extras:
                        problems.append(f"line {line}: `{command}`: no extra {extra!r} in pyproject.toml")
    return problems


def import_problems(code: str) -> list[str]:
    """The speedkit imports in ``code`` that do not resolve."""
    import importlib

    problems = []
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "speedkit":
            try:
                module = importlib.import_module(node.module)
            except ImportError as error:
                problems.append(f"{node.module}: {error}")
                continue
            problems += [f"{node.module} has no {a.name}" for a in node.names if not hasattr(module, a.name)]
        elif isinstance(node, ast.Import):
            for alias in (a for a in node.names if a.name.split(".")[0] == "speedkit"):
                try:
                    importlib.import_module(alias.name)
                except ImportError as error:
                    problems.append(f"{alias.name}: {error}")
    return problems


def python_blocks(path: Path) -> list[Block]:
    return [b for b in blocks(path.read_text()) if b.lang in ("python", "py")]


# -- the checks ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", [README, *OTHER_DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_shown_names_flags_targets_and_extras_that_exist(path):
    markdown = path.read_text()
    assert any(b.lang in SHELL for b in blocks(markdown)), f"{path}: no shell block found (did the fences change?)"
    assert command_problems(markdown, inline=path == README) == []


@pytest.mark.parametrize("path", [README, *OTHER_DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_python_block_compiles_and_its_speedkit_imports_resolve(path):
    for block in python_blocks(path):
        compile(block.text, f"{path.name}:{block.line}", "exec")
        assert import_problems(block.text) == [], f"{path.name}, block at line {block.line}"


def test_made_up_flags_targets_extras_and_imports_are_reported():
    fake = ("Text with `speedkit train --no-such-flag` in it.\n\n```bash\nspeedkit train --task fashion-mnist "
            "--sped-up\nspeedkit benchmark --task pydocs\nspeedkit bench pydocs\nmake nothing-here\n"
            "pip install 'torch-speedkit[nope]'\npip install speedkit\nspeedkit --version   # a comment\n```\n")
    problems = command_problems(fake, inline=True)
    assert [p.split(":")[0] for p in problems] == ["line 3"] * 6 + ["line 1"]
    assert "--sped-up" in problems[0] and "benchmark" in problems[1] and "pydocs" in problems[2]
    assert "nothing-here" in problems[3] and "'nope'" in problems[4] and "'speedkit'" in problems[5]
    assert "--no-such-flag" in problems[6]
    assert import_problems("from speedkit.tasks import make_trainer, make_trainr\nimport speedkit.nothing") == [
        "speedkit.tasks has no make_trainr", "speedkit.nothing: No module named 'speedkit.nothing'"]
    assert blocks("<!-- readme-test: compile-only -->\n```python\nx = 1\n```\n")[0].marker == "compile-only"


def test_the_cheap_commands_run():
    from speedkit.cli.main import main

    commands = {shlex.join(argv) for b in blocks(README.read_text()) if b.lang in SHELL
                for c in shell_lines(b.text) if (argv := speedkit_argv(c)) and argv[0] in CHEAP}
    assert {"--version", "env", "tasks", "methods"} <= {c.split()[0] for c in commands}, commands
    for command in sorted(commands):
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                code = main(shlex.split(command))
        except SystemExit as exit:  # --version, --help
            code = exit.code or 0
        assert code == 0, f"speedkit {command} returned {code}:\n{out.getvalue()[-2000:]}"
        assert out.getvalue().strip(), f"speedkit {command} printed nothing"


def shortened(code: str) -> str:
    for pattern, replacement in TINY:
        code = pattern.sub(replacement, code)
    return code


def test_tiny_substitutions_shorten_budgets_only():
    assert shortened('Trainer(m, max_duration="3ep", stop_at=("eval/accuracy", 0.9))') == \
        'Trainer(m, max_duration="3ba", stop_at=("eval/accuracy", 0.9))'
    assert shortened('make_trainer("fashion-mnist", "hot", seed=1).fit()') == \
        'make_trainer("fashion-mnist", "hot", seed=1, duration="3ba", eval_fraction=0.05).fit()'
    assert shortened('make_trainer("t", duration="2ep")') == 'make_trainer("t", duration="3ba")'
    assert shortened('**recipe_parts("fashion-mnist:mild", model)') == \
        '**recipe_parts("fashion-mnist:mild", model, max_duration="3ba")'
    assert shortened("L.Trainer(max_steps=2000)") == "L.Trainer(max_steps=3)"
    assert shortened("fashion_mnist_loaders(batch_size=256)") == "fashion_mnist_loaders(batch_size=256, eval_fraction=0.05)"


@pytest.mark.filterwarnings("ignore")  # Lightning's advice about workers and loggers
def test_the_python_blocks_run_in_order(tmp_path, monkeypatch):
    runnable = [b for b in python_blocks(README) if b.marker != "compile-only"]
    assert len(runnable) >= 3, "the README's runnable examples went missing"
    text = "\n".join(b.text for b in runnable)
    if "fashion_mnist" in text or '"fashion-mnist"' in text:
        require("fashion-mnist")
    if "lightning" in text:
        import_or_missing("lightning.pytorch", "pip install 'torch-speedkit[lightning]'")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SPEEDKIT_PROGRESS", "0")
    namespace: dict = {"__name__": "__readme__"}
    for block in runnable:
        code = shortened(block.text)
        with contextlib.redirect_stdout(io.StringIO()):
            exec(compile(code, f"README.md:{block.line}", "exec"), namespace)
    assert namespace["record"].status in ("completed", "target_reached")  # the last Trainer run ended as it should
    assert namespace["sk"].done and namespace["trainer"].global_step == 3  # the plain loop and Lightning ran


LINK = re.compile(r"\]\(([^)#\s]+)?(?:#([^)\s]+))?\)")
REPO_PATH = re.compile(r"`((?:notebooks|tutorials|scripts|params|bench|docs|speedkit|tests)/[^`\s<>*]*)`")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


@pytest.mark.parametrize("path", [README, *OTHER_DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_links_and_named_paths_exist(path):
    markdown = path.read_text()
    problems = []
    for target, anchor in LINK.findall(markdown):
        if target.startswith(("http://", "https://")):
            continue
        file = (path.parent / target).resolve() if target else path
        if not file.exists():
            problems.append(f"link to {target}: no such file")
        elif anchor and file.suffix == ".md":
            anchors = {slug(h) for h in re.findall(r"^#+ (.+)$", file.read_text(), re.M)}
            if anchor not in anchors:
                problems.append(f"link to {target}#{anchor}: no such heading")
    if path == README:
        for name in REPO_PATH.findall(markdown):
            name = name.split(":")[0].rstrip("/")
            if not any((ROOT / f"{name}{suffix}").exists() for suffix in ("", ".ipynb", ".py")):
                problems.append(f"`{name}`: not in the repository")
    assert problems == []


def test_the_headline_figures_are_the_committed_benchmarks():
    pitch = README.read_text().split("\n## ", 1)[0]
    summary = json.loads((ROOT / "bench" / "results" / "summary.json").read_text())
    vision, language = summary["vision"], summary["language"]
    # the level each line names: the target, or the strongest baseline's final quality where that asks for more,
    # and the best recipe's speed-up there
    quality = language["final_quality"]
    level = (f"{language['target']['value']:.2f} bits per byte" if quality["is_target"]
             else f"{quality['value']:.3f} bits per byte")
    expected = [f"{vision['speedup_vs']['baseline']:.1f}x", f"{vision['speedup_vs'][vision['strongest_baseline']]:.1f}x",
                f"{quality['speedup_median']:.1f}x", f"{vision['target']['value']:.0%}", level]
    assert vision["best_recipe"] == language["best_recipe"] == "hot" and "`hot`" in pitch
    assert [figure for figure in expected if figure not in pitch] == []


def test_the_method_count_is_the_registrys():
    from speedkit.methods import REGISTRY

    readme = README.read_text()
    assert f"{len(REGISTRY)} in all" in readme.split("\n## ", 1)[0]
    assert f"All {len(REGISTRY)} methods" in readme


GENERATED = re.compile(r"<!-- ([\w-]+):start -->.*?<!-- \1:end -->", re.S)
TYPED_FIGURE = re.compile(r"\b\d+(?:\.\d+)?x\b|\b\d+(?:\.\d+)? ?(?:s|ms|seconds)\b")


def typed_figures(markdown: str) -> list[str]:
    """Speed-ups and timings written into the prose by hand: outside the generated sections and code blocks."""
    prose = FENCE.sub("", GENERATED.sub("", markdown))
    return TYPED_FIGURE.findall(re.sub(r"`[^`]*`", "", prose))


def test_the_readme_states_measured_figures_only_in_generated_sections():
    assert typed_figures(README.read_text()) == [], "put the figure in a results file and generate it (make readme)"
    planted = "It is 3.1x faster.\n<!-- headline:start -->\n6.5x\n<!-- headline:end -->\nIn 44.9 s.\n"
    assert typed_figures(planted) == ["3.1x", "44.9 s"]


def test_no_machine_names_in_the_package():
    """Measurements are data (bench/results/): code, comments, docstrings and cards name no machine."""
    machines = re.compile(r"Xeon|EPYC|Zen ?\d|Ryzen|Core i[3579]|\d-core\b|laptop")
    found = [f"{path.relative_to(ROOT)}:{n}" for path in sorted((ROOT / "speedkit").rglob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if machines.search(line)]
    assert found == []


def test_the_heldout_hosts_and_rehearsal_figures_are_the_committed_results():
    readme, results = README.read_text(), ROOT / "bench" / "results"
    for file in _readme_script().HOSTS:  # the files the README's hosts table is made from
        assert f"{json.loads((results / file).read_text())['median_ratio']:.2f}x" in readme, f"{file} is not in the README"
    for file, key in _readme_script().HELDOUT_SETS:  # the files the README's held-out table is made from
        entry = json.loads((results / file).read_text())[key]
        ratios = [r for r in entry["recipes"]["hot"]["speedup_vs"][entry["strongest_baseline"]] if r is not None]
        assert f"{statistics.median(ratios):.2f}x" in readme, f"the held-out {file} figure is not the committed one"
    for file, key in _readme_script().REHEARSALS:  # the seed's workloads rehearsed on CPU
        entry = json.loads((results / file).read_text())[key]
        for name, recipe in entry["recipes"].items():
            ratios = [r for r in recipe["speedup_vs"][entry["strongest_baseline"]] if r is not None]
            if recipe["reached"] == len(entry["seeds"]):
                assert f"{statistics.median(ratios):.2f}x" in readme, f"the rehearsal {file} is not in the README"


def _readme_script():
    spec = importlib.util.spec_from_file_location("update_readme", ROOT / "scripts" / "update_readme.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
