"""seqrec: sequential recommendation, faithful and fast."""

__version__ = "0.1.0"
