"""gpu_worker trains a model on tabular data, end to end: feature vectors saved by NumPy as
float64 arrays of shape (N, F) (train_features.npy; rounded to float32 when read) with labels of
300 classes (past a byte: labels are int32), an MLP written in PyTorch and exported to ONNX,
trained by 2 gpu_worker processes through 2 real ps_server shards; rank 0's saved weights load
into the PyTorch model with a strict load_state_dict and give, in PyTorch, the test accuracy
the worker printed. The built-in mlp trains on the same features. Then the bad input: features
of another length than the model's, integer features (read as ids), a NaN, augmentation of
feature vectors. Regression: float labels are target values, trained with nn.MSELoss (2 workers
x 2 shards), nn.L1Loss or (multi-label) nn.BCEWithLogitsLoss, and the test loss the worker
printed is PyTorch's from the saved weights; its bad input. Data without a test split: refused,
or split by --test_fraction. Class weights on a rare class (--class_weights). A model of two inputs on one array of their
columns. Helpers from tests/onnx_e2e_test.py; run by tests/tabular_e2e_test.sh; every
case prints one line, the first failure ends the run with a non-zero exit."""

import json
import os
import re
import subprocess
import sys

import numpy
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import onnx_e2e_test as e2e  # noqa: E402
import dptrain.export  # noqa: E402
import dptrain.safetensors  # noqa: E402

FEATURES, CLASSES, TRAIN, TEST = 24, 300, 3000, 600


def clusters(n, seed, centers):
    """n feature vectors: a class's centre plus unit noise, float64 as NumPy makes them."""
    rng = numpy.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, n)
    x = centers[labels] + rng.standard_normal((n, FEATURES))
    return x, labels


def write_features(folder, train, test, dtype=numpy.float64):
    os.makedirs(folder, exist_ok=True)
    for split, (xs, ys) in (("train", train), ("test", test)):
        numpy.save(os.path.join(folder, f"{split}_features.npy"), xs.astype(dtype))
        numpy.save(os.path.join(folder, f"{split}_labels.npy"), ys.astype(numpy.int64))


def mlp(features=FEATURES):
    return nn.Sequential(nn.Linear(features, 64), nn.ReLU(), nn.Linear(64, CLASSES))


def accuracy(net, saved, test):
    net.load_state_dict(dptrain.safetensors.load_file(saved), strict=True)
    net.eval()
    with torch.no_grad():
        x = torch.from_numpy(test[0]).float()
        return (net(x).argmax(1).numpy() == test[1]).mean()


def main():
    torch.manual_seed(0)
    centers = numpy.random.default_rng(0).standard_normal((CLASSES, FEATURES)) * 0.8
    train_set, test_set = clusters(TRAIN, 1, centers), clusters(TEST, 2, centers)
    data = os.path.join(e2e.SCRATCH, "tabular")
    write_features(data, train_set, test_set)
    model_path = os.path.join(e2e.SCRATCH, "tabular_mlp.onnx")
    e2e.export(mlp(), model_path, shape=(2, FEATURES))
    printed, saved, text = e2e.train("tabular", model_path, data, ("--epochs=8",),
                                     normalize=False)
    ours = accuracy(mlp(), saved, test_set)
    # One test sample may fall on the other side of an argmax between the two float paths.
    if abs(ours - printed) > 1.0 / TEST + 1e-9 or not 0.3 < printed <= 1.0:
        e2e.fail(f"tabular: the worker printed test_acc {printed}, PyTorch gets {ours} from the "
                 f"saved weights: {text[-600:]}")
    if (f"{TRAIN} training samples" not in text or f"{FEATURES} features each" not in text or
            f"{CLASSES} classes" not in text):
        e2e.fail(f"tabular: no line describing the features: {text[:800]}")
    print(f"ok: an exported MLP on float64 feature vectors ({FEATURES} features, {CLASSES} "
          f"classes), 2 workers x 2 shards: test_acc {printed:.4f} printed, {ours:.4f} in "
          "PyTorch from the saved weights", flush=True)

    # The built-in mlp takes any input shape, feature vectors too.
    r = subprocess.run([e2e.GPU_WORKER, "--mode=allreduce", "--world_size=1", "--lr=0.05",
                        "--model=mlp", f"--data_dir={data}", "--epochs=4", "--batch_size=25",
                        "--threads=1"], capture_output=True, text=True, timeout=240)
    done = re.search(r"done: .* test_acc ([0-9.]+)", r.stdout + r.stderr)
    if r.returncode != 0 or not done or not float(done.group(1)) > 15.0 / CLASSES:
        e2e.fail(f"built-in mlp on features: exit {r.returncode}: {(r.stdout + r.stderr)[-600:]}")
    print(f"ok: the built-in mlp on the same features: test_acc {float(done.group(1)):.4f}",
          flush=True)

    short = os.path.join(e2e.SCRATCH, "tabular_20.onnx")
    e2e.export(mlp(20), short, shape=(2, 20))
    e2e.expect_error("features of another length", short, data,
                     rf"the training set holds {FEATURES} feature\(s\) per sample but model "
                     r"tabular_20 takes 20 feature\(s\) per sample")
    ints = os.path.join(e2e.SCRATCH, "tabular_int")
    write_features(ints, (train_set[0].round(), train_set[1]), (test_set[0].round(), test_set[1]),
                   numpy.int64)
    e2e.expect_error("integer features", model_path, ints,
                     r"train_features.npy: holds integer ids; a features file holds floats of "
                     r"shape \(N, F\) \(integers: save them as float32\)")
    nan = os.path.join(e2e.SCRATCH, "tabular_nan")
    x = train_set[0].copy()
    x[17, 5] = numpy.nan
    write_features(nan, (x, train_set[1]), test_set)
    e2e.expect_error("a NaN feature", model_path, nan,
                     r"train_features.npy: value nan at sample 17, index 5 \(of the sample as "
                     r"stored\) is not finite in float32")
    e2e.expect_error("augmented features", model_path, data,
                     r"crop and flip augmentation apply to images; the training set holds "
                     r"feature vectors", ("--random_hflip",))
    regression(train_set[0], test_set[0])
    held_out(train_set)
    weighted(train_set, test_set)
    two_inputs()


class TwoInputs(nn.Module):
    """model(numeric, codes): float features and int64 category codes, two graph inputs."""

    def __init__(self):
        super().__init__()
        self.first = nn.Embedding(10, 4)
        self.second = nn.Embedding(7, 4)
        self.mlp = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 5))

    def forward(self, numeric, codes):
        return self.mlp(torch.cat([self.first(codes[:, 0]), self.second(codes[:, 1]), numeric],
                                  1))


def two_inputs():
    """A model of two inputs (float features and int64 codes) trains on one float64 array of
    their columns side by side (2 workers x 2 shards); the saved weights give in PyTorch, fed
    the two inputs, the test accuracy the worker printed. Columns of another count: one line."""
    rng = numpy.random.default_rng(9)

    def samples(n):
        codes = numpy.stack([rng.integers(0, 10, n), rng.integers(0, 7, n)], 1)
        numeric = rng.standard_normal((n, 4))
        labels = (codes[:, 0] + codes[:, 1] + (numeric[:, 0] > 0)) % 5
        return numpy.concatenate([numeric, codes], 1), labels

    train, test = samples(TRAIN), samples(TEST)
    data = os.path.join(e2e.SCRATCH, "two_inputs")
    write_features(data, train, test)
    model_path = os.path.join(e2e.SCRATCH, "two_inputs.onnx")
    example = (torch.zeros(2, 4), torch.zeros(2, 2, dtype=torch.long))
    e2e.export(TwoInputs(), model_path, example=example, input_names=("numeric", "codes"),
               dynamic_batch=True)
    try:
        dptrain.export.export_onnx(TwoInputs(), example, model_path + ".x", dynamic_batch=True)
        e2e.fail("export_onnx(dynamic_batch=True) without input_names did not refuse")
    except ValueError as e:
        if "dynamic_batch needs input_names, one per input" not in str(e):
            raise
    printed, saved, text = e2e.train("two_inputs", model_path, data, ("--epochs=6",),
                                     normalize=False)
    net = TwoInputs()
    net.load_state_dict(dptrain.safetensors.load_file(saved), strict=True)
    net.eval()
    with torch.no_grad():
        x = torch.from_numpy(test[0]).float()
        ours = (net(x[:, :4], x[:, 4:].long()).argmax(1).numpy() == test[1]).mean()
    if abs(ours - printed) > 1.0 / TEST + 1e-9 or not 0.5 < printed <= 1.0:
        e2e.fail(f"two inputs: printed test_acc {printed}, PyTorch {ours}: {text[-600:]}")
    if ("2 inputs, read side by side from one array of 6 columns per sample: numeric = columns "
            "[0, 4), codes = columns [4, 6)") not in text:
        e2e.fail(f"two inputs: no line naming the inputs' columns: {text[:1200]}")
    print(f"ok: model(numeric, codes) on one array of their 6 columns, 2 workers x 2 shards: "
          f"test_acc {printed:.4f} printed, {ours:.4f} in PyTorch fed the two inputs",
          flush=True)
    narrow = os.path.join(e2e.SCRATCH, "two_inputs_narrow")
    write_features(narrow, (train[0][:, 1:], train[1]), (test[0][:, 1:], test[1]))
    e2e.expect_error("columns of another count", model_path, narrow,
                     r"the training set holds 5 feature\(s\) per sample but model two_inputs "
                     r"takes 6 feature\(s\) per sample")


def weighted(train_set, test_set):
    """A rare class (about 9 % of the samples) weighted 9 times the other (--class_weights, as
    nn.CrossEntropyLoss(weight=)): the printed test accuracy is PyTorch's from the saved
    weights, and the rare class is found more often than without the weights; the refusals."""
    def rare(xs):
        return (xs[:, 0] + xs[:, 1] > 2.4).astype(numpy.int64)

    data = os.path.join(e2e.SCRATCH, "imbalanced")
    write_features(data, (train_set[0], rare(train_set[0])), (test_set[0], rare(test_set[0])))
    net = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 2))
    model_path = os.path.join(e2e.SCRATCH, "imbalanced.onnx")
    e2e.export(net, model_path, shape=(2, FEATURES))
    x_test = torch.from_numpy(test_set[0]).float()
    y_test = rare(test_set[0])
    recall = {}
    for weights in ("", "1,9"):
        saved = os.path.join(e2e.SCRATCH, f"imbalanced{weights}.safetensors")
        metrics = os.path.join(e2e.SCRATCH, f"imbalanced{weights}.jsonl")
        r = subprocess.run([e2e.GPU_WORKER, "--mode=allreduce", "--world_size=1", "--lr=0.1",
                            f"--model={model_path}", f"--data_dir={data}", "--epochs=3",
                            "--batch_size=25", "--threads=1", f"--save_model={saved}",
                            f"--metrics_out={metrics}"] +
                           ([f"--class_weights={weights}"] if weights else []),
                           capture_output=True, text=True, timeout=240)
        done = re.search(r"done: .* test_acc ([0-9.]+)", r.stdout)
        if r.returncode != 0 or not done:
            e2e.fail(f"--class_weights={weights}: exit {r.returncode}: "
                     f"{(r.stdout + r.stderr)[-600:]}")
        net.load_state_dict(dptrain.safetensors.load_file(saved), strict=True)
        with torch.no_grad():
            predicted = net(x_test).argmax(1).numpy()
        ours = (predicted == y_test).mean()
        if abs(ours - float(done.group(1))) > 1.0 / TEST + 1e-9:
            e2e.fail(f"--class_weights={weights}: printed test_acc {done.group(1)}, PyTorch "
                     f"{ours}")
        recall[weights] = (predicted[y_test == 1] == 1).mean()
        # The test loss over all 600 samples (evaluated in batches of 500) is PyTorch's: with
        # weights, the batches' means combine by their label weights.
        final = [json.loads(line) for line in open(metrics)][-1]
        with torch.no_grad():
            torch_loss = nn.functional.cross_entropy(
                net(x_test), torch.from_numpy(y_test),
                weight=torch.tensor([1.0, 9.0]) if weights else None).item()
        if abs(final["test_loss"] - torch_loss) > 1e-5 * max(1.0, torch_loss):
            e2e.fail(f"--class_weights={weights}: test_loss {final['test_loss']}, PyTorch "
                     f"{torch_loss}")
    if not recall["1,9"] > recall[""]:
        e2e.fail(f"--class_weights=1,9 found the rare class no more often: {recall}")
    print(f"ok: a rare class ({y_test.mean():.3f} of the test set) weighted 9: its recall "
          f"{recall['']:.3f} -> {recall['1,9']:.3f}, the printed test_acc PyTorch's",
          flush=True)
    e2e.expect_error("class weights of another count", model_path, data,
                     r"imbalanced.onnx: 3 class weights for a model of 2 outputs \(classes\)$",
                     ("--class_weights=1,2,3",))
    e2e.expect_error("class weights with mse", model_path, data,
                     r"--class_weights: apply to --loss=cross_entropy only$",
                     ("--class_weights=1,9", "--loss=mse"))
    e2e.expect_error("a negative class weight", model_path, data,
                     r"--class_weights: every weight must be >= 0, and one > 0$",
                     ("--class_weights=1,-9",))


def held_out(train_set):
    """Data without a test split: refused in one line, or a held-out fraction of the training
    set is the test set (--test_fraction); the flag with a test split present is refused."""
    alone = os.path.join(e2e.SCRATCH, "no_test_split")
    os.makedirs(alone, exist_ok=True)
    numpy.save(os.path.join(alone, "train_features.npy"), train_set[0])
    numpy.save(os.path.join(alone, "train_labels.npy"), train_set[1])
    e2e.expect_error("no test split", "mlp", alone,
                     r"no_test_split has no test split \(test_images.npy \(or test_ids.npy, "
                     r"test_features.npy\) and test_labels.npy\): save one, or hold out part of "
                     r"the training set with --test_fraction \(e.g. 0.1\)$")
    r = subprocess.run([e2e.GPU_WORKER, "--mode=allreduce", "--world_size=1", "--lr=0.5",
                        "--model=mlp", f"--data_dir={alone}", "--epochs=3", "--batch_size=25",
                        "--threads=1", "--test_fraction=0.2", "--seed=3"],
                       capture_output=True, text=True, timeout=240)
    done = re.search(r"done: .* test_acc ([0-9.]+)", r.stdout)
    expected = (f"the test set is {TRAIN // 5} of the {TRAIN} training samples, held out "
                "(--test_fraction=0.2, --seed=3")
    if (r.returncode != 0 or not done or expected not in r.stdout or
            f"{TRAIN - TRAIN // 5} training samples" not in r.stdout or
            not float(done.group(1)) > 30.0 / CLASSES):
        e2e.fail(f"--test_fraction: exit {r.returncode}: {(r.stdout + r.stderr)[-800:]}")
    print(f"ok: data without a test split, --test_fraction=0.2: {TRAIN // 5} samples held out, "
          f"test_acc {float(done.group(1)):.4f}", flush=True)
    e2e.expect_error("--test_fraction with a test split", "mlp",
                     os.path.join(e2e.SCRATCH, "tabular"),
                     r"--test_fraction holds out a test set for data without one, and .*tabular "
                     r"has a test split", ("--test_fraction=0.2",))


def write_targets(folder, x, y, x_test, y_test):
    os.makedirs(folder, exist_ok=True)
    for split, xs, ys in (("train", x, y), ("test", x_test, y_test)):
        numpy.save(os.path.join(folder, f"{split}_features.npy"), xs)
        numpy.save(os.path.join(folder, f"{split}_labels.npy"), ys)


def train_one(loss, net, model_path, data):
    """One worker (all-reduce) trains `model_path` with --loss=`loss`; returns the test loss it
    printed and `net` with the saved weights loaded."""
    saved = os.path.join(e2e.SCRATCH, f"{loss}.safetensors")
    r = subprocess.run([e2e.GPU_WORKER, "--mode=allreduce", "--world_size=1", "--lr=0.05",
                        f"--model={model_path}", f"--data_dir={data}", "--epochs=3",
                        "--batch_size=25", "--threads=1", f"--loss={loss}",
                        f"--save_model={saved}"],
                       capture_output=True, text=True, timeout=240)
    done = re.search(r"done: .* test_loss ([0-9.]+)", r.stdout)
    if r.returncode != 0 or not done or "test_acc" in r.stdout:
        e2e.fail(f"--loss={loss}: exit {r.returncode}: {(r.stdout + r.stderr)[-600:]}")
    net.load_state_dict(dptrain.safetensors.load_file(saved), strict=True)
    return float(done.group(1)), net


def expect_same_loss(name, printed, ours, baseline):
    """The printed test loss (4 decimals) is PyTorch's from the saved weights, and the model
    learned: its loss is well below the baseline's (a constant prediction)."""
    if abs(ours - printed) > 1e-4 + 1e-4 * ours or not printed < 0.7 * baseline:
        e2e.fail(f"{name}: printed test_loss {printed}, PyTorch {ours}, baseline {baseline}")


def regression(x, x_test):
    """Float labels are regression targets: (N, 2) float64 values of a smooth function of the
    features, an MLP with two outputs trained with nn.MSELoss by 2 workers x 2 shards; the test
    loss printed is PyTorch's from the saved weights, and well below the targets' variance.
    Then (N,) targets with --loss=l1 and multi-label 0/1 targets with --loss=bce on one worker,
    and the bad input."""
    rng = numpy.random.default_rng(5)
    mix = rng.standard_normal((FEATURES, 2)) / numpy.sqrt(FEATURES)

    def targets(xs):  # Plus noise, so that the test loss is far from 0 (0.09 at best).
        z = xs @ mix
        return (numpy.stack([numpy.tanh(z[:, 0]), z[:, 1] * 0.5], 1) +
                0.3 * rng.standard_normal((len(xs), 2)))

    y, y_test = targets(x), targets(x_test)
    data = os.path.join(e2e.SCRATCH, "regression")
    write_targets(data, x, y, x_test, y_test)

    def net(outputs=2):
        return nn.Sequential(nn.Linear(FEATURES, 64), nn.Tanh(), nn.Linear(64, outputs))

    model_path = os.path.join(e2e.SCRATCH, "regression_mlp.onnx")
    e2e.export(net(), model_path, shape=(2, FEATURES))
    printed, saved, text = e2e.train("regression", model_path, data, ("--epochs=6",),
                                     normalize=False, score="test_loss")
    trained = net()
    trained.load_state_dict(dptrain.safetensors.load_file(saved), strict=True)
    with torch.no_grad():
        ours = nn.functional.mse_loss(trained(torch.from_numpy(x_test).float()),
                                      torch.from_numpy(y_test).float()).item()
    variance = float(y_test.var(0).mean())
    # Printed with 4 decimals; the two float paths agree far closer than that.
    if abs(ours - printed) > 1e-4 + 1e-4 * ours or not printed < 0.5 * variance:
        e2e.fail(f"regression: the worker printed test_loss {printed}, PyTorch gets {ours} from "
                 f"the saved weights (targets' variance {variance}): {text[-600:]}")
    if "2 target value(s) per sample (regression)" not in text or "test_acc" in text:
        e2e.fail(f"regression: the lines do not describe a regression: {text[-1200:]}")
    print(f"ok: an exported MLP with two outputs on float64 regression targets, nn.MSELoss, "
          f"2 workers x 2 shards: test_loss {printed:.4f} printed, {ours:.4f} in PyTorch from the "
          f"saved weights (targets' variance {variance:.4f})", flush=True)

    # One target per sample, (N,), and nn.L1Loss, on one worker.
    single = os.path.join(e2e.SCRATCH, "regression_single")
    write_targets(single, x, y[:, 0], x_test, y_test[:, 0])
    one = os.path.join(e2e.SCRATCH, "regression_one.onnx")
    e2e.export(net(1), one, shape=(2, FEATURES))
    printed, trained = train_one("l1", net(1), one, single)
    with torch.no_grad():
        ours = nn.functional.l1_loss(trained(torch.from_numpy(x_test).float())[:, 0],
                                     torch.from_numpy(y_test[:, 0]).float()).item()
    baseline = float(numpy.abs(y_test[:, 0] - y[:, 0].mean()).mean())
    expect_same_loss("l1 regression", printed, ours, baseline)
    print(f"ok: one target per sample ((N,) float64), --loss=l1, one worker: test_loss "
          f"{printed:.4f} printed, {ours:.4f} in PyTorch (the mean's {baseline:.4f})", flush=True)

    # Multi-label: three 0/1 targets per sample (float32), nn.BCEWithLogitsLoss.
    tags = os.path.join(e2e.SCRATCH, "multilabel")
    planes = rng.standard_normal((FEATURES, 3))
    z, z_test = (x @ planes > 0.3).astype(numpy.float32), (x_test @ planes > 0.3).astype(numpy.float32)
    write_targets(tags, x, z, x_test, z_test)
    three = os.path.join(e2e.SCRATCH, "multilabel.onnx")
    e2e.export(net(3), three, shape=(2, FEATURES))
    printed, trained = train_one("bce", net(3), three, tags)
    with torch.no_grad():
        logits = trained(torch.from_numpy(x_test).float())
        ours = nn.functional.binary_cross_entropy_with_logits(logits,
                                                              torch.from_numpy(z_test)).item()
        hits = ((logits > 0).float() == torch.from_numpy(z_test)).float().mean().item()
    p = z.mean(0)  # Predicting each label's frequency.
    baseline = float(-(p * numpy.log(p) + (1 - p) * numpy.log(1 - p)).mean())
    expect_same_loss("multi-label", printed, ours, baseline)
    print(f"ok: three 0/1 labels per sample, --loss=bce, one worker: test_loss {printed:.4f} "
          f"printed, {ours:.4f} in PyTorch (the label frequencies' {baseline:.4f}; "
          f"{hits:.3f} of the test labels right)", flush=True)

    e2e.expect_error("cross-entropy on regression targets", model_path, data,
                     r"--loss=cross_entropy is for class labels, and .*regression holds regression "
                     r"targets \(2 float value\(s\) per sample\): --loss=mse, l1 or bce",
                     ("--loss=cross_entropy",))
    e2e.expect_error("the built-in mlp on regression targets", "mlp", data,
                     r"--model=mlp is a built-in classifier, and .* holds regression targets")
    e2e.expect_error("targets per sample other than the outputs", one, data,
                     r"regression_one.onnx has 1 output\(s\), and the data in .* has 2 target "
                     r"value\(s\) per sample")
    bad = os.path.join(e2e.SCRATCH, "regression_nan")
    y_nan = y.copy()
    y_nan[9, 1] = numpy.inf
    write_targets(bad, x, y_nan, x_test, y_test)
    e2e.expect_error("bce on targets outside [0, 1]", model_path, data,
                     r"--loss=bce takes target values in \[0, 1\] \(probabilities: multi-label\), "
                     r"and the training set has \S+ at sample [0-9]+, index [01]$",
                     ("--loss=bce",))
    e2e.expect_error("an infinite target", model_path, bad,
                     r"train_labels.npy: target value inf at sample 9, index 1 is not finite "
                     r"in float32")


if __name__ == "__main__":
    try:
        main()
    finally:
        for p in e2e._processes:
            if p.poll() is None:
                p.kill()
