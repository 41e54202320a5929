"""bench/peers/peers.py: the peers' side of bench/peers (issue 8): one workload, one system, one
mode, one process; the protocol of bench/peers_ember.c.

    python peers.py --system torch|jax|tinygrad --workload W --mode M --dir DIR [--steps N]
                    [--seconds S] [--warmup K]

loads the parameters and inputs Ember wrote (peers_ember --init DIR), runs K warm-up calls (5:
the first compiles; torch.compile and Ember compile again at the second SGD step, whose momentum
buffers now exist; TinyJit captures at its second call; the first two losses check the math
against Ember's), then timed calls until there are N of them and they took S seconds, and prints
one JSON object: ms_per_step (median of the timed calls), first_call_ms, warmup_ms (time to
steady state: the K warm-up calls less K medians), steady_after (calls before the first within
twice the median), loss1, loss2, peak_rss_mb. Modes: eager; compiled (torch.compile default, jax.jit, tinygrad TinyJit);
max-autotune (torch.compile mode="max-autotune"). The math is Ember's (bench/models.h): the
same layers in the same order, PyTorch's SGD and AdamW formulas written out for JAX, f32.
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

import numpy as np

LR_SGD, MOMENTUM = 0.01, 0.9
LR_ADAMW, B1, B2, EPS, WD = 1e-3, 0.9, 0.999, 1e-8, 1e-2
B, T, D, H, L, V = 16, 128, 256, 4, 2, 256
ADDS = 100  # eager add: dependent adds per step, as Ember's


def load(dirname, workload):
    d = os.path.join(dirname, workload)
    with open(os.path.join(d, "params.txt")) as f:
        names = [line.strip() for line in f if line.strip()]
    params = {n: np.load(os.path.join(d, n + ".npy")) for n in names}
    inputs = []
    i = 0
    while os.path.exists(os.path.join(d, f"in{i}.npy")):
        inputs.append(np.load(os.path.join(d, f"in{i}.npy")))
        i += 1
    return names, params, inputs


def optimizer_of(workload):
    return {"mlp": "sgd", "lenet": "sgd", "transformer": "adamw"}.get(workload)


# ---- PyTorch ------------------------------------------------------------------------------

def torch_system(workload, mode, names, params, inputs, device):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(2)
    P = {n: torch.tensor(params[n], device=device, requires_grad=optimizer_of(workload) is not None) for n in names}
    X = [torch.tensor(a, device=device) for a in inputs]

    def mlp(x, y):
        h = F.relu(F.linear(x, P["fc0.w"], P["fc0.b"]))
        h = F.relu(F.linear(h, P["fc1.w"], P["fc1.b"]))
        return F.cross_entropy(F.linear(h, P["fc2.w"], P["fc2.b"]), y)

    def lenet(x, y):
        h = F.max_pool2d(F.relu(F.conv2d(x, P["conv0.w"], P["conv0.b"], padding=2)), 2, 2)
        h = F.max_pool2d(F.relu(F.conv2d(h, P["conv1.w"], P["conv1.b"])), 2, 2)
        h = h.reshape(-1, 400)
        h = F.relu(F.linear(h, P["fc0.w"], P["fc0.b"]))
        h = F.relu(F.linear(h, P["fc1.w"], P["fc1.b"]))
        return F.cross_entropy(F.linear(h, P["fc2.w"], P["fc2.b"]), y)

    def transformer(idx, y):
        x = P["tok"][idx] + P["pos"]
        for l in range(L):
            h = F.layer_norm(x, (D,), P[f"ln{2 * l}.w"], P[f"ln{2 * l}.b"], 1e-5)
            w = P["fc0.w"]
            q, k, v = (F.linear(h, w[l * 3 * D + j * D: l * 3 * D + (j + 1) * D]) for j in range(3))
            q, k, v = (t.reshape(B, T, H, D // H).transpose(1, 2) for t in (q, k, v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, D)
            x = x + F.linear(a, P["fc1.w"][l * D:(l + 1) * D])
            h = F.layer_norm(x, (D,), P[f"ln{2 * l + 1}.w"], P[f"ln{2 * l + 1}.b"], 1e-5)
            h = F.gelu(F.linear(h, P["fc2.w"][l * 4 * D:(l + 1) * 4 * D]), approximate="tanh")
            x = x + F.linear(h, P["fc3.w"][l * D:(l + 1) * D])
        x = F.layer_norm(x, (D,), P["ln4.w"], P["ln4.b"], 1e-5)
        return F.cross_entropy((x @ P["tok"].T).reshape(B * T, V), y.reshape(B * T))

    def softmax(x):
        return torch.softmax(x, 1).sum()

    def layer_norm(x):
        return F.layer_norm(x, (1024,), P["ln0.w"], P["ln0.b"], 1e-5).sum()

    def add_chain(a, b):
        for _ in range(ADDS):
            a = a + b
        return a.sum()

    def add_one(a, b):
        return (a + b).sum()

    fn = {"mlp": mlp, "lenet": lenet, "transformer": transformer, "softmax": softmax, "layer_norm": layer_norm,
          "add": add_chain if mode == "eager" else add_one}[workload]
    if mode == "compiled":
        fn = torch.compile(fn)
    elif mode == "max-autotune":
        fn = torch.compile(fn, mode="max-autotune")
    opt = None
    kind = optimizer_of(workload)
    if kind == "sgd":
        opt = torch.optim.SGD([P[n] for n in names], lr=LR_SGD, momentum=MOMENTUM)
    elif kind == "adamw":
        opt = torch.optim.AdamW([P[n] for n in names], lr=LR_ADAMW, betas=(B1, B2), eps=EPS, weight_decay=WD)
    opt_step = None if opt is None else opt.step if mode == "eager" else torch.compile(opt.step)

    def step():
        if opt is None:
            with torch.no_grad():
                return fn(*X).item()
        opt.zero_grad(set_to_none=True)
        loss = fn(*X)
        loss.backward()
        opt_step()
        return loss.item()

    versions = {"torch": torch.__version__}
    return step, versions


# ---- JAX ----------------------------------------------------------------------------------

def jax_system(workload, mode, names, params, inputs, device):  # JAX's default backend: CPU, or the GPU of jax[cuda]
    import jax
    import jax.numpy as jnp
    from jax import lax

    P = {n: jnp.asarray(params[n]) for n in names}
    X = [jnp.asarray(a) for a in inputs]

    def linear(x, w, b=None):
        y = x @ w.T
        return y if b is None else y + b

    def cross_entropy(logits, y):
        lse = jax.nn.logsumexp(logits, axis=1)
        return jnp.mean(lse - jnp.take_along_axis(logits, y[:, None].astype(jnp.int32), axis=1)[:, 0])

    def layer_norm(x, w, b, eps=1e-5):
        mu = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean((x - mu) ** 2, axis=-1, keepdims=True)
        return (x - mu) * lax.rsqrt(var + eps) * w + b

    def relu(x):
        return jnp.maximum(x, 0)

    def conv(x, w, b, pad):
        y = lax.conv_general_dilated(x, w, (1, 1), [(pad, pad), (pad, pad)], dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return y + b[None, :, None, None]

    def pool(x):
        return lax.reduce_window(x, -jnp.inf, lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")

    def mlp(p, x, y):
        h = relu(linear(x, p["fc0.w"], p["fc0.b"]))
        h = relu(linear(h, p["fc1.w"], p["fc1.b"]))
        return cross_entropy(linear(h, p["fc2.w"], p["fc2.b"]), y)

    def lenet(p, x, y):
        h = pool(relu(conv(x, p["conv0.w"], p["conv0.b"], 2)))
        h = pool(relu(conv(h, p["conv1.w"], p["conv1.b"], 0)))
        h = h.reshape(-1, 400)
        h = relu(linear(h, p["fc0.w"], p["fc0.b"]))
        h = relu(linear(h, p["fc1.w"], p["fc1.b"]))
        return cross_entropy(linear(h, p["fc2.w"], p["fc2.b"]), y)

    mask = jnp.tril(jnp.ones((T, T), dtype=bool))

    def transformer(p, idx, y):
        x = p["tok"][idx] + p["pos"]
        for l in range(L):
            h = layer_norm(x, p[f"ln{2 * l}.w"], p[f"ln{2 * l}.b"])
            w = p["fc0.w"]
            q, k, v = (linear(h, w[l * 3 * D + j * D: l * 3 * D + (j + 1) * D]) for j in range(3))
            q, k, v = (t.reshape(B, T, H, D // H).transpose(0, 2, 1, 3) for t in (q, k, v))
            s = (q @ k.transpose(0, 1, 3, 2)) / np.float32(np.sqrt(D // H))
            s = jnp.where(mask, s, -jnp.inf)
            a = (jax.nn.softmax(s, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(B, T, D)
            x = x + linear(a, p["fc1.w"][l * D:(l + 1) * D])
            h = layer_norm(x, p[f"ln{2 * l + 1}.w"], p[f"ln{2 * l + 1}.b"])
            h = jax.nn.gelu(linear(h, p["fc2.w"][l * 4 * D:(l + 1) * 4 * D]), approximate=True)
            x = x + linear(h, p["fc3.w"][l * D:(l + 1) * D])
        x = layer_norm(x, p["ln4.w"], p["ln4.b"])
        return cross_entropy((x @ p["tok"].T).reshape(B * T, V), y.reshape(B * T))

    kind = optimizer_of(workload)
    if kind:
        loss_fn = {"mlp": mlp, "lenet": lenet, "transformer": transformer}[workload]

        def train(p, state, x, y):
            loss, g = jax.value_and_grad(loss_fn)(p, x, y)
            if kind == "sgd":  # torch.optim.SGD: buf = momentum * buf + g (buf = g at first); p -= lr * buf
                buf = {n: MOMENTUM * state["buf"][n] + g[n] for n in p}
                return {n: p[n] - LR_SGD * buf[n] for n in p}, {"buf": buf}, loss
            t = state["t"] + 1  # torch.optim.AdamW
            m = {n: B1 * state["m"][n] + (1 - B1) * g[n] for n in p}
            v = {n: B2 * state["v"][n] + (1 - B2) * g[n] * g[n] for n in p}
            bc1, bc2 = 1 - B1 ** t, 1 - B2 ** t
            new = {n: p[n] * (1 - LR_ADAMW * WD) - (LR_ADAMW / bc1) * m[n] / (jnp.sqrt(v[n]) / jnp.sqrt(bc2) + EPS) for n in p}
            return new, {"t": t, "m": m, "v": v}, loss

        def zeros():  # distinct buffers: jit donates the state
            return {n: jnp.zeros_like(P[n]) for n in names}
        state = {"buf": zeros()} if kind == "sgd" else {"t": jnp.float32(0), "m": zeros(), "v": zeros()}
        fn = jax.jit(train, donate_argnums=(0, 1)) if mode == "compiled" else train
        box = {"p": P, "s": state}

        def step():
            box["p"], box["s"], loss = fn(box["p"], box["s"], *X)
            return float(loss)
    else:
        def softmax(x):
            return jnp.sum(jax.nn.softmax(x, axis=1))

        def ln(x):
            return jnp.sum(layer_norm(x, P["ln0.w"], P["ln0.b"]))

        def add_chain(a, b):
            for _ in range(ADDS):
                a = a + b
            return jnp.sum(a)

        def add_one(a, b):
            return jnp.sum(a + b)

        f = {"softmax": softmax, "layer_norm": ln, "add": add_chain if mode == "eager" else add_one}[workload]
        if mode == "compiled":
            f = jax.jit(f)

        def step():
            return float(f(*X))

    return step, {"jax": jax.__version__}


# ---- tinygrad -----------------------------------------------------------------------------

def tinygrad_system(workload, mode, names, params, inputs, device):
    import importlib.metadata
    from tinygrad import Context, Device, Tensor, TinyJit
    from tinygrad.nn.optim import SGD, AdamW

    if device == "cuda":
        Device.DEFAULT = "CUDA"

    kind = optimizer_of(workload)
    P = {n: Tensor(params[n]).realize() for n in names}
    X = [Tensor(a.astype(np.int32) if a.dtype == np.int64 else a).realize() for a in inputs]

    def linear(x, w, b=None):
        y = x @ w.T
        return y if b is None else y + b

    def layer_norm(x, w, b):
        return x.layernorm(eps=1e-5) * w + b

    def mlp(x, y):
        h = linear(x, P["fc0.w"], P["fc0.b"]).relu()
        h = linear(h, P["fc1.w"], P["fc1.b"]).relu()
        return linear(h, P["fc2.w"], P["fc2.b"]).sparse_categorical_crossentropy(y)

    def lenet(x, y):
        h = x.conv2d(P["conv0.w"], P["conv0.b"], padding=2).relu().max_pool2d((2, 2))
        h = h.conv2d(P["conv1.w"], P["conv1.b"]).relu().max_pool2d((2, 2))
        h = h.reshape(-1, 400)
        h = linear(h, P["fc0.w"], P["fc0.b"]).relu()
        h = linear(h, P["fc1.w"], P["fc1.b"]).relu()
        return linear(h, P["fc2.w"], P["fc2.b"]).sparse_categorical_crossentropy(y)

    def transformer(idx, y):
        x = P["tok"][idx] + P["pos"]
        for l in range(L):
            h = layer_norm(x, P[f"ln{2 * l}.w"], P[f"ln{2 * l}.b"])
            w = P["fc0.w"]
            q, k, v = (linear(h, w[l * 3 * D + j * D: l * 3 * D + (j + 1) * D]) for j in range(3))
            q, k, v = (t.reshape(B, T, H, D // H).transpose(1, 2) for t in (q, k, v))
            a = q.scaled_dot_product_attention(k, v, is_causal=True).transpose(1, 2).reshape(B, T, D)
            x = x + linear(a, P["fc1.w"][l * D:(l + 1) * D])
            h = layer_norm(x, P[f"ln{2 * l + 1}.w"], P[f"ln{2 * l + 1}.b"])
            h = linear(h, P["fc2.w"][l * 4 * D:(l + 1) * 4 * D]).gelu()
            x = x + linear(h, P["fc3.w"][l * D:(l + 1) * D])
        x = layer_norm(x, P["ln4.w"], P["ln4.b"])
        return (x @ P["tok"].T).reshape(B * T, V).sparse_categorical_crossentropy(y.reshape(B * T))

    if kind:
        loss_fn = {"mlp": mlp, "lenet": lenet, "transformer": transformer}[workload]
        # the transformer's linear layers have no bias term (Ember makes the parameters, unused)
        params_list = [P[n] for n in names if not (workload == "transformer" and n.startswith("fc") and n.endswith(".b"))]
        opt = SGD(params_list, lr=LR_SGD, momentum=MOMENTUM) if kind == "sgd" else \
            AdamW(params_list, lr=LR_ADAMW, b1=B1, b2=B2, eps=EPS, weight_decay=WD)

        def train(*xs):
            with Context(TRAINING=1):
                opt.zero_grad()
                loss = loss_fn(*xs)
                loss.backward()
                Tensor.realize(loss, *opt.schedule_step())  # as Optimizer.step, with the loss
                return loss
    else:
        def train(*xs):
            if workload == "softmax":
                return xs[0].softmax(1).sum().realize()
            if workload == "layer_norm":
                return layer_norm(xs[0], P["ln0.w"], P["ln0.b"]).sum().realize()
            a = xs[0]
            for _ in range(ADDS if mode == "eager" else 1):
                a = a + xs[1]
            return a.sum().realize()

    fn = TinyJit(train) if mode == "compiled" else train

    def step():
        return float(fn(*X).item())

    return step, {"tinygrad": importlib.metadata.version("tinygrad")}


SYSTEMS = {"torch": torch_system, "jax": jax_system, "tinygrad": tinygrad_system}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--system", required=True, choices=sorted(SYSTEMS))
    ap.add_argument("--workload", required=True)
    ap.add_argument("--mode", default="eager", choices=["eager", "compiled", "max-autotune"])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--steps", type=int, default=5, help="timed calls, at least")
    ap.add_argument("--seconds", type=float, default=0, help="timed seconds, at least (more calls then)")
    ap.add_argument("--warmup", type=int, default=5, help="calls before the timed ones (compiles, recompiles)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    a = ap.parse_args()
    names, params, inputs = load(a.dir, a.workload)
    step, versions = SYSTEMS[a.system](a.workload, a.mode, names, params, inputs, a.device)
    a.warmup, a.steps = max(2, a.warmup), max(1, a.steps)  # two losses; a median
    times, losses = [], []
    # the first --warmup calls compile (and recompile: the second SGD step's momentum buffers,
    # TinyJit's capture on its second call); then at least --steps timed calls and --seconds
    while len(times) < a.warmup + a.steps or sum(times[a.warmup:]) < 1e3 * a.seconds:
        t0 = time.perf_counter()
        loss = step()
        times.append((time.perf_counter() - t0) * 1e3)
        if len(losses) < 2:
            losses.append(loss)
    loss1, loss2 = losses
    first = times[0]
    ms = statistics.median(times[a.warmup:])
    warmup = sum(times[:a.warmup]) - a.warmup * ms  # time to steady state, less the steps it ran
    steady_after = next(i for i, t in enumerate(times) if t <= 2 * ms)
    per = None
    if a.workload == "add":
        per = "op" if a.mode == "eager" else "call"
        if a.mode == "eager":
            ms, first, warmup = ms / ADDS, first / ADDS, warmup / ADDS
    out = {"system": a.system, "workload": a.workload, "mode": a.mode, "ms_per_step": ms, "first_call_ms": first,
           "warmup_ms": warmup, "steady_after": steady_after, "loss1": loss1, "loss2": loss2,
           "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
           "steps": len(times) - a.warmup, "versions": versions}
    if per:
        out["per"] = per
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
