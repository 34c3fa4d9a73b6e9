"""scout-sys: find the rank that broke a distributed PyTorch job, from outside the job."""

__version__ = "0.1.0"
