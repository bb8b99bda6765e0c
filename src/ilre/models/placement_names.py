"""The device and dtype names the command line accepts, importable without torch (a thin install's `ilre --help`)."""

DTYPE_NAMES = ("float32", "bfloat16", "float16")
INT8 = "int8"  # int8 linear layers, float32 elsewhere (CPUs: models/int8.py)
DTYPE_CHOICES = ("auto", *DTYPE_NAMES, INT8)
DEVICE_HELP = "auto, cpu, cuda, cuda:N, npu or npu:N"
