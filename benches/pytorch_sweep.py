#!/usr/bin/env python3
"""PyTorch (float32, CPU) implementation of the approx-bench workload, for a speed comparison.

It does what ``approx-bench --model initialized`` does for one sequence length, end to end, with
the definitions of ``../shared/METHODS.md``:

* model: bert-base-cased config and tokenizer from ``../shared/data/bert-base-cased``; an
  initialized ``transformers.BertModel(config)`` (Hugging Face ``_init_weights``: Linear and
  Embedding N(0, 0.02²), biases 0, LayerNorm 1/0) under ``torch.manual_seed(--model-seed)``.
  (Same recipe as the Rust tool, different RNG, so the weights and numbers are not identical.)
* data (§1.4): Wikitext-2 raw test split, rows = lines with CRLF→LF, whitespace-only lines dropped,
  tokenized without special tokens and concatenated; windows = consecutive non-overlapping runs of
  n tokens. X = LayerNorm(word + position[i mod 512]) (no token-type embedding), layer 0,
  Q/K/V = X·Wᵀ + b split into 12 heads of p = 64.
* per (window, head): the exact O = softmax(QKᵀ/√p)V once (max-shifted, float32);
* methods (§2), every d of ``--features``, all 12 heads of a window batched in one call:
  ``skyformer`` (pseudo-inverse, §2.3), ``nystromformer`` (§2.4), ``performer`` (the double-scaled
  estimator of Fig. 1, §2.5), ``informer`` (§2.6), ``skeinformer`` (§2.8), ``vmean`` (§2.1),
  ``linformer`` (§2.7). Each method computes only from Q, K, V (it does not reuse the exact P).
  Precision mirrors the Rust tool's ``--dtype f32``: the methods run in float32, except Skyformer's
  kernel blocks and its d×d pseudo-inverse core, which run in float64 (exp(‖z‖²) on M's diagonal
  and the exp-kernel's conditioning need it).
* error: ``torch.linalg.matrix_norm(O − Ô, ord=2)`` (SVD; E is cast to float64 first, as the Rust
  metric is f64), batched over heads.

Randomness: one ``torch.Generator`` per (window, method, d), seeded from (``--seed``, window,
method, d); heads draw independently from it.

Output: a timing report on stdout (whole process, per stage, per method summed over windows and
d, and per (method, d)), a table of mean errors over trials, and a CSV with columns
``window,head,method,d,error``.

How to run (from the repository root, with a Python that has torch, transformers, numpy)::

    /work/venv-ref/bin/python benches/pytorch_sweep.py                      # n = 1024, 2 windows
    /work/venv-ref/bin/python benches/pytorch_sweep.py --n 4096 --windows 1 \
        --out /tmp/pt.csv --features 16,64,256 --methods skyformer,vmean

Flags: ``--n`` (1024), ``--windows`` (2), ``--out`` (``results/pytorch_sweep.csv``),
``--features`` (8,16,32,64,128,256), ``--methods`` (all seven), ``--threads`` (2), ``--device``
(cpu; ``cuda`` runs everything on the GPU in float32 without TF32),
``--seed`` (0), ``--model-seed`` (12345), ``--model-dir``, ``--corpus``, ``--embedding``
(``word-pos``, i.e. positions mod 512 as in METHODS.md §1.4; ``word-pos-first`` = positions for the
first 512 tokens only, approx-bench's default since its calibration), and ``--qkv FILE`` to score
the Q/K/V of an ``approx-bench dump-qkv`` file (one window) instead of the model's (cross-checks).

Checked against the float64 reference ``tests/reference/score_dump.py`` on a ``dump-qkv`` window
(``--qkv``, four ``--seed`` values): vmean and nystromformer agree row by row within 7e-8 relative
(float32 here), and the mean errors of the five randomized methods lie within 1.7 SE.

Measured on the idle 2-core build machine (torch 2.15 CPU, 2 threads, n = 1024, 2 windows × 12
heads, 7 methods × 6 d = 1008 trials): see BENCHMARKS.md for the side-by-side with approx-bench.

Shared machines: torch's OpenMP pool busy-waits, and when other processes compete for the cores it
degrades badly (sweeps of 28-98 s instead of 2.5 s were seen). ``OMP_WAIT_POLICY=PASSIVE`` kept it at
~12 s under the same contention, but costs 20-40 % on an idle machine, so it is not set here.
"""

import time

T_PROCESS0 = time.perf_counter()  # before the heavy imports: "whole process" includes them

import argparse  # noqa: E402
import csv  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import zlib  # noqa: E402
from collections import defaultdict  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import BertConfig, BertModel, BertTokenizerFast  # noqa: E402

T_IMPORTS = time.perf_counter() - T_PROCESS0

REPO = Path(__file__).resolve().parents[1]
ALL_METHODS = ["skyformer", "nystromformer", "performer", "informer", "skeinformer", "vmean", "linformer"]

# ------------------------------------------------------------------------------------------
# shared numerics


def softmax_rows(S: torch.Tensor) -> torch.Tensor:
    return torch.softmax(S, dim=-1)  # max-shifted internally


def iter_inv(N: torch.Tensor, T: int = 6) -> torch.Tensor:
    """Razavi iteration (§2.3/§2.4), batched: Z₀ = Nᵀ/max column sum, Z ← ¼Z(13I − Y(15I − Y(7I − Y)))."""
    I = torch.eye(N.shape[-1], dtype=N.dtype)
    Z = N.transpose(-1, -2) / N.abs().sum(dim=-2).amax(dim=-1)[..., None, None]
    for _ in range(T):
        Y = N @ Z
        Z = 0.25 * Z @ (13 * I - Y @ (15 * I - Y @ (7 * I - Y)))
    return Z


# ------------------------------------------------------------------------------------------
# methods: (Q, K, V: [H, n, p] float32, d, generator) -> Ô [H, n, p]


def m_vmean(Q, K, V, d, g):
    return V.mean(dim=-2, keepdim=True).expand_as(V)


def m_skyformer(Q, K, V, d, g):
    """§2.3 Fig-1 variant with the pseudo-inverse core (Eq. 5): d/2 landmarks from Q̃, d/2 from K̃,
    uniform with replacement; kernel blocks and core in float64; D̂ = Ã1 unguarded."""
    H, n, p = Q.shape
    c = p ** -0.25
    Qt, Kt, V64 = (Q * c).double(), (K * c).double(), V.double()
    half = d // 2
    IQ = torch.randint(0, n, (H, half), generator=g)
    IK = torch.randint(0, n, (H, d - half), generator=g)
    Z = torch.cat([torch.gather(Qt, 1, IQ[..., None].expand(H, half, p)),
                   torch.gather(Kt, 1, IK[..., None].expand(H, d - half, p))], dim=1)  # [H, d, p]
    F = torch.exp(Qt @ Z.transpose(1, 2))  # [H, n, d]
    G = torch.exp(Kt @ Z.transpose(1, 2))  # [H, n, d]
    M = torch.exp(Z @ Z.transpose(1, 2))  # [H, d, d]
    w, U = torch.linalg.eigh(M)
    keep = w > 1e-10 * w.amax(dim=-1, keepdim=True)
    winv = torch.where(keep, 1.0 / w, torch.zeros_like(w))
    W = (U * winv[:, None, :]) @ U.transpose(1, 2)  # M^†
    num = F @ (W @ (G.transpose(1, 2) @ V64))
    den = F @ (W @ G.sum(dim=1)[..., None])
    return (num / den).float()


def m_nystromformer(Q, K, V, d, g):
    """§2.4: segment-means landmarks (near-equal contiguous segments if d ∤ n), 6-step iterative
    inverse of the d×d core (float32, like every other Nyströmformer product here)."""
    H, n, p = Q.shape
    if d >= n:
        return softmax_rows(Q @ K.transpose(1, 2) / math.sqrt(p)) @ V
    c = p ** -0.25
    Qt, Kt = Q * c, K * c
    if n % d == 0:
        Qb = Qt.reshape(H, d, n // d, p).mean(dim=2)
        Kb = Kt.reshape(H, d, n // d, p).mean(dim=2)
    else:
        bounds = torch.div(torch.arange(d + 1) * n, d, rounding_mode="floor")  # segment s = [⌊sn/d⌋, ⌊(s+1)n/d⌋)
        seg = torch.searchsorted(bounds, torch.arange(n), right=True) - 1
        cnt = torch.bincount(seg, minlength=d).to(Q.dtype)[:, None]
        Qb = torch.zeros(H, d, p).index_add_(1, seg, Qt) / cnt
        Kb = torch.zeros(H, d, p).index_add_(1, seg, Kt) / cnt
    F = softmax_rows(Qt @ Kb.transpose(1, 2))  # [H, n, d]
    As = softmax_rows(Qb @ Kb.transpose(1, 2))  # [H, d, d]
    B = softmax_rows(Qb @ Kt.transpose(1, 2))  # [H, d, n]
    Zinv = iter_inv(As, 6)  # float32, as approx-bench runs it (METHODS.md §1.4 item 7 allows it)
    return F @ (Zinv @ (B @ V))


def orf(H: int, m: int, p: int, g) -> torch.Tensor:
    """§2.5: ⌈m/p⌉ stacked p×p orthogonal blocks (rows of Qᵀ from QR, no sign fix), first m rows,
    each scaled by the norm of an independent N(0, I_p) vector. [H, m, p]."""
    nb = math.ceil(m / p)
    Qm, _ = torch.linalg.qr(torch.randn(H * nb, p, p, generator=g))
    Om = Qm.transpose(1, 2).reshape(H, nb * p, p)[:, :m]
    return torch.randn(H, m, p, generator=g).norm(dim=-1, keepdim=True) * Om


def m_performer(Q, K, V, d, g):
    """§2.5 FAVOR+ as the authors ran it for Fig. 1: inputs scaled by p^{-1/2} (double scaling),
    ε = 1e-4, per-row query stabiliser, one global key stabiliser."""
    H, n, p = Q.shape
    Om = orf(H, d, p, g)
    c = p ** -0.5
    eps = 1e-4

    def feat(X, is_query):
        Xt = X * c
        proj = Xt @ Om.transpose(1, 2)  # [H, n, m]
        diag = 0.5 * (Xt * Xt).sum(dim=-1, keepdim=True)
        stab = proj.amax(dim=-1, keepdim=True) if is_query else proj.amax(dim=(-1, -2), keepdim=True)
        return d ** -0.5 * (torch.exp(proj - diag - stab) + eps)

    phq, phk = feat(Q, True), feat(K, False)
    den = phq @ phk.sum(dim=1)[..., None]  # [H, n, 1]
    return (phq @ (phk.transpose(1, 2) @ V)) / den


def m_informer(Q, K, V, d, g):
    """§2.6: c = ⌈d/ln n⌉, u = U = c⌈ln n⌉; U iid keys per query, M = max − sum/n on raw logits,
    exact rows for the top u queries, mean(V) elsewhere."""
    H, n, p = Q.shape
    ln = math.log(n)
    u = min(math.ceil(d / ln) * math.ceil(ln), n)
    out = V.mean(dim=-2, keepdim=True).expand_as(V).clone()
    T = torch.randint(0, n, (H, n, u), generator=g)
    qk = torch.empty(n, u)
    for h in range(H):
        # sampled logits q_i·k_j, j ∈ T_i (nUp MACs), gathered in blocks of 32 queries so the
        # [32, U, p] block of keys stays in cache (3-4× faster than one [n, U, p] gather)
        for i in range(0, n, 32):
            Ks = K[h][T[h, i:i + 32]]  # [32, U, p]
            qk[i:i + 32] = torch.bmm(Ks, Q[h, i:i + 32, :, None]).squeeze(-1)
        msr = qk.amax(dim=1) - qk.sum(dim=1) / n
        top = torch.topk(msr, u, sorted=False).indices
        out[h, top] = softmax_rows(Q[h, top] @ K[h].T / math.sqrt(p)) @ V[h]
    return out


def m_linformer(Q, K, V, d, g):
    """§2.7: E ~ N(0, 0.02²) [d×n], shared by keys and values, per head."""
    H, n, p = Q.shape
    E = torch.randn(H, d, n, generator=g) * 0.02
    EK, EV = E @ K, E @ V
    return softmax_rows(Q @ EK.transpose(1, 2) / math.sqrt(p)) @ EV


def m_skeinformer(Q, K, V, d, g):
    """§2.8 Algorithm 1: uniform pilot rows (with replacement), importance-sampled columns without
    replacement, geometric-mean fill, adaptive row normalisation, exact pilot rows."""
    H, n, p = Q.shape
    d = min(d, n - 1)
    s = 1.0 / math.sqrt(p)
    J = torch.randint(0, n, (H, d), generator=g)
    QJ = torch.gather(Q, 1, J[..., None].expand(H, d, p))
    BJ = softmax_rows(QJ @ K.transpose(1, 2) * s)  # [H, d, n]
    w = BJ.norm(dim=1) * V.norm(dim=-1)  # [H, n]
    w = torch.where(w > 0, w, torch.full_like(w, 1e-30))  # zero weights: drawn only after all positive ones
    Jp = torch.multinomial(w, d, replacement=False, generator=g)  # successive draws ∝ w
    idx = Jp[..., None].expand(H, d, p)
    Kp, Vp = torch.gather(K, 1, idx), torch.gather(V, 1, idx)
    L = Q @ Kp.transpose(1, 2) * s  # [H, n, d]
    cmax = L.amax(dim=-1, keepdim=True)
    Ap = torch.exp(L - cmax)
    gm = torch.exp(L.mean(dim=-1, keepdim=True) - cmax)
    delta = Ap.sum(dim=-1, keepdim=True) + (n - d) * gm
    u = V.sum(dim=1) - Vp.sum(dim=1)  # [H, p]
    R = (Ap @ Vp + gm * u[:, None, :]) / delta
    R.scatter_(1, J[..., None].expand(H, d, p), BJ @ V)  # pilot rows exact
    return R


METHODS = {
    "skyformer": m_skyformer,
    "nystromformer": m_nystromformer,
    "performer": m_performer,
    "informer": m_informer,
    "skeinformer": m_skeinformer,
    "vmean": m_vmean,
    "linformer": m_linformer,
}

# ------------------------------------------------------------------------------------------
# inputs


def load_tokens(corpus: Path, tok) -> torch.Tensor:
    text = corpus.read_text(encoding="utf-8").replace("\r\n", "\n")
    rows = [line for line in text.split("\n") if line.strip()]
    enc = tok(rows, add_special_tokens=False, return_attention_mask=False, return_token_type_ids=False)
    return torch.tensor([i for ids in enc["input_ids"] for i in ids], dtype=torch.long)


def main() -> int:
    ap = argparse.ArgumentParser(description="PyTorch float32 CPU implementation of the approx-bench sweep")
    ap.add_argument("--n", type=int, default=1024, help="sequence length")
    ap.add_argument("--windows", type=int, default=2, help="consecutive windows of n tokens")
    ap.add_argument("--out", default=str(REPO / "results" / "pytorch_sweep.csv"), help="output CSV")
    ap.add_argument("--features", default="8,16,32,64,128,256")
    ap.add_argument("--methods", default=",".join(ALL_METHODS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu",
                    help="torch device (cpu, cuda, cuda:N): the model, Q/K/V, the methods and the metric run "
                         "there (torch.set_default_device; each generator on it), clocks read after a "
                         "synchronisation; TF32 stays off")
    ap.add_argument("--seed", type=int, default=0, help="base seed of the methods' randomness")
    ap.add_argument("--model-seed", type=int, default=12345)
    ap.add_argument("--model-dir", default=str(REPO.parent / "shared" / "data" / "bert-base-cased"))
    ap.add_argument("--corpus", default=str(REPO.parent / "shared" / "data" / "wikitext-2" / "wiki.test.raw"))
    ap.add_argument("--embedding", choices=["word-pos", "word-pos-first"], default="word-pos",
                    help="X = LN(word + position[i mod 512]) (METHODS.md §1.4), or positions only for the first "
                         "512 tokens (approx-bench's calibrated default since 3527673)")
    ap.add_argument("--qkv", default=None,
                    help="score the Q/K/V of an `approx-bench dump-qkv` file (one window) instead of building "
                         "the model and reading the corpus (for cross-checks against the Rust tool)")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.set_default_device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 products stay float32 on a GPU
    torch.backends.cudnn.allow_tf32 = False
    on_gpu = torch.device(args.device).type == "cuda"

    def clock() -> float:
        """perf_counter after the device's queued work has finished."""
        if on_gpu:
            torch.cuda.synchronize()
        return time.perf_counter()

    transformers.logging.set_verbosity_error()  # silence "sequence length > 512" from the tokenizer
    torch.set_grad_enabled(False)
    feats = [int(x) for x in args.features.split(",")]
    methods = args.methods.split(",")
    for m in methods:
        if m not in METHODS:
            ap.error(f"unknown method {m!r}; known: {', '.join(METHODS)}")
    stage = {"imports": T_IMPORTS}

    dumped = None
    if args.qkv:
        from safetensors.torch import load_file

        dumped = load_file(args.qkv)
        args.windows, args.n = 1, dumped["q"].shape[1]

    # model (HF init) ----------------------------------------------------------------------
    t = time.perf_counter()
    config = BertConfig.from_pretrained(args.model_dir)
    torch.manual_seed(args.model_seed)
    model = BertModel(config, add_pooling_layer=False).eval()
    emb = model.embeddings
    sa = model.encoder.layer[0].attention.self
    heads = config.num_attention_heads
    p = config.hidden_size // heads
    stage["model init"] = time.perf_counter() - t

    # corpus -------------------------------------------------------------------------------
    t = time.perf_counter()
    tok = BertTokenizerFast.from_pretrained(args.model_dir)
    ids = load_tokens(Path(args.corpus), tok)
    stage["tokenize"] = time.perf_counter() - t
    n = args.n
    if (args.windows * n) > len(ids):
        ap.error(f"corpus has {len(ids)} tokens, fewer than {args.windows} windows of {n}")

    times = defaultdict(float)  # method -> seconds (approximation only)
    times_md = defaultdict(float)
    errs = defaultdict(list)
    rows = []
    stage["embed + Q/K/V"] = stage["exact attention"] = stage["metric"] = 0.0
    t_sweep = clock()
    for w in range(args.windows):
        t = clock()
        wid = ids[w * n:(w + 1) * n]
        P = config.max_position_embeddings
        if args.embedding == "word-pos":  # METHODS.md §1.4: position ids mod 512
            X = emb.LayerNorm(emb.word_embeddings(wid) + emb.position_embeddings(torch.arange(n) % P))
        else:  # word-pos-first: positions for the first 512 tokens only
            E = emb.word_embeddings(wid)
            E[:P] += emb.position_embeddings(torch.arange(min(n, P)))
            X = emb.LayerNorm(E)  # [n, 768]

        def split(lin):
            return lin(X).reshape(n, heads, p).transpose(0, 1).contiguous()  # [H, n, p]

        Q, K, V = split(sa.query), split(sa.key), split(sa.value)
        if dumped is not None:
            Q, K, V = (dumped[k].float().contiguous().to(args.device) for k in ("q", "k", "v"))
        stage["embed + Q/K/V"] += clock() - t

        t = clock()
        O = torch.softmax(Q @ K.transpose(1, 2) / math.sqrt(p), dim=-1) @ V  # [H, n, p]
        stage["exact attention"] += clock() - t

        for m in methods:
            for d in feats:
                g = torch.Generator(device=args.device).manual_seed(
                    (args.seed * 1_000_003 + w * 7919 + zlib.crc32(m.encode()) * 131 + d) % (2**63))
                t = clock()
                Oh = METHODS[m](Q, K, V, d, g)
                dt = clock() - t
                times[m] += dt
                times_md[(m, d)] += dt
                t = clock()
                e = torch.linalg.matrix_norm((O - Oh).double(), ord=2)  # [H]
                stage["metric"] += clock() - t
                for h in range(heads):
                    ev = float(e[h])
                    rows.append((w, h, m, d, ev))
                    if math.isfinite(ev):
                        errs[(m, d)].append(ev)
    t_sweep = clock() - t_sweep
    stage["methods (sum)"] = sum(times.values())

    t = time.perf_counter()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["window", "head", "method", "d", "error"])
        wr.writerows((w, h, m, d, repr(e)) for (w, h, m, d, e) in rows)
    stage["write csv"] = time.perf_counter() - t
    total = time.perf_counter() - T_PROCESS0

    # report -------------------------------------------------------------------------------
    cpu = os.times()
    print(f"pytorch_sweep: torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{torch.get_num_threads()} threads, float32 (Skyformer kernel and core float64)")
    src = (f"Q/K/V from {args.qkv}" if args.qkv
           else f"corpus {len(ids)} tokens, model seed {args.model_seed}, embedding {args.embedding}")
    print(f"n = {n}, windows = {args.windows}, heads = {heads}, d = {feats}, {len(rows)} trials -> {out} ({src})")
    print(f"\nwhole process   {total:8.3f} s   (CPU user+sys {cpu.user + cpu.system:.2f} s)")
    print(f"sweep           {t_sweep:8.3f} s   (windows: embed, exact, methods, metric)")
    print("\nstage                     seconds")
    for k in ["imports", "model init", "tokenize", "embed + Q/K/V", "exact attention", "methods (sum)", "metric", "write csv"]:
        print(f"  {k:<22} {stage[k]:8.3f}")
    print("\nmethod          seconds (all windows and d)")
    for m in methods:
        print(f"  {m:<14} {times[m]:8.3f}")
    print("\nmean error over trials")
    print(f"  {'method':<14}" + "".join(f"{'d=' + str(d):>10}" for d in feats))
    for m in methods:
        cells = []
        for d in feats:
            v = errs[(m, d)]
            cells.append(f"{sum(v) / len(v):.4f}" if v else "nan")
        print(f"  {m:<14}" + "".join(f"{c:>10}" for c in cells))
    print("\nms per head (one call does all heads of a window; its time / heads, averaged over windows)")
    print(f"  {'method':<14}" + "".join(f"{'d=' + str(d):>10}" for d in feats))
    for m in methods:
        print(f"  {m:<14}" + "".join(f"{times_md[(m, d)] / args.windows / heads * 1e3:>10.3f}" for d in feats))
    ex = stage["exact attention"] / args.windows / heads
    print(f"  exact attention {ex * 1e3:.3f} ms/head = {(4 * n * n * p) / ex / 1e9:.1f} GFLOP/s (4n²p flops); "
          f"metric (matrix_norm ord=2) {stage['metric'] / (args.windows * len(methods) * len(feats) * heads) * 1e3:.3f} ms/head")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
