"""What pyproject.toml cannot say: the wheel carries the notebooks, tutorials, parameter sets and committed
benchmark summary that ``speedkit demo`` and ``speedkit notebooks run`` execute.

They stay where they are in the checkout (top-level ``notebooks/``, ``tutorials/``, ``params/``,
``bench/results/summary.json``: the source); a built wheel gets a copy under ``speedkit/shipped/``, which
``speedkit.cli.shipped`` finds at run time. An editable install copies nothing: there the checkout itself is
what runs.
"""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
SHIPPED = "shipped"  # speedkit/shipped/ in the wheel; speedkit.cli.shipped.SHIPPED names the same folder
# (source in the checkout, glob patterns of the files to carry)
SHIPPED_FILES = [
    ("notebooks", ["*.ipynb", "README.md"]),
    ("tutorials", ["*.ipynb", "README.md", "expected_outputs/*.json"]),
    ("params", ["*/*.yaml"]),
    ("bench/results", ["summary.json"]),
]


class BuildWithShippedFiles(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "speedkit" / SHIPPED
        shutil.rmtree(target, ignore_errors=True)  # a file removed from the checkout must not linger in build/
        for folder, patterns in SHIPPED_FILES:
            found = [path for pattern in patterns for path in sorted((HERE / folder).glob(pattern))]
            if not found:
                raise FileNotFoundError(f"{HERE / folder} has none of {patterns}: build the wheel from a full "
                                        f"checkout or an sdist (MANIFEST.in includes them)")
            for path in found:
                dest = target / path.relative_to(HERE)
                dest.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, dest)


setup(cmdclass={"build_py": BuildWithShippedFiles})
