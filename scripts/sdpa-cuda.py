"""PyTorch's scaled_dot_product_attention in f32 (TF32 off) on the GPU, 12 heads of p = 64, at the
lengths scripts/gpu-check.sh benches: the peer of `bench`'s batched exact attention on the same card.
Prints one line per (n, mask): ms for all heads, per head, and TFLOP/s (4n²p flops per head, half
under the causal mask)."""
import time

import torch

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
dev = "cuda"
print(f"sdpa: torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
a = torch.randn(2048, 2048, device=dev)
for _ in range(3):
    a @ a
torch.cuda.synchronize()
t = time.perf_counter()
for _ in range(10):
    a @ a
torch.cuda.synchronize()
print(f"sdpa: f32 matmul 2048^3 {2 * 2048**3 * 10 / (time.perf_counter() - t) / 1e12:.1f} TFLOP/s")
for n in (4096, 16384, 65536):
    q, k, v = (torch.randn(1, 12, n, 64, device=dev) for _ in range(3))
    for causal in (False, True):
        f = lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        f()
        torch.cuda.synchronize()
        reps = 3 if n == 65536 else 10
        t = time.perf_counter()
        for _ in range(reps):
            f()
        torch.cuda.synchronize()
        s = (time.perf_counter() - t) / reps
        flops = 12 * 4 * n * n * 64 * (0.5 if causal else 1.0)
        print(f"sdpa: n = {n} causal={causal}: {s * 1e3:.2f} ms for 12 heads, {s * 1e3 / 12:.3f} ms per head, {flops / s / 1e12:.1f} TFLOP/s")
