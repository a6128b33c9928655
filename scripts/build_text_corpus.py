"""Build the language rehearsal corpus from Debian packages' documentation: English technical prose that no
preset, default or search was tuned on, as a text folder for `speedkit data prepare` (BPE token shards) and the
`gpt2` task.

Not python3.11-doc (the ``pydocs`` task's presets were tuned on it) and not perl-doc (the held-out ``perldoc``
set of scripts/build_heldout_sets.py). What it takes, each as plain text:

- ``linux-doc-*``: the kernel's Documentation/ (reStructuredText and .txt; translations/ left out: not English);
- ``manpages``, ``manpages-dev``: the Linux man pages (roff markup stripped; pages that only point at another
  page with ``.so`` left out);
- ``debian-reference-en``: the Debian Reference, one document per chapter;
- ``gnu-standards``: the GNU Coding Standards and the GNU maintainers' information (their plain-text form).

    apt-get update && apt-get install --no-install-recommends linux-doc manpages manpages-dev \\
        debian-reference-en gnu-standards
    python scripts/build_text_corpus.py --out /work/data/debdocs
    speedkit data prepare /work/data/debdocs --out /work/data/debdocs-bpe4096 --vocab-size 4096 --block 1024

The folder holds one .txt file per document, under a folder per package. `speedkit data prepare` splits a text
folder into training and validation by whole file (``--val-fraction``, ``--seed``), so the documents held out
for validation are text training never saw, provided that no text is written twice: a document whose stripped
text equals one already written (the same page installed under two names) is left out and counted. Markup is
stripped by plain rules (no renderer), so the output is the same for the same package versions, whichever
groff or docutils is installed. The data goes under /work/data (outside git); the command above is what is
committed.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

# package (a glob for dpkg-query), the files of it to take (a regex on the installed path), and their markup.
SOURCES = (
    ("linux-doc-*", r"/Documentation/(?!translations/)(?!output/).*\.(rst|txt)(\.gz)?$", "rst"),
    ("manpages", r"^/usr/share/man/man[1-8]/[^/]+\.[1-8][a-z]*(\.gz)?$", "roff"),
    ("manpages-dev", r"^/usr/share/man/man[1-8]/[^/]+\.[1-8][a-z]*(\.gz)?$", "roff"),
    ("debian-reference-en", r"\.en\.txt(\.gz)?$", "chapters"),
    ("gnu-standards", r"\.text(\.gz)?$", "text"),
)
# Text some preset was tuned on, or that is already a held-out set: never part of this corpus.
TUNED_ON = ("python3.11-doc", "perl-doc")
MIN_CHARS = 200  # stubs shorter than this (an index page, a one-line redirect) teach nothing

# ---------------------------------------------------------------------------------------------- markup stripping

_ROFF_CHARS = {"em": "--", "en": "-", "hy": "-", "aq": "'", "dq": '"', "lq": '"', "rq": '"', "oq": "'", "cq": "'",
               "bu": "*", "co": "(c)", "rg": "(R)", "tm": "(TM)", "ti": "~", "ha": "^", "rs": "\\", "dg": "+",
               "mu": "x", "de": " degrees", "<=": "<=", ">=": ">=", "!=": "!=", "->": "->", "<-": "<-", "pl": "+",
               "mi": "-", "eq": "=", "sl": "/", "ga": "`", "aa": "'", "at": "@", "sh": "#", "lB": "[", "rB": "]",
               "lC": "{", "rC": "}", "ba": "|", "or": "|", "Tm": "(TM)", "R": "(R)"}
_ROFF_ESCAPE = re.compile(r"\\(?:f(?:\[[^\]]*\]|\(..|.)|\(([^\s]{2})|\[([^\]]*)\]|\*(?:\(..|\[[^\]]*\]|.)"
                          r"|[sk](?:[-+]?\d|\[[^\]]*\]|\([^\s]{2})|[&|^%c)]|(-|e|\\|\s|~|0|'|`|.))")
_FONT_MACROS = {"B", "I", "SM", "SB", "BR", "RB", "IR", "RI", "BI", "IB", "CW"}


def _roff_escape(match: re.Match) -> str:
    two, bracket, plain = match.group(1), match.group(2), match.group(3)
    name = two if two is not None else bracket
    if name is not None:
        return _ROFF_CHARS.get(name, "")
    if plain is None:  # a font change, a string, a size, \& and the other zero-width escapes
        return ""
    return {"-": "-", "e": "\\", "\\": "\\", "~": " ", "0": " ", "'": "'", "`": "`"}.get(plain, " " if plain.isspace()
                                                                                            else plain)


def _roff_args(text: str) -> list[str]:
    """A request's arguments: space-separated, double quotes group ("" inside them is one quote)."""
    args, current, quoted, i = [], "", False, 0
    while i < len(text):
        c = text[i]
        if c == '"':
            if quoted and text[i + 1:i + 2] == '"':
                current += '"'
                i += 1
            else:
                quoted = not quoted
        elif c in " \t" and not quoted:
            if current:
                args.append(current)
            current = ""
        else:
            current += c
        i += 1
    if current:
        args.append(current)
    return args


def strip_roff(source: str) -> str | None:
    """A man page's roff as plain text, as man lays it out less the indents: comments and layout requests
    dropped, text lines filled into paragraphs (kept line by line between .nf/.EX and .fi/.EE), font macros'
    words kept (BR's alternating fonts run together, as man prints them), headings and list tags on their own
    lines, escapes as ASCII. None for a page that only points at another (``.so``)."""
    source = re.sub(r"\\\n", "", source)  # a line continued with a backslash
    out: list[str] = []
    paragraph: list[str] = []
    fill, in_table_format, tag_next = True, False, False

    def flush(blank: bool = False) -> None:
        if paragraph:
            out.append(" ".join(paragraph))
            paragraph.clear()
        if blank:
            out.append("")

    def text(words: str) -> None:
        nonlocal tag_next
        words = _ROFF_ESCAPE.sub(_roff_escape, words)
        if tag_next:  # the tag of a .TP item: a line of its own
            flush()
            out.append(words)
            tag_next = False
        elif fill:
            if words.strip():
                paragraph.append(words.strip())
            else:
                flush(blank=True)
        else:
            out.append(words)

    for line in source.splitlines():
        if re.match(r"^['.]\s*\\\"", line) or line.startswith('\\"'):
            continue  # a comment
        if line.startswith(".so "):
            return None
        if line.startswith(".TS"):
            flush(blank=True)
            fill, in_table_format = False, True  # the lines up to the one ending in '.' give the columns
            continue
        if in_table_format:
            in_table_format = not line.rstrip().endswith(".")
            continue
        if line.startswith((".", "'")) and len(line) > 1:
            name, _, rest = line[1:].strip().partition(" ")
            if name in _FONT_MACROS:
                words = _roff_args(rest)
                text("".join(words) if len(name) == 2 and name not in ("SM", "SB", "CW") else " ".join(words))
            elif name in ("SH", "SS"):
                flush(blank=True)
                out.append(_ROFF_ESCAPE.sub(_roff_escape, " ".join(_roff_args(rest))))
            elif name == "IP":
                flush(blank=True)
                words = _roff_args(rest)
                if words:
                    out.append(_ROFF_ESCAPE.sub(_roff_escape, words[0]))
            elif name in ("TP", "TQ"):
                flush(blank=name == "TP")
                tag_next = True
            elif name in ("nf", "EX"):
                flush()
                fill = False
            elif name in ("fi", "EE", "TE"):
                flush()
                fill = True
            elif name in ("PP", "LP", "P", "sp", "HP"):
                flush(blank=True)
            elif name == "br":
                flush()
            continue  # .TH, .RS, .ad, .ds, .de ... : layout, not text
        text(line.replace("T{", "").replace("T}", ""))
    flush()
    return tidy("\n".join(out))


_RST_ROLE = re.compile(r":[\w.+-]+(?::[\w.+-]+)*:`([^`]*)`")
_RST_TARGET_TEXT = re.compile(r"^(.*?)\s*<[^<>]+>$", re.S)
_RST_UNDERLINE = re.compile(r"^([=\-~^\"'`*+#:.<>_])\1{2,}\s*$")


def _role_text(match: re.Match) -> str:
    text = match.group(1)
    titled = _RST_TARGET_TEXT.match(text)
    return (titled.group(1) if titled and titled.group(1) else text).lstrip("~!")


def strip_rst(source: str) -> str:
    """reStructuredText as plain text: comments, labels and directive lines dropped (a directive's indented body,
    code included, is kept), title over- and underlines dropped, roles and links reduced to their words."""
    out: list[str] = []
    skipping_comment = False
    for line in source.splitlines():
        if skipping_comment:
            if not line.strip() or line[:1].isspace():
                continue  # a comment's indented continuation
            skipping_comment = False
        stripped = line.strip()
        if stripped.startswith(".. "):
            if not re.match(r"\.\. [\w:.+-]+::", stripped) and not stripped.startswith(".. |"):
                skipping_comment = True  # a comment or a link target, not a directive
            continue
        if stripped == "..":
            skipping_comment = True
            continue
        if _RST_UNDERLINE.match(stripped):
            continue
        line = _RST_ROLE.sub(_role_text, line)
        line = re.sub(r"`([^`<]+?)\s*<[^`>]+>`__?", r"\1", line)  # `words <url>`_
        line = re.sub(r"``([^`]+)``", r"\1", line)
        line = re.sub(r"`([^`]+)`_{0,2}", r"\1", line)
        line = re.sub(r"(?<=\w)::$", ":", line)
        if line.strip() == "::":
            continue
        out.append(line)
    return tidy("\n".join(out))


def tidy(text: str) -> str:
    """Trailing spaces off, at most one blank line in a row, no blank lines at either end, one final newline."""
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").splitlines()]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip("\n")
    return text + "\n" if text else ""


def chapters(text: str) -> list[tuple[str, str]]:
    """A book in plain text cut at its chapter headings ("Chapter 3. Title" at a line's start), as (name, text);
    what comes before the first chapter is the "front" part."""
    marks = [m.start() for m in re.finditer(r"(?m)^(?:Chapter\s\d+|Appendix\s[A-Z])\.\s", text)]
    if not marks:
        return [("all", text)]
    bounds = [0, *marks, len(text)]
    parts = []
    for start, end in zip(bounds, bounds[1:]):
        heading = re.match(r"(Chapter|Appendix)\s(\w+)\.", text[start:start + 20])
        name = "front" if heading is None else f"{heading.group(1).lower()}-{heading.group(2).zfill(2)}"
        parts.append((name, text[start:end]))
    return [(name, part) for name, part in parts if part.strip()]


def documents(path: Path, markup: str) -> list[tuple[str, str]]:
    """(name suffix, plain text) for each document in one installed file ('' for a file that is one document)."""
    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    text = raw.decode("utf-8", errors="replace")
    if markup == "roff":
        stripped = strip_roff(text)
        return [] if stripped is None else [("", stripped)]
    if markup == "rst":
        return [("", strip_rst(text))]
    if markup == "chapters":
        return [(f"-{name}", tidy(part)) for name, part in chapters(text)]
    return [("", tidy(text))]


# -------------------------------------------------------------------------------------------------- the corpus

def installed_files(package_glob: str) -> dict[str, list[Path]]:
    """The regular files of each installed package whose name matches ``package_glob``, by package."""
    listed = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${db:Status-Status}\n", package_glob],
                            capture_output=True, text=True).stdout
    packages = sorted(line.split()[0] for line in listed.splitlines() if line.endswith(" installed"))
    files = {}
    for package in packages:
        paths = subprocess.run(["dpkg-query", "-L", package], capture_output=True, text=True, check=True).stdout
        files[package] = sorted(Path(p) for p in paths.splitlines() if Path(p).is_file() and not Path(p).is_symlink())
    return files


def output_name(package: str, path: Path, suffix: str) -> str:
    """Where a document goes in the corpus: package/path-below-its-common-root.txt (the .gz dropped)."""
    parts = path.parts
    for anchor in ("Documentation", "man"):
        if anchor in parts:  # the kernel's tree, or the man page's manN/ folder
            index = parts.index(anchor) + (1 if anchor == "Documentation" else 0)
            parts = parts[index:]
            break
    else:
        parts = parts[-1:]
    rel = "/".join(parts)
    rel = rel[:-3] if rel.endswith(".gz") else rel
    if parts[0] == "man":
        rel = rel[len("man/"):]
    return f"{package.split('-')[0] if package.startswith('linux-doc') else package}/{rel}{suffix}.txt"


def write_corpus(out: Path, picked: list[tuple[str, Path, str]], min_chars: int = MIN_CHARS) -> dict:
    """Write each document of ``picked`` ((package, installed file, markup), in order) to ``out`` once: a text
    equal to one already written, or shorter than ``min_chars``, is left out and counted."""
    seen: set[str] = set()
    counts = {"files": 0, "bytes": 0, "duplicates": 0, "too_short": 0, "by_package": {}}
    for package, path, markup in picked:
        for suffix, text in documents(path, markup):
            if len(text) < min_chars:
                counts["too_short"] += 1
                continue
            digest = hashlib.sha256(text.encode()).hexdigest()
            if digest in seen:
                counts["duplicates"] += 1
                continue
            seen.add(digest)
            target = out / output_name(package, path, suffix)
            target.parent.mkdir(parents=True, exist_ok=True)
            data = text.encode()
            target.write_bytes(data)
            counts["files"] += 1
            counts["bytes"] += len(data)
            by = counts["by_package"].setdefault(package, {"files": 0, "bytes": 0})
            by["files"] += 1
            by["bytes"] += len(data)
    return counts


def pick(sources=SOURCES) -> list[tuple[str, Path, str]]:
    picked = []
    for package_glob, pattern, markup in sources:
        found = installed_files(package_glob)
        if not found:
            raise SystemExit(f"no installed package matches {package_glob!r}: install the packages in this script's "
                             f"docstring (apt-get install ...)")
        for package, paths in found.items():
            if package in TUNED_ON:
                raise SystemExit(f"{package} is text a preset was tuned on (or a held-out set); it cannot be here")
            picked += [(package, p, markup) for p in paths if re.search(pattern, str(p))]
    return picked


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--out", type=Path, required=True, help="the folder to write the .txt files into (emptied)")
    parser.add_argument("--min-chars", type=int, default=MIN_CHARS,
                        help=f"leave out documents shorter than this after stripping (default {MIN_CHARS})")
    args = parser.parse_args(argv)
    picked = pick()
    if args.out.exists():
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True)
    counts = write_corpus(args.out, picked, args.min_chars)
    versions = subprocess.run(["dpkg-query", "-W", "-f", "${Package} ${Version}\n",
                               *sorted(counts["by_package"])], capture_output=True, text=True).stdout
    counts["versions"] = dict(line.split(" ", 1) for line in versions.splitlines() if " " in line)
    (args.out / "corpus.json").write_text(json.dumps(counts, indent=1) + "\n")
    print(f"{args.out}: {counts['files']} documents, {counts['bytes'] / 1e6:.1f} MB "
          f"({counts['duplicates']} duplicates and {counts['too_short']} stubs left out)")
    for package, by in counts["by_package"].items():
        print(f"  {package}: {by['files']} documents, {by['bytes'] / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
