"""profkit: native-level profiling of PyTorch CPU thread-pool fanout on live processes."""

__version__ = "0.1.0"
