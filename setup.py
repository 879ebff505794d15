"""toolkit: end-to-end speech recognition training (conformer CTC/attention, torch DDP or DeepSpeed, recipes).

``pip install -e .`` brings what training and decoding with torch DDP need; ``pip install -e .[deepspeed]`` adds
the DeepSpeed engine and ``.[test]`` the test tools. README's commands install all of requirements.txt, where every
requirement is pinned (one home for the versions: this file reads it).
"""

import re

from setuptools import find_packages, setup

EXTRAS = {"deepspeed": ["deepspeed"], "test": ["pytest", "import-linter", "kaldi-native-fbank"]}


def requirements() -> dict[str, str]:
    """``{name: requirement}`` of requirements.txt (comments, inline ones too, stripped)."""
    with open("requirements.txt", encoding="utf-8") as f:
        lines = [line.split("#")[0].strip() for line in f]
    return {re.split(r"[<>=!~;\[ ]", line)[0].lower(): line for line in lines if line}


pinned = requirements()
optional = {name for names in EXTRAS.values() for name in names}
setup(
    name="toolkit",
    version="0.1.0",
    description=__doc__.splitlines()[0],
    packages=find_packages(include=["toolkit", "toolkit.*"]),
    python_requires=">=3.11",
    install_requires=[req for name, req in pinned.items() if name not in optional],
    extras_require={extra: [pinned[name] for name in names] for extra, names in EXTRAS.items()},
    entry_points={
        "console_scripts": [
            "toolkit-train=toolkit.bin.train:cli",
            "toolkit-recognize=toolkit.bin.recognize:cli",
            "toolkit-average-model=toolkit.bin.average_model:cli",
            "toolkit-transcribe=toolkit.bin.transcribe:cli",
            "toolkit-export=toolkit.bin.export:cli",
        ]
    },
)
