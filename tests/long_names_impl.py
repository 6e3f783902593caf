"""A max-seq-len implementation that raises an exception class of a 300-character
name: its finding's key, and so the case file's name, would pass the 255 bytes a
file system allows for a file's name. Named ``long_names_impl:raises_a_long_name``
(this directory on the import path).
"""

from __future__ import annotations

from attnfuzz.reference.max_seq_len import MaxSeqLenInputs, MaxSeqLenOutputs

LONG_NAME = "ExceptionOfAVeryLongName" * 12 + "E" * 12
assert len(LONG_NAME) == 300

# A module attribute of its own name, so that it pickles by reference across processes.
globals()[LONG_NAME] = LongNamedError = type(LONG_NAME, (Exception,), {"__module__": __name__})


def raises_a_long_name(inputs: MaxSeqLenInputs) -> MaxSeqLenOutputs:
    raise LongNamedError("a fault whose class has a long name")
