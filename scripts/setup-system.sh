#!/usr/bin/env bash
# Installs the Debian packages speedkit's data and browser tests use, where apt exists and we are root.
# Elsewhere it says what to install instead. Safe to run again: it only acts on what is missing.
set -u
missing=()
[ -e /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || missing+=(dataset-fashion-mnist)
[ -d /usr/share/doc/python3.11/html/_sources ] || missing+=(python3.11-doc)
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ ${#missing[@]} -eq 0 ] && exit 0

if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "setup: installing ${missing[*]} with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    if apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
        exit 0
    fi
    echo "setup: apt-get could not install ${missing[*]}; see the notes below" >&2
fi
cat >&2 <<MSG
setup: these optional system packages are missing: ${missing[*]}
  - dataset-fashion-mnist: the Fashion-MNIST files (Debian/Ubuntu: sudo apt-get install dataset-fashion-mnist).
    Without it, pass --download (or download=True) and torchvision downloads Fashion-MNIST to ~/.cache/speedkit.
  - python3.11-doc: the English text corpus for the language model (sudo apt-get install python3.11-doc),
    or point speedkit at any folder of text files.
  - chromium: used only by the browser tests, which are skipped without it.
MSG
exit 0
