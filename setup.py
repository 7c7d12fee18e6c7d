"""The one build step pyproject.toml cannot state: the SWE family's fixture libraries in the wheel.

They are data (small Python libraries with their own tests, into which the generator injects bugs),
not clawrl's code, so they live outside src/, in data/swe_libraries/. A source checkout and an
editable install read them there; a built wheel carries a copy at clawrl/envs/swe/libraries/, where
clawrl.envs.swe.generate.libraries_dir() looks first. MANIFEST.in puts them in the sdist.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

LIBRARIES = Path("data") / "swe_libraries"


class BuildPyWithLibraries(build_py):
    def run(self) -> None:
        super().run()
        if not self.editable_mode:  # an editable install reads data/swe_libraries/ in place
            target = Path(self.build_lib) / "clawrl" / "envs" / "swe" / "libraries"
            shutil.copytree(LIBRARIES, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


setup(cmdclass={"build_py": BuildPyWithLibraries})
