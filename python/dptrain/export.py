"""Writing a PyTorch model as gpu_worker trains it (--model=FILE.onnx)."""

import inspect
import warnings


def export_onnx(model, example_input, path, opset_version=None, input_names=None,
                dynamic_batch=False):
    """Writes `model` to `path` as gpu_worker --model=PATH trains it, and returns `path`.

    That is torch.onnx.export(model, example_input, path,
    training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False): the model in
    training mode, so BatchNorm and Dropout stay what they are, and no constant folding, so the
    initializers keep their state_dict names and the weights gpu_worker saves load back with
    model.load_state_dict (torch.onnx.export's defaults do neither, and gpu_worker refuses
    such a file). On PyTorch 2.x the TorchScript exporter is asked for (dynamo=False): it is
    the one that exports training mode. `example_input` is one batch, [N, C, H, W] (or
    [N, L] int64 token ids for a model that starts with nn.Embedding or nn.EmbeddingBag, or
    [N, F] float features for a model of tabular data; or a tuple of [N, n] batches for a
    model of several inputs, such as model(input_ids, attention_mask), whose data gpu_worker
    reads side by side from one array: np.concatenate([ids, mask], 1)), of 2 or more samples
    (any size trains: gpu_worker finds the batch in the graph's reshapes by it, which a batch
    of 1 leaves ambiguous where a transformer moves it off axis 0); `opset_version` as
    torch.onnx.export's (nn.LayerNorm exports as one node from 17; written out below, which
    gpu_worker fuses back). `input_names` names the graph's inputs (gpu_worker says each one's
    columns; torch's own names otherwise); `dynamic_batch` exports axis 0 of every input as
    dynamic (any batch size; gpu_worker trains either kind).

    Stochastic depth (torchvision.ops.StochasticDepth: EfficientNet, ConvNeXt, Swin, MaxViT)
    draws with torch.bernoulli, which torch.onnx cannot export in training mode: such modules
    are exported with p = 0 (every block kept), with a warning, so gpu_worker trains the model
    without stochastic depth.

    Exporting runs one training-mode forward pass, which moves BatchNorm's running statistics
    (the file holds them so moved); the model itself is left as it was, its state, its
    train/eval mode and its stochastic depth restored."""
    import torch

    kwargs = {"training": torch.onnx.TrainingMode.TRAINING, "do_constant_folding": False}
    if opset_version is not None:
        kwargs["opset_version"] = opset_version
    if input_names is not None:
        kwargs["input_names"] = list(input_names)
    if dynamic_batch:
        count = len(example_input) if isinstance(example_input, tuple) else 1
        names = list(input_names) if input_names is not None else None
        if names is None or len(names) != count:
            raise ValueError("dynamic_batch needs input_names, one per input")
        kwargs["dynamic_axes"] = {name: {0: "batch"} for name in names}
    if "dynamo" in inspect.signature(torch.onnx.export).parameters:
        kwargs["dynamo"] = False
    was_training = model.training
    # A copy with the state_dict's version metadata, which some modules' loading needs
    # (torchvision's MNASNet).
    current = model.state_dict()
    state = type(current)((k, v.detach().clone()) for k, v in current.items())
    if hasattr(current, "_metadata"):
        state._metadata = current._metadata
    dropping = [m for m in model.modules()
                if type(m).__name__ == "StochasticDepth" and getattr(m, "p", 0) > 0]
    drop_rates = [m.p for m in dropping]
    if dropping:
        warnings.warn(f"export_onnx: {len(dropping)} StochasticDepth modules exported with p=0 "
                      "(torch.onnx cannot export torch.bernoulli in training mode): gpu_worker "
                      "trains this model without stochastic depth")
    try:
        for m in dropping:
            m.p = 0.0
        torch.onnx.export(model, example_input, path, **kwargs)
    finally:
        for m, p in zip(dropping, drop_rates):
            m.p = p
        with torch.no_grad():
            model.load_state_dict(state)
        model.train(was_training)
    return path
