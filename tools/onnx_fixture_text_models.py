"""The text and tabular models of tools/make_onnx_fixtures.py (token ids or feature vectors as
input): a transformer with and without padding masks, a text CNN, LSTMs and GRUs (stacked,
bidirectional, packed), EmbeddingBags, category codes carried in a feature vector, models of
several inputs, and regression targets. The fixtures:
  text_mask  The same on padded ids (0 = padding): src_key_padding_mask in the encoder and a
             mean over the real tokens only (Equal, Not, Cast to bool, Expand of the mask,
             Where, ReduceSum).
  text_cnn   Kim's text CNN on token ids: Conv1d (ONNX Conv of a 1-D window), MaxPool1d,
             ReduceMax over time, Dropout.
  text_lstm  A 2-layer nn.LSTM on token ids (ONNX LSTM nodes with the weights' gates
             re-ordered by Slice and Concat), the head on out[:, -1] + h[-1].
  text_lstm_dynamic  text_lstm exported with a dynamic batch axis (its zero initial states a
             ConstantOfShape of the run-time batch, sliced per layer).
  text_bigru  A bidirectional nn.GRU (linear_before_reset=1, two directions' weights
             re-ordered), the head on the steps' mean and both final hidden states.
  text_bilstm  A bidirectional nn.LSTM without biases, the head on out[:, -1] and both final
             cell states (Y_c).
  tabular_mixed  Tabular features [B, 6] whose first two columns are category codes: each read
             through .long() (a Cast to int64) into its own nn.Embedding, concatenated with the
             four continuous columns, then an MLP.
  tabular_regression  An MLP on [B, 6] features with 3 outputs, scored against target values
             (regression): "targets" [B, 3] instead of "labels", "loss" nn.MSELoss's,
             l1_loss, l1_grad.<name> the same step with nn.L1Loss, and bce_loss,
             bce_grad.<name> with nn.BCEWithLogitsLoss against bce_targets [B, 3] in [0, 1];
             weighted_loss, weighted_grad.<name> with the outputs as classes:
             nn.CrossEntropyLoss(weight=class_weights, label_smoothing=0.1) on class_labels.
  text_pad   nn.Embedding(padding_idx=0) on padded ids (row 0 zeros, no gradient to it).
  text_two_inputs  model(input_ids, attention_mask): an embedding's mean over the tokens the
             mask keeps (mask.unsqueeze(-1).float()), then a Linear; two int64 inputs.
  tabular_two_inputs  model(numeric, codes): float features [B, 4] and int64 category codes
             [B, 2] (each through its nn.Embedding), concatenated, then an MLP.
  tabular_text_bag  model(ids, extra): nn.EmbeddingBag's mean of [B, 12] int64 ids (its Loop
             reading one of two inputs) beside [B, 3] float features; _dynamic: a dynamic
             batch axis on both inputs.
  text_bag   nn.EmbeddingBag in mean, sum and max modes on [B, 12] ids (torch exports each as
             an ONNX Loop over the bags), the head on the three concatenated.
  text_bag_dynamic  text_bag exported with a dynamic batch axis (the bags' offsets a Range).
  text_lstm_packed  A 2-layer bidirectional nn.LSTM on padded ids of unsorted lengths through
             pack_padded_sequence(enforce_sorted=False) (the export sorts the batch by length:
             TopK, Gather, sequence_lens, ScatterElements, Gather back), the head on the last
             layer's final hidden states.
  text_gru_packed  A packed nn.GRU exported with a dynamic batch axis, the head on
             pad_packed_sequence's output averaged over each sample's length (the lengths it
             returns) plus the final hidden state.
  text       A text classifier on token ids (an int64 input [B, 12]): nn.Embedding(50, 24),
             a positional embedding, nn.TransformerEncoderLayer(batch_first=True, GELU), the
             tokens' mean and a Linear head; 5 classes.
"""
import torch
from torch import nn


class TextClassifier(nn.Module):
    """A text classifier as users write one: nn.Embedding of token ids (the graph's int64
    input), a learned positional embedding, one nn.TransformerEncoderLayer(batch_first=True)
    with GELU, the mean over the tokens and a Linear head."""

    def __init__(self, vocab=50, length=12, dim=24, heads=3, classes=5):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(1, length, dim) * 0.5)
        self.encoder = nn.TransformerEncoderLayer(dim, heads, dim_feedforward=48, dropout=0.0,
                                                  activation="gelu", batch_first=True)
        self.head = nn.Linear(dim, classes)

    def forward(self, ids):
        return self.head(self.encoder(self.embed(ids) + self.pos).mean(1))


class MaskedText(TextClassifier):
    """TextClassifier on padded token ids (0 = padding, nn.Embedding's padding_idx): the
    encoder masks the padding (src_key_padding_mask: Equal, Expand, Cast to bool, Where of
    -inf into the attention scores) and the mean runs over the real tokens only (Not, Cast,
    ReduceSum, Clip, Div)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 24, padding_idx=0)

    def forward(self, ids):
        pad = ids == 0
        h = self.encoder(self.embed(ids) + self.pos, src_key_padding_mask=pad)
        keep = (~pad).unsqueeze(-1).float()
        return self.head((h * keep).sum(1) / keep.sum(1).clamp(min=1))


class TextCNN(nn.Module):
    """Kim's text CNN on token ids: nn.Embedding, transposed to [N, C, L], Conv1d of widths 3
    (padded, then MaxPool1d(2)) and 2, ReLU, the max over time (ReduceMax), Dropout, Linear."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.conv3 = nn.Conv1d(16, 8, 3, padding=1)
        self.pool = nn.MaxPool1d(2)
        self.conv2 = nn.Conv1d(16, 6, 2)
        self.drop = nn.Dropout(0.5)
        self.head = nn.Linear(14, 5)

    def forward(self, ids):
        x = self.embed(ids).transpose(1, 2)
        a = self.pool(torch.relu(self.conv3(x))).max(dim=2).values
        b = torch.relu(self.conv2(x)).amax(dim=2)
        return self.head(self.drop(torch.cat([a, b], 1)))


class TextLSTM(nn.Module):
    """A recurrent text classifier: nn.Embedding, a 2-layer nn.LSTM(batch_first=True) (each
    layer an ONNX LSTM whose weights are the state_dict's with their gates re-ordered), the
    head on the last step's output plus the last layer's final hidden state."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 12)
        self.rnn = nn.LSTM(12, 10, num_layers=2, batch_first=True)
        self.head = nn.Linear(10, 5)

    def forward(self, ids):
        out, (h, _) = self.rnn(self.embed(ids))
        return self.head(out[:, -1] + h[-1])


class TextBiGRU(nn.Module):
    """A bidirectional nn.GRU(batch_first=True) on token ids (an ONNX GRU of two directions,
    linear_before_reset=1, its gates re-ordered), the head on the steps' mean plus both final
    hidden states."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 12)
        self.rnn = nn.GRU(12, 10, batch_first=True, bidirectional=True)
        self.head = nn.Linear(20, 5)

    def forward(self, ids):
        out, h = self.rnn(self.embed(ids))
        return self.head(out.mean(1) + torch.cat([h[0], h[1]], 1))


class TabularMixed(nn.Module):
    """Category codes carried as floats in the feature vector, embedded, and the rest."""

    def __init__(self):
        super().__init__()
        self.first = nn.Embedding(10, 4)
        self.second = nn.Embedding(7, 3)
        self.mlp = nn.Sequential(nn.Linear(11, 16), nn.ReLU(), nn.Linear(16, 5))

    def forward(self, x):
        codes = x[:, :2].long()
        return self.mlp(torch.cat([self.first(codes[:, 0]), self.second(codes[:, 1]), x[:, 2:]],
                                  1))


class TabularRegression(nn.Sequential):
    """An MLP with three outputs scored against target values (nn.MSELoss)."""

    def __init__(self):
        super().__init__(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))


class TextTwoInputs(nn.Module):
    """model(input_ids, attention_mask), as a Hugging Face classifier is called: the mean of
    the embeddings of the tokens the mask keeps."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.head = nn.Linear(8, 5)

    def forward(self, input_ids, attention_mask):
        keep = attention_mask.unsqueeze(-1).float()
        return self.head((self.embed(input_ids) * keep).sum(1) / keep.sum(1))


class TabularTwoInputs(nn.Module):
    """model(numeric, codes): continuous features and category codes as two inputs."""

    def __init__(self):
        super().__init__()
        self.first = nn.Embedding(10, 3)
        self.second = nn.Embedding(7, 2)
        self.mlp = nn.Sequential(nn.Linear(9, 16), nn.ReLU(), nn.Linear(16, 5))

    def forward(self, numeric, codes):
        return self.mlp(torch.cat([self.first(codes[:, 0]), self.second(codes[:, 1]), numeric],
                                  1))


class TextPad(nn.Module):
    """nn.Embedding(padding_idx=0) on padded ids: row 0 starts at zeros and gets no gradient in
    PyTorch (the export does not say so: the importer finds the row of zeros)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 12, padding_idx=0)
        self.head = nn.Linear(12, 5)

    def forward(self, ids):
        return self.head(torch.tanh(self.embed(ids)).mean(1))


class TextBag(nn.Module):
    """nn.EmbeddingBag(mode) of a 2-D input (bags of equal length), in three modes."""

    def __init__(self):
        super().__init__()
        self.mean = nn.EmbeddingBag(50, 8, mode="mean")
        self.sum = nn.EmbeddingBag(50, 8, mode="sum")
        self.max = nn.EmbeddingBag(50, 8, mode="max")
        self.head = nn.Linear(24, 5)

    def forward(self, ids):
        return self.head(torch.cat([self.mean(ids), self.sum(ids), self.max(ids)], 1))


class TabularTextBag(nn.Module):
    """model(ids, extra): an nn.EmbeddingBag's mean of [B, 12] int64 ids (its Loop reads the
    ids input) beside [B, 3] float features."""

    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(50, 8, mode="mean")
        self.head = nn.Linear(11, 5)

    def forward(self, ids, extra):
        return self.head(torch.cat([self.bag(ids), extra], 1))


class PackedLSTM(nn.Module):
    """Padded ids (0 = padding) of unsorted lengths through pack_padded_sequence into a 2-layer
    bidirectional nn.LSTM; the head on both directions' final hidden states of the last layer."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 12)
        self.rnn = nn.LSTM(12, 10, num_layers=2, batch_first=True, bidirectional=True)
        self.head = nn.Linear(20, 5)

    def forward(self, ids):
        lengths = (ids != 0).sum(1)
        packed = nn.utils.rnn.pack_padded_sequence(self.embed(ids), lengths, batch_first=True,
                                                   enforce_sorted=False)
        _, (h, _) = self.rnn(packed)
        return self.head(torch.cat([h[-2], h[-1]], 1))


class PackedGRU(nn.Module):
    """A packed nn.GRU whose padded output (pad_packed_sequence: zeros past each length) is
    averaged over each sample's length (the lengths pad_packed_sequence returns), plus the final
    hidden state."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 12)
        self.rnn = nn.GRU(12, 10, batch_first=True)
        self.head = nn.Linear(10, 5)

    def forward(self, ids):
        lengths = (ids != 0).sum(1)
        packed = nn.utils.rnn.pack_padded_sequence(self.embed(ids), lengths, batch_first=True,
                                                   enforce_sorted=False)
        out, h = self.rnn(packed)
        out, lengths = nn.utils.rnn.pad_packed_sequence(out, batch_first=True,
                                                        total_length=ids.shape[1])
        return self.head(out.sum(1) / lengths.unsqueeze(1).to(out.dtype) + h[-1])


class TextBiLSTM(nn.Module):
    """A bidirectional nn.LSTM without biases, the head on the last step's output and both
    final cell states."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 12)
        self.rnn = nn.LSTM(12, 10, batch_first=True, bidirectional=True, bias=False)
        self.head = nn.Linear(20, 5)

    def forward(self, ids):
        out, (_, c) = self.rnn(self.embed(ids))
        return self.head(out[:, -1] + torch.cat([c[0], c[1]], 1))
