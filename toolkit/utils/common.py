"""Constants and small tensor helpers shared by the data pipeline, models and decoding.

Token id conventions (the same as the dictionary written by stage 2 of the recipe):
``<blank>`` = 0 (CTC blank), ``<unk>`` = 1, ``<sos/eos>`` = vocab_size - 1. Padded label positions
hold :data:`IGNORE_ID`.
"""

IGNORE_ID = -1
BLANK_ID = 0
UNK_ID = 1
