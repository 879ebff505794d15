"""toolkit: end-to-end speech recognition training (conformer CTC/attention, torch DDP, recipes)."""

from setuptools import find_packages, setup

with open("requirements.txt", encoding="utf-8") as f:
    requirements = [line.split("#")[0].strip() for line in f if line.split("#")[0].strip()]

setup(
    name="toolkit",
    version="0.1.0",
    description=__doc__,
    packages=find_packages(include=["toolkit", "toolkit.*"]),
    python_requires=">=3.10",
    install_requires=[r for r in requirements if not r.startswith("pytest")],
    entry_points={
        "console_scripts": [
            "toolkit-train=toolkit.bin.train:main",
            "toolkit-recognize=toolkit.bin.recognize:main",
            "toolkit-average-model=toolkit.bin.average_model:main",
        ]
    },
)
