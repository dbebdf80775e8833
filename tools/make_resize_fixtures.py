#!/usr/bin/python3
"""Writes the fixtures of worker/data/image_resize_test.cc: images and what PIL (Pillow, Debian's
python3-pil) makes of them with torchvision's resizing transforms, so that the C++ resampler is
checked against Pillow itself without Python at test time.

In --out_dir (default worker/data/testdata/resize):
  in_<name>.png           a test image (random noise over smooth gradients), RGB or grayscale
  out_<name>_<size>.png   what torchvision's transform makes of it on a PIL image:
                            size "S":   transforms.Resize(S) then transforms.CenterCrop(S)
                            size "HxW": transforms.Resize((H, W))
  cases.txt               one line per expected image: "in_<name>.png <size> out_....png"

torchvision is not packaged in Debian, so its two transforms are written out here as its
source does them on PIL images (torchvision/transforms/functional.py, 0.14):
  Resize(S):       the shorter side to S, the longer to int(S * longer / shorter), then
                   img.resize((w, h), Image.BILINEAR)
  Resize((H, W)):  img.resize((W, H), Image.BILINEAR)
  CenterCrop(S):   top = int(round((height - S) / 2.0)), left likewise; img.crop(...)

Usage: tools/make_resize_fixtures.py [--out_dir=DIR]
"""
import argparse
import os

import numpy as np
from PIL import Image


def torchvision_resize_short(img, s):
    w, h = img.size
    short, long = (w, h) if w <= h else (h, w)
    new_short, new_long = s, int(s * long / short)
    new_w, new_h = (new_short, new_long) if w <= h else (new_long, new_short)
    return img.resize((new_w, new_h), Image.BILINEAR)


def torchvision_center_crop(img, s):
    w, h = img.size
    top = int(round((h - s) / 2.0))
    left = int(round((w - s) / 2.0))
    return img.crop((left, top, left + s, top + s))


def make_image(rng, h, w, mode):
    yy, xx = np.mgrid[0:h, 0:w]
    base = 128 + 100 * np.sin(xx / max(w, 1) * 3.1) * np.cos(yy / max(h, 1) * 2.3)
    channels = 3 if mode == "RGB" else 1
    planes = [base + rng.normal(0, 40, (h, w)) + 30 * c for c in range(channels)]
    a = np.clip(np.stack(planes, axis=-1), 0, 255).astype(np.uint8)
    return Image.fromarray(a if channels == 3 else a[:, :, 0], mode)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out_dir", default="worker/data/testdata/resize")
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    rng = np.random.default_rng(27)
    # (name, height, width, mode, sizes): shrinking by non-integer and large factors, growing,
    # one side only, portrait and landscape, odd and even crop margins (halves to even).
    images = [
        ("land", 30, 47, "RGB", ["12", "16", "30", "29", "12x20", "30x9", "60x50"]),
        ("port", 41, 17, "RGB", ["8", "17", "5", "41x33", "20x17"]),
        ("gray", 23, 26, "L", ["7", "23", "40", "9x26", "23x11"]),
        ("tiny", 3, 2, "RGB", ["6", "1", "5x7"]),
        ("big", 120, 90, "RGB", ["32", "13x17"]),
    ]
    lines = []
    for name, h, w, mode, sizes in images:
        img = make_image(rng, h, w, mode)
        in_file = f"in_{name}.png"
        img.save(os.path.join(args.out_dir, in_file))
        for size in sizes:
            if "x" in size:
                rows, cols = (int(v) for v in size.split("x"))
                out = img.resize((cols, rows), Image.BILINEAR)
            else:
                s = int(size)
                out = torchvision_center_crop(torchvision_resize_short(img, s), s)
            out_file = f"out_{name}_{size}.png"
            out.save(os.path.join(args.out_dir, out_file))
            lines.append(f"{in_file} {size} {out_file}")
    with open(os.path.join(args.out_dir, "cases.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} cases to {args.out_dir}")


if __name__ == "__main__":
    main()
