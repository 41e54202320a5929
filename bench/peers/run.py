#!/usr/bin/env python3
"""bench/peers/run.py: Ember against PyTorch 2, JAX and tinygrad on the same workloads, in one
run, on one machine (issues 8 and 23). Standard library only; see bench/README.md.

    python3 bench/peers/run.py [--build build] [--rounds 3] [--only mlp,transformer]
                               [--isa native|avx2|avx512] [--contention N] [--seconds 2]
                               [--device cpu|cuda --python /path/to/python3]

1. Builds Ember (ninja -C BUILD) and makes a virtual environment BUILD/peers-venv with the pinned
   numpy, torch, tinygrad and jax[cpu] (PINS) from PyPI when they are missing or other versions
   (a failed pip install is reported; with --python, that interpreter is used as it is and
   nothing is installed: a GPU machine's python with PyTorch 2 and Triton).
2. Writes the workloads' weights and inputs once (peers_ember --init: Ember's init, seed 0), so
   every system starts from the same numbers.
3. For each round, for each workload, runs every (system, mode) in its own process, in an order
   that rotates from round to round (Ember and the peers alternate), with 2 threads, held to
   --isa, beside --contention busy processes; each times at least 5 steps and --seconds seconds
   after 5 warm-up calls (compiles and recompiles: the second SGD step's momentum buffers).
4. Prints one table (medians over rounds) and writes it to BUILD/peers/results.json and
   results.md: eager and compiled ms per step, first-call ms, time to steady state, peak resident
   memory, ratios to Ember compiled, and whether each system's first two losses match Ember's
   (the first checks the forward, the second the optimizer's formulas).
A system that cannot be installed or fails on a workload gets its reason in the table.
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKLOADS = ["mlp", "lenet", "transformer", "softmax", "layer_norm", "add"]
# (system, mode, column label)
CONFIGS = [("ember", "eager", "Ember eager"), ("ember", "compiled", "Ember em_compile"),
           ("torch", "eager", "PyTorch eager"), ("torch", "compiled", "torch.compile"),
           ("torch", "max-autotune", "torch.compile max-autotune"),
           ("jax", "eager", "JAX eager"), ("jax", "compiled", "jax.jit"),
           ("tinygrad", "eager", "tinygrad"), ("tinygrad", "compiled", "tinygrad TinyJit")]
MIN_STEPS = 5  # timed steps, at least; and --seconds of them
SLOW = {("transformer", "tinygrad", "eager"): 3, ("transformer", "tinygrad", "compiled"): 3,
        ("transformer", "jax", "eager"): 3}  # seconds-long steps: fewer of them
# The versions the published figures were measured with; the venv gets exactly these.
PINS = {"numpy": "2.4.6", "torch": "2.15.0", "jax": "0.10.2", "tinygrad": "0.14.0"}
PACKAGES = {"torch": [f"torch=={PINS['torch']}"], "jax": [f"jax[cpu]=={PINS['jax']}"],
            "tinygrad": [f"tinygrad=={PINS['tinygrad']}"]}
VERSION_OF = {"torch": "import torch; print(torch.__version__)",
              "jax": "import jax, jaxlib; print(jax.__version__)",
              "tinygrad": "import importlib.metadata as m, tinygrad; print(m.version('tinygrad'))"}
# How each system is held to AVX2 under --isa avx2 (an AVX-512 machine measuring an AVX2 one).
HELD_AVX2 = {
    "ember": "EMBER_CPU_ISA=avx2: generated code (no AVX-512 features, znver3, 8 lanes) and oneDNN",
    "torch": "ATEN_CPU_CAPABILITY=avx2 (eager kernels, torch.compile's vector ISA), ONEDNN/DNNL_MAX_CPU_ISA=AVX2, "
             "MKL_ENABLE_INSTRUCTIONS=AVX2, TORCHINDUCTOR_CPP_MARCH=znver3 (torch.compile's C++)",
    "jax": "XLA_FLAGS=--xla_cpu_max_isa=AVX2, which holds only the code XLA generates with LLVM: NOT HELD on an "
           "AVX-512 machine, because jax.jit hands its dots and its reduction and elementwise fusions (the softmax) "
           "to YNNPACK, which picks its kernels from CPUID at run time and has no switch (jax.jit's MLP step took "
           "1.30 ms at --xla_cpu_max_isa=SSE4_2 as natively, where 4 SSE lanes without FMA cannot do its 0.51 "
           "GFLOP in under 3 ms; without YNNPACK, --xla_cpu_experimental_ynn_fusion_type=, its softmax took "
           "3-5 ms): its rows are AVX-512 figures and are left out of the best held peer",
    "tinygrad": "DEV=CPU::x86_64,znver3 (clang -march=znver3 for its kernels)",
}
TOL = 1e-4  # relative, on the losses


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def installed(py, system):
    r = subprocess.run([py, "-c", VERSION_OF[system]], capture_output=True, text=True)
    return r.stdout.strip().split("+")[0] if r.returncode == 0 else None  # torch: 2.x.y+cpu


def setup_python(args):
    """The interpreter for the peers and, per system, its version or why it is missing."""
    failed = {}
    if args.python:
        py = args.python
    else:
        venv = os.path.join(args.build, "peers-venv")
        py = os.path.join(venv, "bin", "python")
        if not os.path.exists(py):
            log(f"peers: creating {venv}")
            r = subprocess.run([sys.executable, "-m", "venv", venv])
            if r.returncode != 0:
                sys.exit("peers: python3 -m venv failed (Debian: apt-get install python3-venv)")
        for system, pkgs in PACKAGES.items():
            if installed(py, system) == PINS[system]:
                continue
            log(f"peers: installing {' '.join(pkgs)} into {venv}")
            r = subprocess.run([py, "-m", "pip", "install", "--quiet", f"numpy=={PINS['numpy']}"] + pkgs)
            if r.returncode != 0:
                failed[system] = f"pip install {' '.join(pkgs)} failed (exit {r.returncode})"
                log(f"peers: {failed[system]}")
    versions, missing = {}, {}
    for system in PACKAGES:
        r = subprocess.run([py, "-c", VERSION_OF[system]], capture_output=True, text=True)
        if system in failed:
            missing[system] = failed[system]
        elif r.returncode == 0:
            versions[system] = r.stdout.strip()
        else:
            missing[system] = (r.stderr.strip().splitlines() or ["import failed"])[-1]
    return py, versions, missing


def isa_env(system, isa):
    """The environment that holds system to isa (native: nothing beyond Ember's own switch)."""
    if system == "ember":
        return {"EMBER_CPU_ISA": isa}
    if isa != "avx2":
        return {}
    env = {"OPENBLAS_CORETYPE": "Haswell"}  # numpy's OpenBLAS, and any other loaded
    if system == "torch":
        env.update(ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2", DNNL_MAX_CPU_ISA="AVX2",
                   MKL_ENABLE_INSTRUCTIONS="AVX2", TORCHINDUCTOR_CPP_MARCH="znver3")
    elif system == "tinygrad":
        env["DEV"] = "CPU::x86_64,znver3"
    return env


def spin():
    while True:
        pass


def run_one(cmd, timeout, system, isa, contention):
    """Runs one measurement with 2 threads and every compilation cache cold and private to the
    run (Ember's kernel cache off, a fresh TorchInductor/Triton cache directory, tinygrad's
    CACHELEVEL=0; JAX keeps no persistent cache by default), so first-call times are compile
    times; held to isa, beside `contention` busy processes (forked spin loops, killed after)."""
    t0 = time.time()
    with tempfile.TemporaryDirectory(prefix="peers-cache-") as cache:
        # XLA's CPU thread pools are sized by NPROC (XLA_FLAGS has no thread-count flag: XLA aborts
        # on --intra_op_parallelism_threads, and without the dashes it was ignored)
        xla = "--xla_cpu_multi_thread_eigen=true" + (" --xla_cpu_max_isa=AVX2" if isa == "avx2" else "")
        env = dict(os.environ, OMP_NUM_THREADS="2", MKL_NUM_THREADS="2", NPROC="2", NUM_CPU_THREADS="2",
                   EMBER_CACHE="0", TORCHINDUCTOR_CACHE_DIR=cache, TRITON_CACHE_DIR=os.path.join(cache, "triton"),
                   CACHELEVEL="0", XLA_FLAGS=xla, **isa_env(system, isa))
        spinners = []
        for _ in range(contention):
            pid = os.fork()
            if pid == 0:
                try:
                    spin()
                finally:
                    os._exit(0)
            spinners.append(pid)
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout} s"}
        finally:
            for pid in spinners:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    if r.returncode != 0 or not lines:
        err = r.stderr.strip().splitlines()
        named = [ln for ln in err if re.match(r"^[\w.]*(Error|Exception)\b", ln)]  # the exception, not a note
        return {"error": ((named or err or [f"exit {r.returncode}"])[-1])[:200]}
    out = json.loads(lines[-1])
    out["wall_s"] = time.time() - t0
    return out


def build_cpu_isa(build):
    """The build's -Dcpu_isa (native when the build predates it)."""
    try:
        with open(os.path.join(build, "meson-info", "intro-buildoptions.json")) as f:
            return next((o["value"] for o in json.load(f) if o["name"] == "cpu_isa"), "native")
    except (OSError, ValueError):
        return "native"


def fmt(v, unit=""):
    if v is None:
        return "-"
    if v >= 100:
        return f"{v:.0f}{unit}"
    if v >= 1:
        return f"{v:.2f}{unit}"
    return f"{v:.4f}{unit}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default=",".join(WORKLOADS))
    ap.add_argument("--systems", default="ember,torch,jax,tinygrad")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--python", help="use this interpreter for the peers and install nothing")
    ap.add_argument("--isa", default="native", choices=["native", "avx2", "avx512"],
                    help="hold every system to this CPU ISA (avx2: what an AVX2-only machine runs; for Ember's eager "
                         "C kernels too, give --build a build configured with -Dcpu_isa=avx2)")
    ap.add_argument("--contention", type=int, default=0, help="busy processes (spin loops) beside every timed run")
    ap.add_argument("--seconds", type=float, default=2.0, help="timed seconds per run, at least")
    ap.add_argument("--timeout", type=int, default=1200, help="seconds per run")
    ap.add_argument("--render", action="store_true", help="print the table of BUILD/peers/results.json again; run nothing")
    args = ap.parse_args()
    args.build = os.path.abspath(args.build)
    if args.render:
        out_dir = os.path.join(args.build, "peers")
        with open(os.path.join(out_dir, "results.json")) as f:
            r = json.load(f)
        render(out_dir, r, r["rows"])
        return
    workloads = [w for w in args.only.split(",") if w]
    systems = args.systems.split(",")

    if subprocess.run(["ninja", "-C", args.build, "bench/peers_ember"], capture_output=True).returncode != 0:
        sys.exit(f"peers: building {args.build}/bench/peers_ember failed (run scripts/test.sh or meson setup first)")
    ember = os.path.join(args.build, "bench", "peers_ember")
    py, versions, missing = setup_python(args)
    out_dir = os.path.join(args.build, "peers")
    data = os.path.join(out_dir, "data")
    os.makedirs(out_dir, exist_ok=True)
    subprocess.run([ember, "--init", data], check=True)
    cpu = subprocess.run(["sh", "-c", "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"], capture_output=True,
                         text=True).stdout.strip()
    host512 = "avx512f" in open("/proc/cpuinfo").read()
    held = {}
    if args.isa == "avx2":
        held = {k: v for k, v in HELD_AVX2.items() if k in systems}
        if "ember" in held:
            if build_cpu_isa(args.build) == "avx2":
                held["ember"] += "; eager C kernels built for x86-64-v3 (-Dcpu_isa=avx2)"
            else:
                held["ember"] += "; NOT its eager C kernels (-march=native: pass --build a -Dcpu_isa=avx2 build)"
                log(f"peers: {args.build} is not configured with -Dcpu_isa=avx2: Ember's eager C kernels use AVX-512")
    meta = {"machine": cpu, "cores": os.cpu_count(), "device": args.device, "rounds": args.rounds,
            "versions": versions, "missing": missing, "pins": PINS, "python": py,
            "isa": args.isa if args.isa != "native" else ("native (avx512)" if host512 else "native (avx2)"),
            "held": held, "contention": args.contention, "min_seconds": args.seconds,
            # systems whose libraries choose their ISA from CPUID whatever they are told (see HELD_AVX2)
            "not_held": ["jax"] if args.isa == "avx2" and host512 and "jax" in systems else []}
    log(f"peers: {cpu}, {os.cpu_count()} cores; {versions}; missing: {missing or 'none'}; ISA {meta['isa']}; "
        f"{args.contention} busy processes beside each run")

    configs = [c for c in CONFIGS if c[0] in systems]
    if args.device == "cuda" and "ember" in systems:  # Ember compiled in each of em_compile's modes (issue 19)
        configs += [("ember", "reduce-overhead", "Ember em_compile reduce-overhead"),
                    ("ember", "max-autotune", "Ember em_compile max-autotune")]
    results = {}  # (workload, system, mode) -> list of run outputs
    for rnd in range(args.rounds):
        for w in workloads:
            k = (rnd * 2 + workloads.index(w)) % len(configs)
            order = configs[k:] + configs[:k]  # rotate: every system runs first in some round
            for system, mode, _ in order:
                key = (w, system, mode)
                if system in missing:
                    continue
                timing = ["--steps", str(SLOW.get(key, MIN_STEPS)), "--seconds", str(args.seconds)]
                if system == "ember":
                    cmd = [ember, "--workload", w, "--mode", mode, "--dir", data, "--device", args.device] + timing
                else:
                    cmd = [py, os.path.join(HERE, "peers.py"), "--system", system, "--workload", w, "--mode", mode,
                           "--dir", data, "--device", args.device] + timing
                r = run_one(cmd, args.timeout, system, args.isa, args.contention)
                results.setdefault(key, []).append(r)
                log(f"round {rnd + 1} {w:12s} {system:9s} {mode:13s} " +
                    (f"{r['ms_per_step']:.4g} ms/step ({r['steps']} steps), first {r['first_call_ms']:.4g} ms, "
                     f"to steady state {r['warmup_ms']:.4g} ms" if "error" not in r else "ERROR " + r["error"]))

    # aggregate: medians over rounds
    table = []
    for w in workloads:
        def first_ok(mode):
            return next((r for r in results.get((w, "ember", mode), []) if "error" not in r), None)
        for system, mode, label in configs:
            runs = results.get((w, system, mode), [])
            ok = [r for r in runs if "error" not in r]
            row = {"workload": w, "system": system, "mode": mode, "label": label}
            if system in missing:
                row["error"] = f"not installed: {missing[system]}"
            elif not ok:
                row["error"] = runs[0]["error"] if runs else "not run"
            else:
                for k in ["ms_per_step", "first_call_ms", "warmup_ms"]:
                    row[k] = statistics.median(r[k] for r in ok)
                row["steady_after"] = max(r["steady_after"] for r in ok)
                row["peak_rss_mb"] = max(r["peak_rss_mb"] for r in ok)
                row["runs"] = len(ok)
                row["steps"] = min(r["steps"] for r in ok)
                row["per"] = ok[0].get("per", "step")
                row["loss1"], row["loss2"] = ok[0]["loss1"], ok[0]["loss2"]
                # the compiled add is one add a call, the eager one 100: each against Ember's own
                ref = first_ok("compiled" if w == "add" and mode != "eager" else "eager")
                if ref:
                    d = max(abs(row["loss1"] - ref["loss1"]) / max(1.0, abs(ref["loss1"])),
                            abs(row["loss2"] - ref["loss2"]) / max(1.0, abs(ref["loss2"])))
                    row["loss_check"] = "ok" if d <= TOL else f"MISMATCH ({d:.2g})"
                    row["loss_rel_diff"] = d
            table.append(row)

    render(out_dir, meta, table, results)


def render(out_dir, meta, table, results=None):
    """Prints the table and writes results.md (and results.json when results are given)."""
    versions, missing = meta["versions"], meta["missing"]
    off_pin = {k: v for k, v in versions.items() if k in meta.get("pins", {}) and v.split("+")[0] != meta["pins"][k]}
    md = [f"Machine: {meta['machine']}, {meta['cores']} cores, 2 threads per system; device {meta['device']}; "
          f"ISA {meta.get('isa', 'native')}; {meta.get('contention', 0)} busy processes beside each run; "
          f"{meta['rounds']} rounds, medians of at least {meta.get('min_seconds', 0):g} s of steps. Versions: " +
          ", ".join(f"{k} {v}" for k, v in versions.items()) +
          (("; not installed: " + ", ".join(f"{k} ({v})" for k, v in missing.items())) if missing else "") +
          (("; NOT the pinned versions: " + ", ".join(f"{k} {v} (pinned {meta['pins'][k]})" for k, v in off_pin.items()))
           if off_pin else "") + "."]
    if meta.get("held"):
        md += ["", "Held to AVX2: " + "; ".join(f"{k}: {v}" for k, v in meta["held"].items()) + "."]
    md += ["", "| workload | system | ms per step | first call ms (cold caches) | to steady state ms | peak RSS MB | "
           "time / Ember compiled (add eager: / Ember eager) | losses vs Ember |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    def ember_ms(w, mode):
        return next((r.get("ms_per_step") for r in table if r["workload"] == w and r["system"] == "ember" and r["mode"] == mode), None)

    for row in table:  # the compiled add is one add a call: eager rows of add compare with Ember eager
        ref = ember_ms(row["workload"], "eager" if row["workload"] == "add" and row["mode"] == "eager" else "compiled")
        if "ms_per_step" in row and ref:
            row["vs_ember"] = row["ms_per_step"] / ref
    not_held = meta.get("not_held", [])
    for row in table:
        label = row["label"] + (" (AVX-512: not held)" if row["system"] in not_held else "")
        if "error" in row:
            md.append(f"| {row['workload']} | {label} | {row['error']} | | | | | |")
            continue
        ms = fmt(row["ms_per_step"])
        if row["per"] in ("op", "call"):  # microseconds read better here
            ms = f"{row['ms_per_step'] * 1e3:.2f} µs per {row['per']}"
        md.append(f"| {row['workload']} | {label} | {ms} | {fmt(row['first_call_ms'])} | "
                  f"{fmt(row.get('warmup_ms'))} | {row['peak_rss_mb']:.0f} | {fmt(row.get('vs_ember'))} | "
                  f"{row.get('loss_check', '-')} |")
    # Ember compiled against the fastest peer (any mode) that was held to the ISA
    best = []
    for w in dict.fromkeys(r["workload"] for r in table):
        if w == "add":
            continue
        mine = ember_ms(w, "compiled")
        peers = [r for r in table if r["workload"] == w and r["system"] != "ember" and "ms_per_step" in r
                 and r["system"] not in not_held]
        if mine and peers:
            p = min(peers, key=lambda r: r["ms_per_step"])
            best.append(f"| {w} | {fmt(mine)} | {p['label']} {fmt(p['ms_per_step'])} | {fmt(mine / p['ms_per_step'])} |")
    if best:
        md += ["", "Ember em_compile against the fastest peer" + (" held to the ISA" if not_held else "") +
               " (ms per step; ratio below 1: Ember ahead):", "",
               "| workload | Ember em_compile | best peer | Ember / best |", "| --- | --- | --- | --- |"] + best
    md += ["", "To steady state: the wall time of the first 5 calls less 5 times the median step (compiling, "
           "compiling again at the second SGD step for its momentum buffers, TinyJit's capture), so a "
           "system's cost before it runs at its speed; negative within noise."]
    text = "\n".join(md)
    print(text)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(text + "\n")
    if results is not None:
        with open(os.path.join(out_dir, "results.json"), "w") as f:
            json.dump(dict(meta, rows=table,
                           runs=[{"workload": k[0], "system": k[1], "mode": k[2], "results": v} for k, v in results.items()]),
                      f, indent=1)
    log(f"peers: wrote {out_dir}/results.md" + (" and results.json" if results is not None else ""))


if __name__ == "__main__":
    main()
