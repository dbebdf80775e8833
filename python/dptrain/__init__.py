"""dptrain: data-parallel training over a parameter server, a ring all-reduce or a master
reducer. `dptrain.torch` makes a PyTorch training script a worker of it (Horovod's API
names); the native part is a C library loaded with ctypes (see dptrain/_native.py)."""

from dptrain._native import DptrainError

__all__ = ["DptrainError"]
