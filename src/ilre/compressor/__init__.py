"""The algorithm, pure and I/O-free: streaming prefill, scoring strategies, allocation, DCA."""
