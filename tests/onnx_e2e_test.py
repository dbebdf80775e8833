"""gpu_worker trains the user's model on the user's data, end to end: a CNN written in
PyTorch (Conv, BatchNorm, ReLU, MaxPool, Dropout, Linear) is exported to ONNX
(torch.onnx.export, training mode, no constant folding), 2 gpu_worker processes train it
through 2 real ps_server shards (BSP, sgd) on a generated 3x32x32 data set in the CIFAR-10
binary format (and a small vision transformer built from nn.TransformerEncoder on the same
data, and a text classifier built from nn.Embedding and nn.TransformerEncoder on int64 token
ids in .npy arrays), again on the same images as an ImageFolder tree of PNG files, and on an
ImageFolder of those images at other sizes (64x64 and 48x40) brought back to 32x32 by
--image_size=32; each time rank 0 saves the weights, which load into the PyTorch model with a
strict load_state_dict and give, in PyTorch, the test accuracy the worker printed (for the
resized folder, on the test PNGs through torchvision's Resize(32) + CenterCrop(32), written out
with PIL as in tools/make_resize_fixtures.py). Then the bad input: an
unsupported op, a model whose input is not the data's shape or kind (ids, images), ids outside
the embedding table, a model exported with
torch.onnx.export's defaults (for evaluation), too few outputs for the classes. Run by
tests/onnx_e2e_test.sh; every case prints one line, the first failure ends the run with a
non-zero exit."""

import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import zlib

import torch
from torch import nn

import dptrain.export
import dptrain.models
import dptrain.safetensors

ROOT = os.environ["DPTRAIN_ROOT"]
PS_SERVER = os.path.join(ROOT, "server", "ps_server")
GPU_WORKER = os.path.join(ROOT, "worker", "gpu_worker")
SCRATCH = os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp()
CLASSES, TRAIN, TEST = 10, 1000, 200
MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
_processes = []


def fail(message):
    print(f"FAIL: {message}", flush=True)
    for p in _processes:
        p.kill()
    sys.exit(1)


def images_and_labels(n, seed):
    """n 3x32x32 uint8 images whose class sets a colour and a stripe, plus noise."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (n,), generator=g)
    base = torch.stack([(labels * 25 + c * 60) % 256 for c in range(3)], 1).float()
    x = base[:, :, None, None] + torch.randint(-200, 201, (n, 3, 32, 32), generator=g).float()
    rows = torch.arange(32)
    stripe = (rows[None, :] // 4 == labels[:, None] % 8).float() * 20  # [n, 32]
    x = x + stripe[:, None, :, None]
    return x.clamp(0, 255).to(torch.uint8), labels


def write_cifar(folder, train, test):
    os.makedirs(folder, exist_ok=True)
    (xs, ys) = train
    per = len(ys) // 5
    for b in range(5):
        with open(os.path.join(folder, f"data_batch_{b + 1}.bin"), "wb") as f:
            for i in range(b * per, (b + 1) * per):
                f.write(bytes([int(ys[i])]) + xs[i].numpy().tobytes())
    with open(os.path.join(folder, "test_batch.bin"), "wb") as f:
        for x, y in zip(*test):
            f.write(bytes([int(y)]) + x.numpy().tobytes())


def write_npy(folder, train, test):
    """The same images and labels as .npy arrays (uint8 N x 3 x 32 x 32, int64 labels)."""
    import numpy
    os.makedirs(folder, exist_ok=True)
    for split, (xs, ys) in (("train", train), ("test", test)):
        numpy.save(os.path.join(folder, f"{split}_images.npy"), xs.numpy())
        numpy.save(os.path.join(folder, f"{split}_labels.npy"), ys.long().numpy())


VOCAB, LENGTH, TEXT_CLASSES = 100, 16, 5


def token_ids_and_labels(n, seed):
    """n sequences of 6 to LENGTH token ids padded with 0 to LENGTH: 3 keywords of the class
    (ids 10c + 1 .. 10c + 9) at random places among filler ids (50 .. 99); a tenth of the labels
    redrawn at random, so that no model is perfect."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, TEXT_CLASSES, (n,), generator=g)
    ids = torch.randint(50, VOCAB, (n, LENGTH), generator=g)
    for i in range(n):
        length = int(torch.randint(6, LENGTH + 1, (1,), generator=g))
        places = torch.randperm(length, generator=g)[:3]
        ids[i, places] = labels[i] * 10 + torch.randint(1, 10, (3,), generator=g)
        ids[i, length:] = 0
    noisy = torch.rand(n, generator=g) < 0.1
    labels[noisy] = torch.randint(0, TEXT_CLASSES, (int(noisy.sum()),), generator=g)
    return ids, labels


def write_ids(folder, train, test):
    """Token ids as .npy arrays: int64 N x LENGTH (train_ids.npy, test_ids.npy), int64 labels."""
    import numpy
    os.makedirs(folder, exist_ok=True)
    for split, (xs, ys) in (("train", train), ("test", test)):
        numpy.save(os.path.join(folder, f"{split}_ids.npy"), xs.numpy())
        numpy.save(os.path.join(folder, f"{split}_labels.npy"), ys.numpy())


def png(image):
    """A 3x32x32 uint8 tensor as the bytes of an RGB PNG file."""
    height, width = image.shape[1], image.shape[2]
    raw = b"".join(b"\0" + image[:, r, :].t().contiguous().numpy().tobytes()
                   for r in range(height))

    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2,
                                                             0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def write_image_folder(folder, train, test):
    for split, (xs, ys) in (("train", train), ("test", test)):
        for c in range(CLASSES):
            os.makedirs(os.path.join(folder, split, f"class{c:02d}"), exist_ok=True)
        for i, (x, y) in enumerate(zip(xs, ys)):
            with open(os.path.join(folder, split, f"class{int(y):02d}", f"{i:05d}.png"),
                      "wb") as f:
                f.write(png(x))


def write_resized_folder(folder, train, test):
    """The images at other sizes: even ones 2x (64x64, pixels repeated), odd ones 48x40 (height x
    width, PIL's bilinear). Returns the test images as PyTorch would load them with
    Resize(32) + CenterCrop(32): [n, 3, 32, 32] uint8."""
    from PIL import Image
    loaded = []
    for split, (xs, ys) in (("train", train), ("test", test)):
        for c in range(CLASSES):
            os.makedirs(os.path.join(folder, split, f"class{c:02d}"), exist_ok=True)
        for i, (x, y) in enumerate(zip(xs, ys)):
            img = Image.fromarray(x.permute(1, 2, 0).contiguous().numpy(), "RGB")
            img = img.resize((64, 64), Image.NEAREST) if i % 2 == 0 else img.resize(
                (40, 48), Image.BILINEAR)
            path = os.path.join(folder, split, f"class{int(y):02d}", f"{i:05d}.png")
            img.save(path)
            if split == "test":
                loaded.append(resize_32_center_crop(Image.open(path).convert("RGB")))
    return torch.stack(loaded)


def resize_32_center_crop(img):
    """torchvision's Resize(32) then CenterCrop(32) on a PIL image, as a 3x32x32 uint8 tensor."""
    from PIL import Image
    w, h = img.size
    short, long = (w, h) if w <= h else (h, w)
    new_long = int(32 * long / short)
    img = img.resize((32, new_long) if w <= h else (new_long, 32), Image.BILINEAR)
    w, h = img.size
    top, left = int(round((h - 32) / 2.0)), int(round((w - 32) / 2.0))
    img = img.crop((left, top, left + 32, top + 32))
    return torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8).view(32, 32, 3).permute(
        2, 0, 1)


class Net(nn.Module):
    def __init__(self, classes=CLASSES):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Dropout(0.25),
                                        nn.Linear(16 * 8 * 8, classes))

    def forward(self, x):
        return self.classifier(self.features(x))


class ViT(nn.Module):
    """A small vision transformer written with torch.nn's own blocks: 8x8 patches, a class
    token, a positional embedding, nn.TransformerEncoder (pre-norm, nn.MultiheadAttention,
    exported at the default opset with its layer norms written out), the head on the class
    token."""

    def __init__(self, dim=32, heads=4, classes=CLASSES):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 8, 8)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.randn(1, 17, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.1, batch_first=True,
                                           norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        return self.head(self.norm(self.encoder(x))[:, 0])


class TextClassifier(nn.Module):
    """A text classifier as users write one: nn.Embedding of the token ids (0 = padding), a
    learned positional embedding, nn.TransformerEncoder told where the padding is
    (src_key_padding_mask), the mean over the real tokens, a Linear head."""

    def __init__(self, dim=32, heads=4, classes=TEXT_CLASSES):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim, padding_idx=0)
        self.pos = nn.Parameter(torch.randn(1, LENGTH, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(dim, heads, 2 * dim, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 1)
        self.head = nn.Linear(dim, classes)

    def forward(self, ids):
        pad = ids == 0
        h = self.encoder(self.embed(ids) + self.pos, src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).float()
        return self.head((h * keep).sum(1) / keep.sum(1).clamp(min=1))


class TextLSTM(nn.Module):
    """A recurrent text classifier: nn.Embedding, a bidirectional nn.LSTM, the head on both
    directions' final hidden states; `packed`: through pack_padded_sequence (each sample's
    real tokens only, the padding's 0 left out, enforce_sorted=False)."""

    def __init__(self, dim=32, packed=False):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim, padding_idx=0)
        self.rnn = nn.LSTM(dim, dim, batch_first=True, bidirectional=True)
        self.head = nn.Linear(2 * dim, TEXT_CLASSES)
        self.packed = packed

    def forward(self, ids):
        x = self.embed(ids)
        if self.packed:
            x = nn.utils.rnn.pack_padded_sequence(x, (ids != 0).sum(1), batch_first=True,
                                                  enforce_sorted=False)
        _, (h, _) = self.rnn(x)
        return self.head(torch.cat([h[0], h[1]], 1))


def export(model, path, shape=(2, 3, 32, 32), dtype=torch.float32, example=None, **options):
    """dptrain.export_onnx (with `options`: input_names, dynamic_batch), checked to leave the
    model as it was (its state and mode)."""
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.eval()
    example = example if example is not None else torch.zeros(*shape, dtype=dtype)
    dptrain.export.export_onnx(model, example, path, **options)
    if model.training or any(not torch.equal(v, before[k]) for k, v in model.state_dict().items()):
        fail(f"export_onnx changed the model it exported ({path})")


class StochasticDepth(nn.Module):
    """torchvision.ops.StochasticDepth's row mode (EfficientNet, ConvNeXt, Swin), written out:
    each sample's branch dropped with probability p in training."""

    def __init__(self, p):
        super().__init__()
        self.p = p

    def forward(self, x):
        if not self.training or self.p == 0.0:
            return x
        keep = torch.empty([x.shape[0]] + [1] * (x.dim() - 1)).bernoulli_(1 - self.p)
        return x * keep / (1 - self.p)


class DropPathNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.drop = StochasticDepth(0.2)
        self.fc = nn.Linear(4 * 32 * 32, 10)

    def forward(self, x):
        y = self.conv(x)
        return self.fc(torch.flatten(y + self.drop(torch.relu(y)), 1))


class Versioned(nn.Module):
    """A module whose state_dict loading needs its version metadata, as torchvision's MNASNet."""
    _version = 2

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3 * 32 * 32, 10)

    def forward(self, x):
        return self.fc(torch.flatten(x, 1))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, *args):
        if local_metadata.get("version") not in (1, 2):
            raise ValueError("version should be set to 1 or 2")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, *args)


def check_stochastic_depth_export():
    """export_onnx writes a model with stochastic depth (which torch.onnx cannot export in
    training mode) with p = 0, says so, and gives the model its p back."""
    import warnings

    import onnx

    net = DropPathNet()
    path = os.path.join(SCRATCH, "drop_path.onnx")
    try:
        torch.onnx.export(net, torch.zeros(2, 3, 32, 32), path,
                          training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
        plain = "exported"
    except Exception as e:  # What a user meets without export_onnx.
        plain = type(e).__name__
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        export(net, path)
    said = [str(w.message) for w in caught if "StochasticDepth" in str(w.message)]
    if len(said) != 1 or "1 StochasticDepth modules exported with p=0" not in said[0]:
        fail(f"export_onnx with stochastic depth: no warning saying so ({said})")
    if net.drop.p != 0.2:
        fail(f"export_onnx left StochasticDepth's p at {net.drop.p}")
    ops = {n.op_type for n in onnx.load(path).graph.node}
    if ops & {"Bernoulli", "RandomUniformLike", "RandomUniform", "RandomNormalLike"}:
        fail(f"export_onnx with stochastic depth: random ops in the file: {sorted(ops)}")
    print(f"ok: a model with stochastic depth exports (plain torch.onnx.export: {plain}) with "
          f"p=0 and a warning; its p is restored", flush=True)
    export(Versioned(), os.path.join(SCRATCH, "versioned.onnx"))
    print("ok: a module whose loading needs the state_dict's version metadata exports and is "
          "restored", flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_shards(n, workers):
    addresses = []
    for s in range(n):
        port_file = os.path.join(SCRATCH, f"shard{s}.{time.time_ns()}.port")
        log = open(os.path.join(SCRATCH, f"shard{s}.log"), "a")
        p = subprocess.Popen([PS_SERVER, "--host=127.0.0.1", "--port=0",
                              f"--port_file={port_file}", f"--shard={s}", f"--num_shards={n}",
                              f"--num_workers={workers}", "--optimizer=sgd", "--lr=0.05",
                              "--momentum=0.9"], stdout=log, stderr=log)
        _processes.append(p)
        for _ in range(200):
            if os.path.exists(port_file) and os.path.getsize(port_file) > 0:
                break
            time.sleep(0.05)
        else:
            fail(f"shard {s} did not start")
        addresses.append(f"127.0.0.1:{open(port_file).read().strip()}")
    return addresses


def train(name, model_path, data_dir, extra=(), normalize=True, score="test_acc"):
    """2 workers x 2 shards; returns (rank 0's printed final `score`: the test accuracy, or a
    regression's test_loss; the saved weights; rank 0's output)."""
    norm = ("--data_mean=0.5,0.5,0.5", "--data_std=0.25,0.25,0.25") if normalize else ()
    shards = start_shards(2, 2)
    saved = os.path.join(SCRATCH, f"{name}.safetensors")
    procs, logs = [], []
    for r in range(2):
        log = os.path.join(SCRATCH, f"{name}.rank{r}.log")
        logs.append(log)
        procs.append(subprocess.Popen(
            [GPU_WORKER, "--mode=ps", f"--ps={','.join(shards)}", f"--rank={r}", "--world_size=2",
             f"--model={model_path}", f"--data_dir={data_dir}", "--epochs=3", "--batch_size=25",
             "--threads=1", *norm, f"--save_model={saved}", *extra],
            stdout=open(log, "w"), stderr=subprocess.STDOUT))
        _processes.append(procs[-1])
    for p in procs:
        try:
            p.wait(timeout=240)
        except subprocess.TimeoutExpired:
            fail(f"{name}: a worker hung: {open(logs[0]).read()[-800:]}")
    for p in _processes:
        if p.poll() is None:
            p.terminate()
            p.wait()
    text = open(logs[0]).read()
    if any(p.returncode for p in procs):
        fail(f"{name}: exit codes {[p.returncode for p in procs]}: {text[-1200:]}"
             f" | {open(logs[1]).read()[-600:]}")
    done = re.search(rf"done: .* {score} ([0-9.]+)", text)
    if not done:
        fail(f"{name}: no final line: {text[-800:]}")
    return float(done.group(1)), saved, text


def pytorch_accuracy(saved, test, net=None):
    net = net if net is not None else Net()
    state = dptrain.safetensors.load_file(saved)
    # PyTorch keeps num_batches_tracked as int64; the file holds it as a float count.
    state = {k: (v.long() if k.endswith("num_batches_tracked") else v) for k, v in state.items()}
    net.load_state_dict(state, strict=True)
    net.eval()
    x = (test[0].float() / 255 - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]
    with torch.no_grad():
        return (net(x).argmax(1) == test[1]).float().mean().item()


def ids_accuracy(net, saved, test):
    """The accuracy of `net` with the saved weights (a strict load) on the (ids, labels) set."""
    net.load_state_dict(dptrain.safetensors.load_file(saved), strict=True)
    net.eval()
    with torch.no_grad():
        return (net(test[0]).argmax(1) == test[1]).float().mean().item()


def expect_error(name, model_path, data_dir, pattern, extra=()):
    r = subprocess.run([GPU_WORKER, "--mode=allreduce", "--world_size=1", "--lr=0.1",
                        f"--model={model_path}", f"--data_dir={data_dir}", "--epochs=1",
                        "--threads=1", *extra],
                       capture_output=True, text=True, timeout=60)
    line = next((l for l in r.stderr.splitlines() if l.startswith("gpu_worker: error:")), "")
    if r.returncode != 1 or not re.search(pattern, line):
        fail(f"{name}: exit {r.returncode}, wanted /{pattern}/: {r.stderr[-600:]}")
    print(f"ok: {name} -> {line}", flush=True)


def expect_same_accuracy(name, printed, ours, low, text):
    """The test accuracy the worker printed equals PyTorch's from the saved weights (one test
    sample may fall on the other side of an argmax between the two float paths) and lies in
    (low, 0.99): the model learned, and the task is not trivial."""
    if abs(ours - printed) > 1.0 / TEST + 1e-9 or not low < printed < 0.99:
        fail(f"{name}: the worker printed test_acc {printed}, PyTorch gets {ours} from the "
             f"saved weights: {text[-600:]}")


def main():
    torch.manual_seed(0)
    check_stochastic_depth_export()
    train_set, test_set = images_and_labels(TRAIN, 1), images_and_labels(TEST, 2)
    cifar, folder = os.path.join(SCRATCH, "cifar"), os.path.join(SCRATCH, "images")
    write_cifar(cifar, train_set, test_set)
    write_image_folder(folder, train_set, test_set)
    model_path = os.path.join(SCRATCH, "net.onnx")
    export(Net(), model_path)
    resized = os.path.join(SCRATCH, "resized")
    resized_test = (write_resized_folder(resized, train_set, test_set), test_set[1])
    for name, data, extra, test in (("cifar", cifar, (), test_set),
                                    ("imagefolder", folder, (), test_set),
                                    ("resized imagefolder", resized, ("--image_size=32",),
                                     resized_test)):
        printed, saved, text = train(f"onnx_{name.replace(' ', '_')}", model_path, data, extra)
        ours = pytorch_accuracy(saved, test)
        expect_same_accuracy(name, printed, ours, 0.3, text)
        print(f"ok: an exported CNN, 2 workers x 2 shards on the {name} data: test_acc "
              f"{printed:.4f} printed, {ours:.4f} in PyTorch from the saved weights", flush=True)

    # The same image folder decoded as training reads it (--data_loading=stream) trains the
    # same model bit for bit as the folder decoded at load (the run above).
    printed, saved, text = train("onnx_imagefolder_stream", model_path, folder,
                                 ("--data_loading=stream",))
    held = os.path.join(SCRATCH, "onnx_imagefolder.safetensors")
    if "training images (read as needed)" not in text:
        fail(f"streamed imagefolder: no 'read as needed' line: {text[:800]}")
    if open(saved, "rb").read() != open(held, "rb").read():
        fail("streamed imagefolder: the saved weights differ from the run that held the images")
    print(f"ok: the image folder decoded as read (--data_loading=stream): test_acc {printed:.4f}, "
          f"weights bit-identical to the run that decoded it at load", flush=True)

    # The CIFAR set's images as .npy arrays, read from the file as training goes: the same
    # images in the same order as the CIFAR run, so the same weights bit for bit.
    npy = os.path.join(SCRATCH, "npy")
    write_npy(npy, train_set, test_set)
    printed, saved, text = train("onnx_npy_stream", model_path, npy, ("--data_loading=stream",))
    if "training images (read as needed)" not in text:
        fail(f"streamed npy: no 'read as needed' line: {text[:800]}")
    if open(saved, "rb").read() != open(os.path.join(SCRATCH, "onnx_cifar.safetensors"),
                                        "rb").read():
        fail("streamed npy: the saved weights differ from the CIFAR run on the same images")
    print(f"ok: the same images as .npy read from the file (--data_loading=stream): test_acc "
          f"{printed:.4f}, weights bit-identical to the CIFAR run", flush=True)

    # A vision transformer (the batch moves off axis 0 and merges with the heads inside
    # nn.MultiheadAttention's export) trains the same way and loads back into PyTorch.
    torch.manual_seed(0)
    vit = ViT()
    vit_path = os.path.join(SCRATCH, "vit.onnx")
    export(vit, vit_path)
    printed, saved, text = train("onnx_vit_cifar", vit_path, cifar)
    ours = pytorch_accuracy(saved, test_set, ViT())
    expect_same_accuracy("vit", printed, ours, 0.3, text)
    print(f"ok: a vision transformer (nn.TransformerEncoder), 2 workers x 2 shards on the cifar "
          f"data: test_acc {printed:.4f} printed, {ours:.4f} in PyTorch from the saved weights",
          flush=True)

    # A text classifier on token ids (an int64 input read by nn.Embedding) from .npy arrays.
    torch.manual_seed(0)
    text_path = os.path.join(SCRATCH, "text.onnx")
    export(TextClassifier(), text_path,
           example=torch.tensor([[1] * LENGTH, [2] * 6 + [0] * (LENGTH - 6)]))
    ids_train, ids_test = token_ids_and_labels(TRAIN, 3), token_ids_and_labels(TEST, 4)
    ids_dir = os.path.join(SCRATCH, "ids")
    write_ids(ids_dir, ids_train, ids_test)
    printed, saved, text = train("onnx_text_ids", text_path, ids_dir, ("--epochs=10",),
                                 normalize=False)
    ours = ids_accuracy(TextClassifier(), saved, ids_test)
    expect_same_accuracy("text", printed, ours, 0.8, text)
    if f"{TRAIN} training samples" not in text or f"{LENGTH} ids each" not in text:
        fail(f"text: no line describing the ids: {text[:800]}")
    print(f"ok: a text classifier (nn.Embedding + nn.TransformerEncoder, padding masked) on "
          f"int64 token ids from .npy, 2 workers x 2 shards: test_acc {printed:.4f} printed, "
          f"{ours:.4f} in PyTorch from the saved weights", flush=True)

    # A recurrent one (a bidirectional nn.LSTM, each ONNX LSTM read back as the state_dict's
    # weights) on the same ids.
    torch.manual_seed(0)
    lstm_path = os.path.join(SCRATCH, "lstm.onnx")
    export(TextLSTM(), lstm_path, example=torch.ones(2, LENGTH, dtype=torch.long))
    printed, saved, text = train("onnx_lstm_ids", lstm_path, ids_dir, ("--epochs=10",),
                                 normalize=False)
    ours = ids_accuracy(TextLSTM(), saved, ids_test)
    expect_same_accuracy("lstm", printed, ours, 0.6, text)
    print(f"ok: a bidirectional nn.LSTM text classifier on the same ids, 2 workers x 2 shards: "
          f"test_acc {printed:.4f} printed, {ours:.4f} in PyTorch from the saved weights",
          flush=True)
    # Its nn.Embedding(padding_idx=0): the export drops padding_idx; the worker finds the row of
    # zeros, says so, and leaves it as PyTorch would (no gradient).
    pad_row = dptrain.safetensors.load_file(saved)["embed.weight"][0]
    if "taken as nn.Embedding's padding_idx" not in text or bool(pad_row.abs().sum() != 0):
        fail(f"lstm: padding row {pad_row.tolist()} after training: {text[:800]}")
    print("ok: nn.Embedding(padding_idx=0)'s row of zeros found and kept at zeros", flush=True)
    # The same through pack_padded_sequence: each sample's real tokens only (the export sorts
    # the batch by length; the worker runs each sample at its own length instead).
    torch.manual_seed(0)
    packed_path = os.path.join(SCRATCH, "lstm_packed.onnx")
    export(TextLSTM(packed=True), packed_path,
           example=torch.tensor([[1] * LENGTH, [2] * 6 + [0] * (LENGTH - 6)]))
    printed, saved, text = train("onnx_lstm_packed", packed_path, ids_dir, ("--epochs=10",),
                                 normalize=False)
    ours = ids_accuracy(TextLSTM(packed=True), saved, ids_test)
    expect_same_accuracy("packed lstm", printed, ours, 0.6, text)
    print(f"ok: the same nn.LSTM on pack_padded_sequence(enforce_sorted=False), 2 workers x 2 "
          f"shards: test_acc {printed:.4f} printed, {ours:.4f} in PyTorch from the saved weights",
          flush=True)

    # A built-in network trained on the CIFAR-shaped data loads into dptrain.models' module built
    # for that data (the same names and shapes as gpu_worker's) and evaluates as it printed.
    saved = os.path.join(SCRATCH, "mlp_cifar.safetensors")
    r = subprocess.run([GPU_WORKER, "--mode=allreduce", "--world_size=1", "--lr=0.1",
                        "--model=mlp", f"--data_dir={cifar}", "--epochs=3", "--batch_size=25",
                        "--threads=1", "--data_mean=0.5,0.5,0.5", "--data_std=0.25,0.25,0.25",
                        f"--save_model={saved}"], capture_output=True, text=True, timeout=240)
    done = re.search(r"done: .* test_acc ([0-9.]+)", r.stdout + r.stderr)
    if r.returncode != 0 or not done:
        fail(f"mlp on the CIFAR-shaped data: exit {r.returncode}: {r.stderr[-600:]}")
    net = dptrain.models.mlp(input=(3, 32, 32), classes=CLASSES)
    net.load_state_dict(dptrain.safetensors.load_file(saved), strict=True)
    net.eval()
    x = (test_set[0].float() / 255 - torch.tensor(MEAN)[:, None, None]) / torch.tensor(STD)[:, None, None]
    with torch.no_grad():
        ours = (net(x).argmax(1) == test_set[1]).float().mean().item()
    if abs(ours - float(done.group(1))) > 1.0 / TEST + 1e-9 or ours < 0.3:
        fail(f"mlp: the worker printed test_acc {done.group(1)}, dptrain.models.mlp(input=(3, "
             f"32, 32)) gets {ours} from the saved weights")
    print(f"ok: the built-in mlp trained on 3x32x32 data loads into dptrain.models.mlp(input="
          f"(3, 32, 32), classes=10): test_acc {float(done.group(1)):.4f} printed, {ours:.4f} in "
          "PyTorch", flush=True)

    class CumSum(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.head = nn.Linear(4 * 30 * 30, CLASSES)

        def forward(self, x):
            return self.head(torch.cumsum(self.conv(x), 1).flatten(1))
    cumsum = os.path.join(SCRATCH, "cumsum.onnx")
    export(CumSum(), cumsum)
    expect_error("unsupported op", cumsum, cifar,
                 r"cumsum.onnx: unsupported op 'CumSum' \(node ")
    small = os.path.join(SCRATCH, "gray.onnx")
    gray = Net()
    gray.features[0] = nn.Conv2d(1, 8, 3, padding=1)
    export(gray, small, shape=(2, 1, 32, 32))
    expect_error("input shape", small, cifar,
                 r"the training set holds 3x32x32 images but model gray takes 1x32x32 inputs")
    # torch.onnx.export's defaults (eval mode, constant folding: BatchNorm folded into the
    # convolution, Dropout gone): refused, with how to export for training.
    default = os.path.join(SCRATCH, "default.onnx")
    torch.onnx.export(Net().eval(), torch.zeros(2, 3, 32, 32), default)
    expect_error("default export", default, cifar,
                 r"default.onnx: the weight of node .* is 'onnx::Conv_\d+', not a state_dict name"
                 r".*training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False\)")
    few = os.path.join(SCRATCH, "five.onnx")
    export(Net(classes=5), few)
    expect_error("too few outputs", few, cifar, r"five.onnx has 5 outputs, and the data in .* has "
                 r"10 classes")
    # Ids and images are not each other's data; ids outside the table are refused before any
    # step, naming the sample and the position; ids are not normalised.
    text10 = os.path.join(SCRATCH, "text10.onnx")
    export(TextClassifier(classes=CLASSES), text10, example=torch.ones(2, LENGTH, dtype=torch.long))
    expect_error("a text model on images", text10, cifar,
                 r"the training set holds 3x32x32 images but model text10 takes 16 integer "
                 r"id\(s\) per sample")
    net5 = os.path.join(SCRATCH, "net5.onnx")
    export(Net(classes=TEXT_CLASSES), net5)
    expect_error("an image model on ids", net5, ids_dir,
                 r"the training set holds 16 integer id\(s\) per sample but model net5 takes "
                 r"3x32x32 images")
    bad_ids = os.path.join(SCRATCH, "ids_bad")
    ids = ids_train[0].clone()
    ids[7, 2] = VOCAB
    write_ids(bad_ids, (ids, ids_train[1]), ids_test)
    expect_error("an id outside the table", text_path, bad_ids,
                 r"the training set: id 100 at sample 7, position 2 is not below 100, the rows "
                 r"of model text's embedding table")
    ids[7, 2] = -3
    write_ids(bad_ids, (ids, ids_train[1]), ids_test)
    expect_error("a negative id", text_path, bad_ids,
                 r"train_ids.npy: id -3 at sample 7, position 2 is outside \[0, 2\^24\)")
    expect_error("normalised ids", text_path, ids_dir,
                 r"--data_mean/--data_std normalise images; the data set holds integer ids",
                 ("--data_mean=0.5", "--data_std=0.25"))
    class LearnedState(TextLSTM):
        def __init__(self):
            super().__init__()
            self.h0 = nn.Parameter(torch.zeros(2, 1, 32))

        def forward(self, ids):
            x = self.embed(ids)
            h0 = self.h0.expand(2, x.shape[0], 32).contiguous()
            _, (h, _) = self.rnn(x, (h0, torch.zeros_like(h0)))
            return self.head(torch.cat([h[0], h[1]], 1))
    learned_h0 = os.path.join(SCRATCH, "learned_h0.onnx")
    export(LearnedState(), learned_h0, example=torch.ones(2, LENGTH, dtype=torch.long))
    expect_error("a learned initial state", learned_h0, ids_dir,
                 r"learned_h0.onnx: unsupported op 'LSTM' \(node '/rnn/LSTM'\)")
    # A sample of padding only has no sequence for pack_padded_sequence: the step that reaches
    # it stops, naming the sample of the training set.
    empty = os.path.join(SCRATCH, "ids_empty")
    ids = ids_train[0].clone()
    ids[7] = 0
    write_ids(empty, (ids, ids_train[1]), ids_test)
    expect_error("a sample of padding only, packed", packed_path, empty,
                 r"node '/rnn/LSTM[^']*' \(TorchLSTM\): sample \d+ of the batch has sequence length 0, "
                 r"not a whole number in \[1, 16\] \(pack_padded_sequence needs at least one step "
                 r"per sample\); sample \d+ of the batch is sample 7 of the training set")
    expect_error("augmented ids", text_path, ids_dir,
                 r"crop and flip augmentation apply to images; the training set holds integer ids",
                 ("--random_hflip",))
    # Streamed sets: only image folders and .npy arrays stream; an image whose header reads but
    # whose data do not decode stops training when it is reached, naming the file.
    expect_error("stream a cifar set", model_path, cifar,
                 r"images are streamed \(read as training goes\) from image folders and \.npy "
                 r"arrays only; this data set is cifar", ("--data_loading=stream",))
    broken = os.path.join(SCRATCH, "images_broken")
    shutil.rmtree(broken, ignore_errors=True)
    shutil.copytree(folder, broken)
    victim = os.path.join(broken, "train", "class03", sorted(
        os.listdir(os.path.join(broken, "train", "class03")))[0])
    data = bytearray(open(victim, "rb").read())
    data[-17] ^= 0x55  # IDAT's last data byte: the header still reads, the pixels do not.
    open(victim, "wb").write(bytes(data))
    expect_error("an image that does not decode, streamed", model_path, broken,
                 re.escape(victim) + r": cannot decode PNG", ("--data_loading=stream",))


if __name__ == "__main__":
    try:
        main()
    finally:
        for p in _processes:
            if p.poll() is None:
                p.kill()
