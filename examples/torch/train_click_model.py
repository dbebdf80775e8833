"""A click-through-rate model (DLRM style) on a generated click log whose best possible AUC is
known: one embedding table per id field, each a dptrain.torch.SparseEmbedding whose rows live
on the parameter-server shards (row id mod shards; a step moves only its batch's rows), and a
dense head (the fields' pairwise dot products beside the embeddings, then an MLP) trained
through dpt.DistributedOptimizer, i.e. by the job's mode.

usage: deploy/local_cluster.sh --workers=2 --shards=2 --run -- \\
         python3 examples/torch/train_click_model.py [--train=10000000] [--epochs=1]
         [--steps=0] [--batch=2048] [--rows=1000000] [--fields=3] [--dim=16] [--lr=1.0]
         [--dense_lr=0.003] [--emb_scale=0.1] [--hidden=64] [--zipf=1.5] [--effect_std=0.6]
         [--true_dim=4] [--pair_std=0.3] [--bias=-1.4] [--test=200000] [--evals=4] [--seed=1]
         [--prefetch=0]
The tables need the shards (DPTRAIN_PS): local_cluster.sh's ps mode, its default, starts them
(averaging only, so the head's gradients are averaged there too); in allreduce or master mode
start ps_server shards yourself (--optimizer=none) and set DPTRAIN_PS, and the head goes
through the ring or the master while the rows go to the shards.

The click log. Impression i of the training log (or of the test log, another stream) is a
pure function of (--seed, i): nothing is stored, every rank can produce any impression, and
rank r of W trains on impressions [r*B/W, (r+1)*B/W) of each global batch of B (--batch).
Uniforms come from splitmix64 over (seed, stream, i) in numpy uint64 arithmetic, vectorised;
there is no per-id generator and nothing the size of a table anywhere.
- Ids: field f's id is a popularity rank k in [0, --rows) drawn from a discretised power law
  (Zipf), P(k) ~ (k+1)^-zipf (the continuous CDF inverted, then floored), mapped to a row by
  the bijection k -> (k * A + offset_f) mod rows, so that the hot rows are spread over the
  table and its shards rather than all at its front.
- Clicks: P(click) = sigmoid(bias + sum_f a_f(id_f) + sum_{f<g} <u_f(id_f), u_g(id_g)>): each
  id has a hidden true effect a = effect_std * N(0, 1) and a hidden true embedding u of
  true_dim components, N(0, 1) scaled so that each pair's dot product has std pair_std, all
  hashed from (seed, field, id) (Box-Muller). The label is 1 when another uniform of (seed,
  stream, i) falls below P(click). At the defaults the test CTR is 0.237 and the additive
  part alone would rank the test log at AUC 0.743 of the 0.772 possible: the interactions,
  which the model's dot products are there to learn, carry the rest.
- Best possible: the AUC of the true click probabilities themselves against the test labels
  (the Bayes scores: no model beats them in expectation), and their log loss.

Why --zipf=1.5: a model can only approach the optimum on impressions whose ids it has seen
often enough. Every id's effect and embedding are drawn with the same spread, hot or cold (a
cold id is neither made uninformative nor tied to a hot one), so an id the training log shows
rarely is a real, unlearnable loss against the optimum, and the exponent is what keeps such
impressions few. At the defaults (1M rows a field, 10M training impressions) each field's
training log holds about 68,000 distinct ids (7% of the table; the shards create only the rows
touched) and 2.5% of the test impressions fall on an id seen fewer than 100 times (0.4% on an
id never seen); the true model with the effects and embeddings of ids seen < 100 times
zeroed scores AUC 0.767 against 0.772. At --zipf=1.2 13% of the test impressions would have
such an id in each field (that ceiling: 0.751 against 0.774) and the 0.01 target could not
be met by training for minutes on 2 cores. The rows start as the shards make them, N(0, 1)
(as nn.Embedding's); the model scales them by --emb_scale, which under the shards' Adagrad is
the same as rows starting at N(0, emb_scale^2) with the rate lr * emb_scale: small random
embeddings for ids not yet seen, and random enough to break the dot products' symmetry.

AUC is computed here (rank-based: the Mann-Whitney statistic, ties at their average rank), as
is the log loss. Rank 0 prints a line at each of --evals points (and at each epoch's end):
the training loss since the previous line (mean over ranks), the test log loss and AUC each
beside its best possible, and the training speed (evaluation excluded); and last
`test AUC 0.7xxx (best possible 0.7yyy), gap 0.0zzz; ...`.

--prefetch=1: each step, after backward, the next batch is drawn and every table prefetches
its rows (SparseEmbedding.prefetch), so a table's pull of the next rows leaves as soon as its
push of this step is done, beside the other tables' pushes; the rows and the results are the
same as with --prefetch=0. It is for shards on other machines, where a pull waits on the
network: with the workers and shards on one 2-core machine it gained nothing measurable
(docs/torch.md)."""

import math
import sys
import time

import numpy as np
import torch
from torch import nn

FLAGS = {"train": 10_000_000, "epochs": 1, "steps": 0, "batch": 2048, "rows": 1_000_000,
         "fields": 3, "dim": 16, "lr": 1.0, "dense_lr": 0.003, "emb_scale": 0.1, "hidden": 64,
         "zipf": 1.5, "effect_std": 0.6, "true_dim": 4, "pair_std": 0.3, "bias": -1.4,
         "test": 200_000, "evals": 4, "seed": 1, "prefetch": 0}


def parse_flags(argv):
    flags = dict(FLAGS)
    for arg in argv:
        if arg in ("-h", "--help"):
            print(__doc__)
            sys.exit(0)
        key, _, value = arg.lstrip("-").partition("=")
        if key not in flags or not value:
            sys.exit(f"train_click_model.py: unknown flag or missing value: {arg} "
                     f"(flags: {', '.join('--' + k for k in flags)})")
        flags[key] = type(flags[key])(value)
    return flags


# ---- The generated click log.

_MASK = (1 << 64) - 1


def _mix(x):
    """splitmix64's finalizer on a Python int (for stream keys)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def _mix_array(x):
    """splitmix64's finalizer on a uint64 array (wrapping arithmetic)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class ClickLog:
    """The generator: impressions (ids, labels, true click probabilities) as pure functions of
    (seed, log, index). Holds nothing that grows with the table or the log."""

    TRAIN, TEST = 1, 2

    def __init__(self, seed, rows, fields, zipf, effect_std, bias, true_dim=0, pair_std=0.0):
        if zipf <= 1:
            raise ValueError("--zipf must be > 1")
        self.seed, self.rows, self.fields = seed, rows, fields
        self.zipf, self.effect_std, self.bias = zipf, effect_std, bias
        self.true_dim = true_dim
        # Components of std c make a pair's dot product's std c^2 sqrt(true_dim).
        self._component_std = math.sqrt(pair_std / math.sqrt(true_dim)) if true_dim else 0.0
        self._tail = (rows + 1.0) ** (1.0 - zipf)
        step = int(rows * 0.6180339887498949) | 1
        while math.gcd(step, rows) != 1:
            step += 2
        self._step = step  # k -> (k * step + offset) mod rows is a bijection of the rows.
        self._offsets = [self._key("offset", f) % rows for f in range(fields)]

    def _key(self, *parts):
        key = _mix(self.seed)
        for p in parts:
            p = p if isinstance(p, int) else int.from_bytes(p.encode(), "little") & _MASK
            key = _mix(key ^ p)
        return np.uint64(key)

    def _uniform(self, key, index):
        """Uniforms in (0, 1), one per uint64 in `index`, for the stream `key`."""
        bits = _mix_array(_mix_array(index) ^ key) >> np.uint64(11)
        return (bits.astype(np.float64) + 0.5) * (1.0 / (1 << 53))

    def ids(self, log, index):
        """len(index) x fields int64 row ids."""
        out = np.empty((len(index), self.fields), dtype=np.int64)
        s = self.zipf
        for f in range(self.fields):
            u = self._uniform(self._key("id", log, f), index)
            # Inverse CDF of the density ~ x^-s on [1, rows + 1), floored: P(k) ~ (k + 1)^-s.
            x = (1.0 - u * (1.0 - self._tail)) ** (1.0 / (1.0 - s))
            k = np.minimum(np.floor(x).astype(np.uint64) - np.uint64(1),
                           np.uint64(self.rows - 1))
            out[:, f] = ((k * np.uint64(self._step) + np.uint64(self._offsets[f]))
                         % np.uint64(self.rows)).astype(np.int64)
        return out

    def effects(self, field, ids):
        """The true effect of each id of `field` (float64): effect_std * N(0, 1)."""
        index = ids.astype(np.uint64)
        u1 = self._uniform(self._key("effect", field, 1), index)
        u2 = self._uniform(self._key("effect", field, 2), index)
        return self.effect_std * np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)

    def vectors(self, field, ids):
        """The true embedding of each id of `field`: len(ids) x true_dim (float64)."""
        index = ids.astype(np.uint64)
        out = np.empty((len(ids), self.true_dim))
        for j in range(self.true_dim):
            u1 = self._uniform(self._key("vector", field, j, 1), index)
            u2 = self._uniform(self._key("vector", field, j, 2), index)
            out[:, j] = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)
        return out * self._component_std

    def impressions(self, log, start, count):
        """Impressions [start, start + count) of `log`: (ids int64 [count, fields],
        labels float32 [count], true click probabilities float64 [count])."""
        index = np.arange(start, start + count, dtype=np.uint64)
        ids = self.ids(log, index)
        logit = np.full(count, self.bias)
        for f in range(self.fields):
            logit += self.effects(f, ids[:, f])
        if self.true_dim:
            vectors = [self.vectors(f, ids[:, f]) for f in range(self.fields)]
            for a in range(self.fields):
                for b in range(a + 1, self.fields):
                    logit += (vectors[a] * vectors[b]).sum(axis=1)
        p = 1.0 / (1.0 + np.exp(-logit))
        labels = (self._uniform(self._key("click", log), index) < p).astype(np.float32)
        return torch.from_numpy(ids), torch.from_numpy(labels), p


def auc(scores, labels):
    """Area under the ROC curve: the probability that a random positive scores above a
    random negative, ties counting one half (Mann-Whitney U with average ranks)."""
    scores, labels = np.asarray(scores, dtype=np.float64), np.asarray(labels) > 0.5
    _, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    below = np.cumsum(counts) - counts  # Scores strictly below each distinct value.
    ranks = (below + (counts + 1) / 2.0)[inverse]  # 1-based average ranks.
    positives = int(labels.sum())
    negatives = len(labels) - positives
    if positives == 0 or negatives == 0:
        return float("nan")
    return float((ranks[labels].sum() - positives * (positives + 1) / 2.0)
                 / (positives * negatives))


def log_loss(p, labels):
    p = np.clip(np.asarray(p, dtype=np.float64), 1e-7, 1 - 1e-7)
    y = np.asarray(labels) > 0.5
    return float(-np.mean(np.where(y, np.log(p), np.log(1 - p))))


# ---- The model.

class ClickModel(nn.Module):
    """DLRM's shape without dense features: an embedding per field, their pairwise dot
    products, and an MLP on [embeddings, dots] giving the click logit. `tables` are
    SparseEmbedding modules (or nn.Embedding, for a one-process check)."""

    def __init__(self, tables, dim, hidden, emb_scale):
        super().__init__()
        self.tables = tables  # Not registered: their rows are not dense parameters.
        self.emb_scale = emb_scale
        fields = len(tables)
        self.pairs = [(a, b) for a in range(fields) for b in range(a + 1, fields)]
        self.mlp = nn.Sequential(nn.Linear(fields * dim + len(self.pairs), hidden), nn.ReLU(),
                                 nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def forward(self, ids):
        vectors = [t(ids[:, f]) * self.emb_scale for f, t in enumerate(self.tables)]
        dots = [(vectors[a] * vectors[b]).sum(dim=1, keepdim=True) for a, b in self.pairs]
        return self.mlp(torch.cat(vectors + dots, dim=1)).squeeze(1)


def main():
    flags = parse_flags(sys.argv[1:])
    import dptrain.torch as dpt

    torch.set_num_threads(1)  # Every worker of local_cluster.sh shares this host.
    dpt.init()
    rank, world = dpt.rank(), dpt.size()
    batch = flags["batch"]
    if batch % world:
        sys.exit(f"--batch={batch} must be a multiple of the {world} workers")
    part = batch // world
    log = ClickLog(flags["seed"], flags["rows"], flags["fields"], flags["zipf"],
                   flags["effect_std"], flags["bias"], flags["true_dim"], flags["pair_std"])
    tables = [dpt.SparseEmbedding(flags["rows"], flags["dim"], f"click_field{f}",
                                  optimizer="adagrad", lr=flags["lr"], seed=flags["seed"])
              for f in range(flags["fields"])]
    torch.manual_seed(flags["seed"])
    model = ClickModel(tables, flags["dim"], flags["hidden"], flags["emb_scale"])
    dpt.broadcast_parameters(model.state_dict(), root_rank=0)
    optimizer = dpt.DistributedOptimizer(torch.optim.Adam(model.parameters(),
                                                          lr=flags["dense_lr"]),
                                         named_parameters=model.named_parameters())
    loss_fn = nn.BCEWithLogitsLoss()

    # The test log: every rank scores its share; the scores meet on every rank by an
    # all-reduce (sum) of a vector each rank filled at its own positions.
    test_n = flags["test"]
    test_ids, test_labels, test_p = log.impressions(ClickLog.TEST, 0, test_n)
    best_auc, best_loss = auc(test_p, test_labels), log_loss(test_p, test_labels)
    share = -(-test_n // world)
    mine = slice(rank * share, min(test_n, (rank + 1) * share))

    def evaluate():
        scores = torch.zeros(test_n)
        with torch.no_grad():
            for at in range(mine.start, mine.stop, 16384):
                stop = min(at + 16384, mine.stop)
                scores[at:stop] = torch.sigmoid(model(test_ids[at:stop]))
        scores = dpt.allreduce(scores, average=False, name="test_scores").numpy()
        return auc(scores, test_labels.numpy()), log_loss(scores, test_labels.numpy())

    steps_per_epoch = flags["train"] // batch
    total = steps_per_epoch * flags["epochs"]
    if flags["steps"]:
        total = min(total, flags["steps"])
    if total < 1:
        sys.exit(f"--train={flags['train']} holds no global batch of {batch}")
    evals = {max(1, round(total * (e + 1) / flags["evals"])) for e in range(flags["evals"])}
    evals |= {min(total, steps_per_epoch * (e + 1)) for e in range(flags["epochs"])} | {total}
    if rank == 0:
        print(f"click log: {flags['fields']} fields x {flags['rows']:,} rows, Zipf "
              f"{flags['zipf']}, {flags['train']:,} training impressions "
              f"({total} steps of {batch}, {world} worker(s)), {test_n:,} test impressions, "
              f"test CTR {test_labels.mean().item():.4f}", flush=True)
    start, seen, loss_sum, trained, evaluating = time.time(), 0, 0.0, 0, 0.0
    step = 0
    while step < total:
        epoch = step // steps_per_epoch
        # Every rank visits the batches in the same order: in order in the first epoch,
        # shuffled (by the seed and the epoch) in later ones.
        order = (np.arange(steps_per_epoch) if epoch == 0 else
                 np.random.default_rng([flags["seed"], epoch]).permutation(steps_per_epoch))
        upcoming = None  # The next batch, when its rows were prefetched.
        for i, b in enumerate(order):
            if step == total:
                break
            ids, labels = upcoming or log.impressions(ClickLog.TRAIN,
                                                      int(b) * batch + rank * part, part)[:2]
            upcoming = None
            optimizer.zero_grad()
            loss = loss_fn(model(ids), labels)
            loss.backward()
            if flags["prefetch"] and step + 1 < total and i + 1 < len(order):
                # Each table pulls the next batch's rows as soon as it has pushed this step's.
                upcoming = log.impressions(ClickLog.TRAIN,
                                           int(order[i + 1]) * batch + rank * part, part)[:2]
                for f, table in enumerate(tables):
                    table.prefetch(upcoming[0][:, f])
            optimizer.step()  # The head by the job's mode, the touched rows to the shards.
            loss_sum, seen, step = loss_sum + loss.item() * part, seen + part, step + 1
            trained += part
            if step in evals:
                began = time.time()
                rate = trained * world / max(began - start - evaluating, 1e-9)  # Training only.
                test_auc, test_loss = evaluate()
                evaluating += time.time() - began
                train_loss = dpt.allreduce(torch.tensor([loss_sum / seen]),
                                           name="train_loss").item()
                if rank == 0:
                    print(f"epoch {step / steps_per_epoch:.2f} step {step}/{total}: train "
                          f"loss {train_loss:.4f}, test loss {test_loss:.4f} (best possible "
                          f"{best_loss:.4f}), test AUC {test_auc:.4f} (best possible "
                          f"{best_auc:.4f}), {rate:,.0f} impressions/s", flush=True)
                loss_sum, seen = 0.0, 0
    if rank == 0 and flags["prefetch"]:
        served = sum(t.stats["prefetched"] for t in tables)
        print(f"prefetch: {served} of the tables' {len(tables) * total} training forwards took "
              f"prefetched rows", flush=True)
    if rank == 0:
        print(f"test AUC {test_auc:.4f} (best possible {best_auc:.4f}), gap "
              f"{best_auc - test_auc:.4f}; test loss {test_loss:.4f} (best possible "
              f"{best_loss:.4f}); {total} steps in {time.time() - start:.0f} s", flush=True)
    dpt.shutdown()


if __name__ == "__main__":
    main()
