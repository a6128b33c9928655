#!/usr/bin/env bash
# Installs the Debian packages speedkit's data and browser tests use, where apt exists and we are root.
# Elsewhere it says what to install instead. Safe to run again: it only acts on what is missing.
# Exit status: 0 when everything is there (or was installed), 1 when something is still missing, so CI
# (and `make test` under CI=true) stops here instead of skipping the tests that need it.
# SPEEDKIT_SETUP_CHECK_ROOT (tests only) looks for the files under another root, e.g. an empty folder.
set -u
root="${SPEEDKIT_SETUP_CHECK_ROOT:-}"
check() {
    missing=()
    [ -e "$root/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz" ] || missing+=(dataset-fashion-mnist)
    [ -d "$root/usr/share/doc/python3.11/html/_sources" ] || missing+=(python3.11-doc)
    [ -x "$root/usr/bin/chromium" ] || missing+=(chromium)
}
check
[ ${#missing[@]} -eq 0 ] && exit 0

if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "setup: installing ${missing[*]} with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    if apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
        check  # an install that "succeeds" without the files is still a failure
        [ ${#missing[@]} -eq 0 ] && exit 0
    fi
    echo "setup: apt-get could not install ${missing[*]}; see the notes below" >&2
fi
cat >&2 <<MSG
setup: these system packages that the tests need are missing: ${missing[*]}
  - dataset-fashion-mnist: the Fashion-MNIST files (Debian/Ubuntu: sudo apt-get install dataset-fashion-mnist).
    Without it, pass --download (or download=True) and torchvision downloads Fashion-MNIST to ~/.cache/speedkit.
  - python3.11-doc: the English text corpus for the language model (sudo apt-get install python3.11-doc),
    or point speedkit at any folder of text files.
  - chromium: the browser test (sudo apt-get install chromium).
  Tests that need them are skipped (and fail under CI=true).
MSG
exit 1
