"""Scripts that run as the ranks of a test (``worker_*.py``, under torchrun) and what the tests and workers share:
the launcher (``launch.py``), training data and jobs (``recipe_data.py``), decoding inputs (``recognize_setup.py``)
and a tiny model with real batches (``tiny_ctc.py``)."""
