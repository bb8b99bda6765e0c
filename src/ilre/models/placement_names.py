"""The device and dtype names the command line accepts, importable without torch (a thin install's `ilre --help`)."""

DTYPE_NAMES = ("float32", "bfloat16", "float16")
DTYPE_CHOICES = ("auto", *DTYPE_NAMES)
DEVICE_HELP = "auto, cpu, cuda, cuda:N, npu or npu:N"
