"""The systems benchmarks/throughput.py compares, each behind the interface of ``common.py``."""
