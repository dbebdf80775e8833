"""Reading the weights gpu_worker saves (--save_model: safetensors with PyTorch state_dict
names) with nothing but PyTorch: Debian ships no `safetensors` package, and pip is refused on
its system Python.

    import dptrain.models, dptrain.safetensors
    net = dptrain.models.lenet()
    net.load_state_dict(dptrain.safetensors.load_file("lenet.safetensors"))"""

import json
import struct

import torch

_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "F64": torch.float64, "I64": torch.int64, "I32": torch.int32, "I16": torch.int16,
           "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool}


def load_file(path):
    """{name: tensor} of the safetensors file at `path` (CPU tensors). ValueError naming the
    file for anything malformed: a header past the end, an unknown dtype, a tensor whose
    bytes do not match its shape or lie outside the data."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: not a safetensors file (shorter than its header size)")
    (header_size,) = struct.unpack("<Q", blob[:8])
    if header_size > len(blob) - 8:
        raise ValueError(f"{path}: header of {header_size} bytes past the end of the file")
    try:
        header = json.loads(blob[8:8 + header_size])
    except ValueError as e:
        raise ValueError(f"{path}: header is not JSON ({e})") from None
    data = memoryview(blob)[8 + header_size:]
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(entry.get("dtype"))
        if dtype is None:
            raise ValueError(f"{path}: tensor {name!r} has unknown dtype {entry.get('dtype')!r}")
        shape, (begin, end) = list(entry["shape"]), entry["data_offsets"]
        count = 1
        for d in shape:
            count *= d
        size = torch.empty(0, dtype=dtype).element_size()
        if not 0 <= begin <= end <= len(data) or end - begin != count * size:
            raise ValueError(f"{path}: tensor {name!r} has bytes [{begin}, {end}) for shape "
                             f"{shape} of {entry['dtype']}")
        flat = torch.frombuffer(bytearray(data[begin:end]), dtype=dtype) if count else \
            torch.empty(0, dtype=dtype)
        out[name] = flat.reshape(shape)
    return out
