# Source from the recipe directory: makes `python -m toolkit...` work without `pip install -e .`.
export TOOLKIT_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
export PYTHONPATH=$TOOLKIT_ROOT${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1
export PYTHONIOENCODING=UTF-8
