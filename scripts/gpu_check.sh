#!/usr/bin/env bash
# speedkit's two prepared GPU checks (scripts/gpu_check.py says what each measures; bench/README.md, "On a GPU").
#
#   scripts/gpu_check.sh prepare [IMAGE_FOLDER]   # here, before a lease: fills .gpu-carry/ (git-ignored) with
#                                                 # litdata's wheel, Fashion-MNIST, the Python docs and,
#                                                 # from IMAGE_FOLDER, the imagenet part's shard set
#   scripts/gpu_check.sh rehearse [--with-presets] [TORCH TORCHVISION]   # here, before a lease: the checks' CPU
#                                                 # rehearsal and the compile tests on the device's torch (default
#                                                 # 2.11.0, 0.26.0); with every seed preset compiled by Inductor
#   scripts/gpu_check.sh next                     # on the device: the first check not yet run on this code
#   scripts/gpu_check.sh throughput|time-to-target [--out DIR] [--only PART,...]
#
# On the device machine it installs the carried wheels into /tmp/speedkit-site and points speedkit at the carried
# data before it runs the check; results go under $OUT/<date>-gpu-<device>/ there (bench/results/... elsewhere).
set -euo pipefail
cd "$(dirname "$0")/.."
CARRY=.gpu-carry
PYTHON="${PYTHON:-python3}"

if [ "${1:-}" = prepare ]; then
    mkdir -p "$CARRY/wheels" "$CARRY/fashion-mnist" .git/info
    grep -qxF "/$CARRY/" .git/info/exclude 2>/dev/null || echo "/$CARRY/" >> .git/info/exclude
    # litdata (the streaming loaders), which the device's image lacks (KINDS.md's package list); boto3 and botocore,
    # which it imports for its S3 client, are stood in for on the device (s3_stand_ins below): botocore's wheel
    # alone is 17 MiB of the 64 a call may send, room the imagenet part's shard set needs
    rm -f "$CARRY"/wheels/*.whl
    "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d "$CARRY/wheels" litdata==0.2.76
    cp /usr/share/datasets/fashion-mnist/*.gz "$CARRY/fashion-mnist/"          # apt-get install dataset-fashion-mnist
    tar -cJf "$CARRY/python-docs.tar.xz" -C /usr/share/doc/python3.11/html _sources   # apt-get install python3.11-doc
    if [ -n "${2:-}" ]; then  # an ImageNet-layout folder, e.g. scripts/build_photo_crops.py --images 2500
        rm -rf "$CARRY/imagenet-shards"
        "$PYTHON" -m speedkit data prepare "$2" --out "$CARRY/imagenet-shards" --short-side 96 --quality 80
    fi
    du -sh "$CARRY"/*
    # the device tool sends the working tree and the carried folder together, at most 64 MiB
    total=$(( $(git ls-files -z | xargs -0 cat | wc -c) + $(du -sb "$CARRY" | cut -f1) ))
    echo "gpu-check prepare: the tree and $CARRY come to $(( total >> 20 )) MiB of the 64 MiB a call may send"
    [ "$total" -lt $(( 62 << 20 )) ] || { echo "too large: use a smaller IMAGE_FOLDER" >&2; exit 1; }
    exit 0
fi

if [ "${1:-}" = rehearse ]; then
    # The device's torch (the device library's KINDS.md) is older than this machine's, and TorchDynamo differs
    # between them: a virtual environment with that torch and torchvision laid over the project's .venv (their
    # other packages come from it), kept under /tmp, runs what would meet the difference first.
    shift
    presets=""
    if [ "${1:-}" = --with-presets ]; then presets=1; shift; fi
    torch_version="${1:-2.11.0}" vision_version="${2:-0.26.0}"
    venv="/tmp/speedkit-torch-$torch_version"
    if [ ! -x "$venv/bin/python" ]; then
        "$(.venv/bin/python -c 'import sys; print(sys._base_executable)')" -m venv "$venv"
        "$venv/bin/python" -m pip install -q --no-deps "torch==$torch_version" "torchvision==$vision_version"
        site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        .venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$site/zz-project-venv.pth"
    fi
    "$venv/bin/python" -c 'import torch, torchvision; print("gpu-check rehearse: torch", torch.__version__,
                                                            "torchvision", torchvision.__version__)'
    export PYTHONPATH="$PWD" OMP_NUM_THREADS=1
    "$venv/bin/python" -m pytest -q -p no:cacheprovider -n 2 --dist loadfile tests/cli/test_gpu_check.py \
        tests/callbacks/test_counting_a_compiled_model.py tests/methods/test_methods_optim.py \
        tests/train/test_step_kernels.py tests/optim/test_muon_batched.py tests/train/test_gpu_ready.py
    if [ -n "$presets" ]; then
        OMP_NUM_THREADS=2 "$venv/bin/python" scripts/compile_seed_presets.py \
            --out "/tmp/compile-seed-presets-$torch_version.json"
    fi
    exit 0
fi

# Modules that answer litdata's top-level imports of boto3 and botocore (its S3 client) where they are not
# installed: the checks stream local shards only, and any use of S3 raises, naming why.
s3_stand_ins() {
    local site="$1" module
    for module in boto3 boto3/s3 botocore; do mkdir -p "$site/$module"; done
    for module in boto3/__init__ boto3/s3/__init__ boto3/s3/transfer botocore/__init__ botocore/credentials \
            botocore/utils; do
        cat > "$site/$module.py" <<'PY'
"""A stand-in written by scripts/gpu_check.sh: litdata imports this for its S3 client, which the GPU checks
(local shards only) never use."""


class _NoS3:
    def __init__(self, *args, **kwargs):
        raise RuntimeError("S3 is not available in speedkit's GPU checks: boto3 is not installed, and they "
                           "stream local shards only")


def __getattr__(name):
    return _NoS3
PY
    done
}

if [ "${1:-}" = s3-stand-ins ]; then  # for a test on this machine: s3-stand-ins DIR
    s3_stand_ins "$2"
    exit 0
fi

if [ -d "$CARRY/wheels" ] && ! "$PYTHON" -c "import litdata" 2>/dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/speedkit-site "$CARRY"/wheels/*.whl
    "$PYTHON" -c "import boto3, botocore" 2>/dev/null || s3_stand_ins /tmp/speedkit-site
    export PYTHONPATH="/tmp/speedkit-site${PYTHONPATH:+:$PYTHONPATH}"
fi
[ -d "$CARRY/fashion-mnist" ] && export SPEEDKIT_DATA="$PWD/$CARRY/fashion-mnist"
if [ -f "$CARRY/python-docs.tar.xz" ] && [ ! -d /usr/share/doc/python3.11/html/_sources ]; then
    # speedkit reads the Python docs where Debian installs them (speedkit/data/text.py)
    mkdir -p /usr/share/doc/python3.11/html && tar -xJf "$CARRY/python-docs.tar.xz" -C /usr/share/doc/python3.11/html
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec "$PYTHON" scripts/gpu_check.py "$@"
