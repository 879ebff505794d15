import subprocess

from test.helpers import REPO_ROOT


RECIPE = """#!/usr/bin/env bash
# Toy recipe header.
# Options: --stage N --use-gpu true|false
stage=0
use_gpu=false
. {root}/tools/parse_options.sh || exit 1
echo "stage=$stage use_gpu=$use_gpu rest=$*"
"""


def run_recipe(tmp_path, *args):
    script = tmp_path / "run.sh"
    script.write_text(RECIPE.format(root=REPO_ROOT))
    return subprocess.run(["bash", str(script), *args], capture_output=True, text=True)


def test_sets_defined_variables_and_keeps_positionals(tmp_path):
    run = run_recipe(tmp_path, "--stage", "3", "--use-gpu", "true", "data", "exp")
    assert run.returncode == 0 and run.stdout == "stage=3 use_gpu=true rest=data exp\n"


def test_help_prints_header(tmp_path):
    run = run_recipe(tmp_path, "--help")
    assert run.returncode == 0
    assert run.stdout == "Toy recipe header.\nOptions: --stage N --use-gpu true|false\n"


def test_errors(tmp_path):
    for args, message in ((["--nj", "4"], "unknown option --nj"), (["--use_gpu", "yes"], "true or false"),
                          (["--stage"], "needs a value"),
                          # environment variables are not the script's options
                          (["--HOME", "/tmp"], "unknown option --HOME"), (["--PATH", "/bin"], "unknown option --PATH")):
        run = run_recipe(tmp_path, *args)
        assert run.returncode == 1 and message in run.stderr and run.stdout == ""
