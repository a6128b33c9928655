"""scripts/build_text_corpus.py: the markup stripping turns man pages' roff and the kernel's reStructuredText into
plain prose, books are cut into chapters, and the corpus never holds one text twice, so that `speedkit data
prepare`'s split by file never puts a document on both sides."""
from __future__ import annotations

import fnmatch
import gzip
import importlib.util
import re
from pathlib import Path

from speedkit.data.text import split_files

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "build_text_corpus.py"
spec = importlib.util.spec_from_file_location("build_text_corpus", SCRIPT)
builder = importlib.util.module_from_spec(spec)
spec.loader.exec_module(builder)

MAN_PAGE = r""".\" Copyright (C) 1992 Somebody
.\" SPDX-License-Identifier: Linux-man-pages-copyleft
.TH open 2 2023-02-05 "Linux man-pages 6.03"
.SH NAME
open, openat \- open and possibly create a file
.SH SYNOPSIS
.nf
.B #include <fcntl.h>
.PP
.BI "int open(const char *" pathname ", int " flags );
.fi
.SH DESCRIPTION
The
.BR open ()
system call opens the file specified by
.IR pathname .
It returns \fBa file descriptor\fP \[em] a small integer \(em that
is \%never negative.
.TP
.B O_CREAT
If the file does not exist, create it.
.SH SEE ALSO
.BR read (2),
.BR write (2)
"""

RST = """.. SPDX-License-Identifier: GPL-2.0

.. _readme:

Linux kernel release 6.x <http://kernel.org/>
=============================================

These are the notes. See :ref:`the admin guide <admin_guide>` and :c:func:`kmalloc`
for ``GFP_KERNEL``, or `the site <https://kernel.org>`_.

..
   a comment over
   two lines

.. note::

   Read them carefully::

      make menuconfig
"""


def test_roff_becomes_filled_prose_without_markup():
    text = builder.strip_roff(MAN_PAGE)
    assert "Copyright" not in text and ".TH" not in text and "\\f" not in text and "\\(" not in text
    assert "open, openat - open and possibly create a file" in text
    assert "int open(const char *pathname, int flags);" in text  # BI's alternating fonts run together
    assert "#include <fcntl.h>\n\nint open" in text  # no-fill lines stay lines
    assert ("The open() system call opens the file specified by pathname. It returns a file descriptor -- a small "
            "integer -- that is never negative.") in text  # a paragraph filled onto one line
    assert "\nO_CREAT\nIf the file does not exist, create it." in text  # a .TP tag on its own line
    assert "SEE ALSO\nread(2), write(2)" in text
    assert builder.strip_roff(".so man2/open.2\n") is None  # a page that only points at another


def test_rst_keeps_the_words_and_drops_the_markup():
    text = builder.strip_rst(RST)
    assert text.startswith("Linux kernel release 6.x <http://kernel.org/>\n\nThese are the notes.")
    assert "SPDX" not in text and "_readme" not in text and "a comment" not in text and "====" not in text
    assert "See the admin guide and kmalloc\nfor GFP_KERNEL, or the site." in text
    assert "Read them carefully:\n\n      make menuconfig" in text  # a directive's body and literal block stay
    assert ".. note::" not in text


def test_a_book_is_cut_at_its_chapters_even_with_non_breaking_spaces():
    book = ("Title\n\n1. First (the table of contents)\n\nChapter\u00a01.\u00a0First\n\nOne.\n\n"
            "Chapter\u00a02.\u00a0Second\n\nTwo.\n\nAppendix\u00a0A.\u00a0Extra\n\nThree.\n")
    parts = builder.chapters(book)
    assert [name for name, _ in parts] == ["front", "chapter-01", "chapter-02", "appendix-0A"]
    assert "".join(part for _, part in parts) == book  # nothing lost, nothing repeated


def test_the_corpus_holds_each_text_once_so_a_split_by_file_never_shares_one(tmp_path):
    page = MAN_PAGE.replace("open", "{name}")
    installed = tmp_path / "usr" / "share" / "man" / "man2"
    installed.mkdir(parents=True)
    picked = []
    for name in ("open", "close", "read", "write"):
        path = installed / f"{name}.2.gz"
        path.write_bytes(gzip.compress(page.replace("{name}", name).encode()))
        picked.append(("manpages-dev", path, "roff"))
    (installed / "openat.2.gz").write_bytes(gzip.compress(page.replace("{name}", "open").encode()))  # a copy
    (installed / "creat.2.gz").write_bytes(gzip.compress(b".so man2/open.2\n"))
    (installed / "tiny.2.gz").write_bytes(gzip.compress(b".SH NAME\ntiny\n"))
    picked += [("manpages-dev", installed / n, "roff") for n in ("openat.2.gz", "creat.2.gz", "tiny.2.gz")]

    out = tmp_path / "corpus"
    counts = builder.write_corpus(out, picked)
    assert counts["files"] == 4 and counts["duplicates"] == 1 and counts["too_short"] == 1
    files = sorted(p.relative_to(out) for p in out.rglob("*.txt"))
    assert [str(f) for f in files] == [f"manpages-dev/man2/{n}.2.txt" for n in ("close", "open", "read", "write")]
    train, val = split_files(files, 0.5, seed=0)  # as `speedkit data prepare` splits a text folder
    assert train and val
    assert not {(out / f).read_text() for f in train} & {(out / f).read_text() for f in val}


def test_no_source_is_text_a_preset_was_tuned_on():
    for package_glob, _, _ in builder.SOURCES:
        assert not any(fnmatch.fnmatch(tuned, package_glob) for tuned in builder.TUNED_ON)
    kernel = Path("/usr/share/doc/linux-doc-6.1/Documentation/admin-guide/README.rst.gz")
    assert builder.output_name("linux-doc-6.1", kernel, "") == "linux/admin-guide/README.rst.txt"
    translated = "/usr/share/doc/linux-doc-6.1/Documentation/translations/it_IT/index.rst.gz"
    assert not any(re.search(pattern, translated) for _, pattern, _ in builder.SOURCES)
