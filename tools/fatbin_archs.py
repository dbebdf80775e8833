#!/usr/bin/env python3
"""Lists the GPU code in a shared library's .nv_fatbin section, like `cuobjdump --list-elf
--list-ptx` (which this machine's toolkit lacks): one line per embedded image, "ELF sm_90"
or "PTX compute_90", with a count. Exit 1 if there is no fatbin, or if --require ARCH (e.g.
sm_90) is missing.

usage: tools/fatbin_archs.py LIB.so [--require sm_90]...
"""
import collections
import struct
import sys

FATBIN_MAGIC = 0xBA55ED50
KINDS = {1: "PTX", 2: "ELF"}


def section(data, name):
    """Bytes of the ELF64 section `name`, or None."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise SystemExit("not an ELF64 file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    def header(i):
        return struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
    strtab = header(shstrndx)
    for i in range(shnum):
        h = header(i)
        start = strtab[4] + h[0]
        sname = data[start:data.index(b"\0", start)].decode()
        if sname == name:
            return data[h[4]:h[4] + h[5]]
    return None


def images(fatbin):
    """(kind, arch) of every image in a sequence of fatbin blocks."""
    pos = 0
    while pos + 16 <= len(fatbin):
        magic, _version, header_size, fat_size = struct.unpack_from("<IHHQ", fatbin, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # Blocks are 8-byte aligned; skip padding.
            continue
        entry, end = pos + header_size, pos + header_size + fat_size
        while entry + 32 <= end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", fatbin, entry)
            arch, = struct.unpack_from("<I", fatbin, entry + 28)
            yield KINDS.get(kind, f"kind{kind}"), arch
            entry += entry_header + payload
        pos = end


def main(argv):
    if len(argv) < 2:
        raise SystemExit(__doc__)
    required = [argv[i + 1] for i, a in enumerate(argv) if a == "--require"]
    fatbin = section(open(argv[1], "rb").read(), ".nv_fatbin")
    if not fatbin:
        print(f"{argv[1]}: no .nv_fatbin section (no GPU code)")
        return 1
    counts = collections.Counter(
        f"{kind} {'sm' if kind == 'ELF' else 'compute'}_{arch}" for kind, arch in images(fatbin))
    for name, n in sorted(counts.items()):
        print(f"{name}: {n} image(s)")
    found = {name.split()[1] for name in counts}
    missing = [r for r in required if r not in found]
    if missing:
        print(f"missing: {' '.join(missing)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
